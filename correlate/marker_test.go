package correlate_test

import (
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/correlate/record"
	"github.com/gaptrace/gaptrace/event"
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

// Attached between a loop's launches and its optimizer step, the marker's
// probe can report before any launch or sync does (libtorch's probe goes
// in before libcuda's): the first step begins at that marker, not at the
// clock's zero. The recording, cut as an attach at its fifth marker would
// see it, must give no step far longer than the loop's others.
func TestFrameworkMarkerFirstAfterAttach(t *testing.T) {
	h, calls, _ := readRecording(t, filepath.Join("testdata", "recordings", "sim-pyoptim-lite.rec.gz"))
	var cut *event.Event
	n := 0
	for _, c := range calls {
		if c.Ev != nil && c.Ev.Kind == event.KindMarker {
			if n++; n == 5 {
				cut = c.Ev
				break
			}
		}
	}
	if cut == nil {
		t.Fatal("the recording holds fewer than five markers")
	}
	var kept []record.Call
	for _, c := range calls {
		if c.Ev != nil && c.Ev != cut && c.Ev.Start < cut.End {
			continue // the probes were not in yet
		}
		kept = append(kept, c)
	}
	cfg := h.Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	var sink stepSink
	record.Replay(cfg, &sink, kept)
	var durs []int64
	for _, st := range sink.steps {
		if !st.Window {
			durs = append(durs, st.End-st.Start)
		}
	}
	if len(durs) < 100 {
		t.Fatalf("%d steps after the cut, want the loop's", len(durs))
	}
	med := slices.Clone(durs)
	slices.Sort(med)
	if first := durs[0]; first > 3*med[len(med)/2] {
		t.Errorf("first step lasts %d ns, the median %d: it began before the probes were in", first, med[len(med)/2])
	}
}
