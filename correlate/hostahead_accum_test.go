package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// hostAheadAccumLoop simulates a loop shaped like Hugging Face's Trainer
// on one thread: an optimizer step is micro micro-batches, each an async
// copy of its batch and a forward and a backward; then the optimizer's 4
// kernels, with no sync: the host runs ahead of the device. The loss is
// read every logEvery-th step; every evalEvery-th step an evaluation
// copies 15 batches the way the training does (same size, same stream),
// each with one kernel and a metric read. Launches are flushed only at
// the syncs, so a step's launches are seen by position (Event.Pending on
// the copies). It returns the steps' ends.
func hostAheadAccumLoop(s *gpuSim, steps, micro, logEvery, evalEvery int) []int64 {
	var ends []int64
	for n := 1; n <= steps; n++ {
		for k := 0; k < micro; k++ {
			s.copyAsync(20*us, 2)
			s.launches(2, 150*us, 10*us) // forward, backward
		}
		s.launches(4, 60*us, 10*us) // clip and the optimizer
		if n%logEvery == 0 {
			s.sync()
			if s.lite {
				s.evs[len(s.evs)-1].Count = 0
			}
		}
		ends = append(ends, s.t)
		if evalEvery > 0 && n%evalEvery == 0 {
			for b := 0; b < 15; b++ {
				s.copyAsync(20*us, 2)
				s.launches(1, 100*us, 10*us)
				s.sync()
				if s.lite {
					s.evs[len(s.evs)-1].Count = 0
				}
			}
		}
		s.t += 50 * us
	}
	return ends
}

// TestHostAheadAccumulationSteps: gradient accumulation with no sync in
// an optimizer step (the loss read every 5th step, an evaluation of 15
// batches every 40th) is counted per optimizer step where launches are
// seen: no sync marks the group, and the step that launches the
// optimizer's kernels does (launchSlot). The evaluation's batches copy as
// the training's do; each is read back, so they count no micro-batch.
// Before, full counted the micro-batches until the first loss read, then
// lost the clock to the syncs (1.3 steps an optimizer step on
// hf_trainer), and auto took the evaluation's read for the step site.
// Lite, blind to launches, is not held to it (accum.go).
func TestHostAheadAccumulationSteps(t *testing.T) {
	for _, c := range []struct {
		name   string
		probes string
	}{
		{"full", ProbesFull},
		{"auto", ProbesAuto},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			const steps = 200
			ends := hostAheadAccumLoop(s, steps, 8, 5, 40)
			n, windows := simSteps(s, c.probes, ends[steps/4])
			t.Logf("%d steps (%d fixed windows) for %d optimizer steps", n, windows, steps)
			if d := n - steps; d*50 > steps || -d*50 > steps || windows > 0 {
				t.Errorf("%d steps (%d fixed windows) for %d optimizer steps, want within 2%%", n, windows, steps)
			}
		})
	}
}

// TestLaunchSlot: the group's place is the step that launches clearly
// more than nearly every other, the others alike; a loop whose
// micro-batches' counts stray as much as the optimizer adds (a backward
// thread's lag, as on the H200: 253–287 against 300), or whose data picks
// its launches, groups nothing by launches alone; a sync in most steps
// at another place refutes it.
func TestLaunchSlot(t *testing.T) {
	segs := func(pattern []uint64, groups int, syncAt int) []fineSeg {
		var out []fineSeg
		for g := 0; g < groups; g++ {
			for i, x := range pattern {
				sg := fineSeg{exact: x, seen: true}
				if i == syncAt {
					sg.syncs = 1
				}
				out = append(out, sg)
			}
		}
		return out
	}
	hf := []uint64{2, 2, 2, 2, 2, 2, 2, 6}
	if r, ok := launchSlot(segs(hf, 8, -1), 8); !ok || r != 7 {
		t.Errorf("micro-batches of 2 launches and an optimizer step of 6: slot %d %v, want 7", r, ok)
	}
	if _, ok := launchSlot(segs(hf, 8, -1), 4); ok {
		t.Error("grouped by 4: half the groups hold the optimizer, want none")
	}
	if r, ok := launchSlot(segs(hf, 8, 7), 8); !ok || r != 7 {
		t.Errorf("the loss read in the optimizer's step: slot %d %v, want 7", r, ok)
	}
	if _, ok := launchSlot(segs(hf, 8, 3), 8); ok {
		t.Error("a sync in every group's fourth step: grouped, want none")
	}
	if _, ok := launchSlot(segs(hf, 3, -1), 8); ok {
		t.Error("three groups: grouped, want none before groupMin")
	}
	lagged := []uint64{287, 300, 253, 282}
	for g := 2; g <= 4; g++ {
		if r, ok := launchSlot(segs(lagged, 10, 1), g); ok {
			t.Errorf("micro-batches straying by the optimizer's launches, g=%d: slot %d", g, r)
		}
	}
	// Launches the data picks: 20–40 an iteration.
	var varied []fineSeg
	x := uint64(7)
	for i := 0; i < 128; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		varied = append(varied, fineSeg{exact: 20 + (x>>33)%21, seen: true})
	}
	for g := 2; g <= 16; g++ {
		if r, ok := launchSlot(varied, g); ok {
			t.Errorf("launches the data picks, g=%d: slot %d", g, r)
		}
	}
	// Attached just before an evaluation: a group and a half of
	// training, 7 evaluation steps that each read back, then the
	// training again, its group shifted by the odd insertion: the
	// optimizer's step at 22, 30, ... (slot 6), where before the
	// insertion it was at 7. Only the groups after it tell the place.
	eval := segs(hf, 1, -1)
	eval = append(eval, segs(hf[:5], 1, -1)...)
	for range 7 {
		eval = append(eval, fineSeg{exact: 5, syncs: 1, seen: true})
	}
	eval = append(eval, segs(hf[5:], 1, -1)...)
	if _, ok := launchSlot(append(eval, segs(hf, 3, -1)...), 8); ok {
		t.Error("three whole groups after an evaluation's synced steps: grouped, want none yet")
	}
	if r, ok := launchSlot(append(eval, segs(hf, 5, -1)...), 8); !ok || r != 6 {
		t.Errorf("five groups after an evaluation's synced steps: slot %d %v, want 6", r, ok)
	}
}

// simSteps runs the simulated job's events through an engine under probes
// and counts the steps and fixed windows it found. Under auto the
// per-launch probes are live until liteFrom: after it no launch is seen,
// syncs flush no count and copies report none pending.
func simSteps(s *gpuSim, probes string, liteFrom int64) (n, windows int) {
	col := &collect{}
	e := newEngine(col, func(cfg *Config) { cfg.Probes = probes })
	evs := s.evs
	if probes == ProbesAuto {
		e.ProbesLive(true, t0)
		e.ProbesLive(false, liteFrom)
		evs = nil
		for _, ev := range s.evs {
			if ev.Start > liteFrom && ev.Kind == event.KindEnqueue {
				continue
			}
			if ev.Start > liteFrom {
				if ev.Kind == event.KindSync {
					ev.Count = 0
				}
				ev.Pending = 0
			}
			evs = append(evs, ev)
		}
	}
	feed(e, col, evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
	for _, st := range col.steps {
		if st.Window {
			windows++
		} else {
			n++
		}
	}
	return n, windows
}
