package correlate_test

import (
	"path/filepath"
	"testing"
)

// A gradient-accumulation loop (pyoptim.py: four micro-batches, each its
// loss read, then Optimizer.step#SGD.step) recorded under lite: its
// optimizer-step markers end the steps, one per optimizer step, where the
// loss read's call site recurs four times as often; the summary names the
// framework and the marker.
func TestFrameworkMarkerSteps(t *testing.T) {
	const rec = "sim-pyoptim-lite"
	tr := readTruth(t, filepath.Join("testdata", "recordings", rec+".truth.jsonl"))
	steps, clocks := replaySteps(t, rec, "")
	sc := scoreSteps(steps, tr.pid, tr.iters)
	t.Logf("%s: %s", rec, sc)
	if d := sc.err(); d > stepTolerance || d < -stepTolerance || sc.exact < sc.truth*9/10 {
		t.Errorf("%s, want one step per optimizer step within 2%%", sc)
	}
	if len(clocks) != 1 || clocks[0].Source != "framework" || clocks[0].Site != "Optimizer.step#SGD.step" {
		t.Errorf("step clocks %+v, want the framework at Optimizer.step#SGD.step", clocks)
	}
	for _, st := range steps {
		if !st.Window && st.ClockSource != "framework" {
			t.Fatalf("step %d ended by %q", st.Number, st.ClockSource)
		}
	}
}

// A declared site wins over the markers: --step-at the micro-batch's loss
// read makes every micro-batch a step, as the user asked.
func TestDeclaredSiteOverFramework(t *testing.T) {
	const rec = "sim-pyoptim-lite"
	tr := readTruth(t, filepath.Join("testdata", "recordings", rec+".truth.jsonl"))
	steps, clocks := replaySteps(t, rec, "pyoptim.py:61")
	sc := scoreSteps(steps, tr.pid, tr.iters)
	if len(clocks) != 1 || clocks[0].Source != "declared" {
		t.Fatalf("step clocks %+v, want declared", clocks)
	}
	if d := sc.counted - 4*sc.truth; d*50 > 4*sc.truth || -d*50 > 4*sc.truth {
		t.Errorf("%s, want four steps per optimizer step (the micro-batches)", sc)
	}
}
