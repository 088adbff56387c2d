package correlate_test

import (
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
)

// replaySteps replays a recording with the step site at (none: "") and
// returns its steps and step clocks.
func replaySteps(t *testing.T, name, at string) ([]correlate.Step, []correlate.StepClock) {
	t.Helper()
	_, calls, cfg := readRecording(t, filepath.Join("testdata", "recordings", name+".rec.gz"))
	cfg.StepAt = at
	var sink stepSink
	sum := record.Replay(cfg, &sink, calls)
	return sink.steps, sum.StepClocks
}

// A declared site ends every step at its calls, whatever else syncs (the
// checkpoint's per-tensor reads): the loop's 300 iterations, each one
// step, and the summary names the site as declared.
func TestDeclaredStepSite(t *testing.T) {
	const rec = "sim-pysteps-ckpt-lite"
	tr := readTruth(t, filepath.Join("testdata", "recordings", rec+".truth.jsonl"))
	for _, at := range []string{"pysteps.py:167", "testdata/simgpu/pysteps.py:167"} {
		steps, clocks := replaySteps(t, rec, at)
		sc := scoreSteps(steps, tr.pid, tr.iters)
		t.Logf("--step-at %s: %s", at, sc)
		if sc.counted != sc.truth || sc.exact < sc.truth*9/10 {
			t.Errorf("--step-at %s: %s, want every iteration one step", at, sc)
		}
		if len(clocks) != 1 || clocks[0].Source != "declared" || clocks[0].Site != "pysteps.py:167 main" {
			t.Errorf("--step-at %s: step clocks %+v, want declared at pysteps.py:167 main", at, clocks)
		}
		for _, st := range steps {
			if !st.Window && st.ClockSource != "declared" {
				t.Fatalf("--step-at %s: step %d ended by %q", at, st.Number, st.ClockSource)
			}
		}
	}
}

// A declared site the job never calls leaves the steps to the other
// sources: the loop is still counted, and the summary says by what.
func TestDeclaredStepSiteNeverCalled(t *testing.T) {
	const rec = "sim-pysteps-ckpt-lite"
	tr := readTruth(t, filepath.Join("testdata", "recordings", rec+".truth.jsonl"))
	steps, clocks := replaySteps(t, rec, "elsewhere.py:12")
	sc := scoreSteps(steps, tr.pid, tr.iters)
	if d := sc.err(); d > stepTolerance || d < -stepTolerance {
		t.Errorf("%s, want within 2%%", sc)
	}
	if len(clocks) != 1 || clocks[0].Source == "declared" {
		t.Errorf("step clocks %+v, want another source than the declared site", clocks)
	}
}

// The found call site names the loop's line on the main thread, not the
// saver thread's reads or the checkpoint's.
func TestFoundStepSite(t *testing.T) {
	for rec, site := range map[string]string{
		"sim-pysteps-graph-stalls-full": "pysteps.py:156 main",
		"sim-pysteps-ckpt-lite":         "pysteps.py:167 main",
	} {
		_, clocks := replaySteps(t, rec, "")
		if len(clocks) != 1 || clocks[0].Source != "call_site" || clocks[0].Site != site {
			t.Errorf("%s: step clocks %+v, want the call site %s", rec, clocks, site)
		}
	}
}
