package correlate_test

import (
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// resultSink checks, call by call, that each StepResult carries exactly
// the gaps Sink.Gap delivered for it and that a gap no step carries is
// marked Late.
type resultSink struct {
	t       *testing.T
	pending map[gapID]correlate.Gap // delivered, not Late, not yet carried by a step
	steps   int
	carried int
	late    int
}

type gapID struct {
	pid        uint32
	kind       correlate.GapKind
	start, end int64
}

func (r *resultSink) Gap(g correlate.Gap) {
	if g.Late {
		r.late++
		return
	}
	k := gapID{g.PID, g.Kind, g.Start, g.End}
	if _, dup := r.pending[k]; dup {
		r.t.Errorf("gap %+v delivered twice before its step", k)
	}
	r.pending[k] = g
}

func (r *resultSink) Step(s correlate.StepResult) {
	r.steps++
	if len(s.GapList) != s.Gaps {
		r.t.Errorf("pid %d step %d: Gaps %d, GapList holds %d", s.PID, s.Number, s.Gaps, len(s.GapList))
	}
	var idle, stall int64
	for _, g := range s.GapList {
		k := gapID{g.PID, g.Kind, g.Start, g.End}
		if _, ok := r.pending[k]; !ok {
			r.t.Errorf("pid %d step %d carries gap %+v that Sink.Gap did not deliver before it", s.PID, s.Number, k)
		}
		delete(r.pending, k)
		if g.PID != s.PID || g.Step != s.Number || g.Late {
			r.t.Errorf("step %d/%d carries gap of pid %d step %d late %v", s.PID, s.Number, g.PID, g.Step, g.Late)
		}
		if g.Kind == correlate.GapStall {
			stall += g.Duration
		} else {
			idle += g.Duration
		}
		r.carried++
	}
	if idle != s.BoundedIdleNS || stall != s.StallNS {
		r.t.Errorf("pid %d step %d: carried gaps sum to %d idle %d stall, the step says %d and %d",
			s.PID, s.Number, idle, stall, s.BoundedIdleNS, s.StallNS)
	}
}

// TestStepResultCarriesItsGaps replays recordings of one process and of
// ranks linked by their collectives (whose waits may be decided after
// their step) and holds the engine to one join: every gap is carried by
// exactly one step or marked Late, and a step's gaps add up to its totals.
func TestStepResultCarriesItsGaps(t *testing.T) {
	for _, name := range []string{"sim-ddp-sidecar-full", "h200-accum-full", "h100-logevery-lite"} {
		t.Run(name, func(t *testing.T) {
			r := &resultSink{t: t, pending: map[gapID]correlate.Gap{}}
			replayFile(t, filepath.Join("testdata", "recordings", name+".rec.gz"), r)
			if r.steps == 0 || r.carried == 0 {
				t.Fatalf("%d steps carried %d gaps: the recording no longer exercises the join", r.steps, r.carried)
			}
			if len(r.pending) > 0 {
				t.Errorf("%d gaps were delivered without Late and carried by no step", len(r.pending))
			}
			t.Logf("%d steps carried %d gaps, %d late", r.steps, r.carried, r.late)
		})
	}
}
