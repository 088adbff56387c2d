package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// hostAheadMarkedLoop is hostAheadAccumLoop as a hand-written loop runs it
// under full probes: each micro-batch copies its input and its target (two
// copies of one size) and launches the functions the tracer marked (the
// forward's, the loss's, the backward's: each launched once a micro-batch,
// rarely enough to be marked), then the update launches a function once an
// optimizer step (no optimizer marker: the parameters are updated by
// hand). The loss is read every logEvery-th step; every evalEvery-th step
// an evaluation copies 15 inputs as the training does (one copy each),
// runs the forward's function and reads a metric. It returns the steps'
// ends.
func hostAheadMarkedLoop(s *gpuSim, steps, micro, logEvery, evalEvery int) []int64 {
	const (
		fnFwd    = 0x1000
		fnLoss   = 0x2000
		fnBwd    = 0x3000
		fnUpdate = 0x4000
	)
	var ends []int64
	for n := 1; n <= steps; n++ {
		for k := 0; k < micro; k++ {
			s.copyAsync(20*us, 2)
			s.copyAsync(20*us, 2)
			s.kernelFn(150*us, fnFwd, true)
			s.launches(4, 20*us, 10*us)
			s.kernelFn(20*us, fnLoss, true)
			s.kernelFn(150*us, fnBwd, true)
			s.launches(4, 20*us, 10*us)
		}
		s.launches(12, 30*us, 10*us) // clipping, the update
		s.kernelFn(30*us, fnUpdate, true)
		if n%logEvery == 0 {
			s.sync()
		}
		ends = append(ends, s.t)
		if evalEvery > 0 && n%evalEvery == 0 {
			for b := 0; b < 15; b++ {
				s.copyAsync(20*us, 2)
				s.kernelFn(100*us, fnFwd, true)
				s.launches(2, 20*us, 10*us)
				s.sync()
			}
		}
		s.t += 50 * us
	}
	return ends
}

// TestHostAheadMarkedAccumulationSteps: where the tracer marks the
// functions a micro-batch launches, a marked function's clock counts
// micro-batches unless launches by position group it (launchSlot) as they
// group the batch copy's; the batch copy, the loop's own data movement,
// keeps the steps through each evaluation (its copies and marked launches
// disqualify the copy clock for a check or two), and the group's place,
// realigned after it, is not moved again before the clock reaches it.
// On an H100 recording of such a loop (h100-hfmanual-full) the marked
// launches took the steps: 5,361 for 1,041 optimizer steps.
func TestHostAheadMarkedAccumulationSteps(t *testing.T) {
	s := newSim()
	const steps = 200
	ends := hostAheadMarkedLoop(s, steps, 8, 5, 40)
	n, windows := simSteps(s, ProbesFull, ends[steps/4])
	t.Logf("%d steps (%d fixed windows) for %d optimizer steps", n, windows, steps)
	if d := n - steps; d*50 > steps || -d*50 > steps || windows > 0 {
		t.Errorf("%d steps (%d fixed windows) for %d optimizer steps, want within 2%%", n, windows, steps)
	}
}

// TestRealignOnce: a launch-learnt grouping whose heavier step moved
// (an evaluation copied batches as the training does) moves its place
// once, though the ring still shows the old place until the clock passes
// the new one; a difference within one step of the finer clock (which of
// a batch's two copies starts a micro-batch: either repeats alike) moves
// nothing.
func TestRealignOnce(t *testing.T) {
	key := stepclock.Key{Kind: event.KindMemcpyAsync, Dir: event.CUDA(1), Bytes: 1 << 20}
	setup := func() *stepper {
		s := &stepper{mode: modeClock}
		s.accum = &accumGroup{key: key, m: 2, g: 8, byLaunch: true}
		// 100 occurrences so far, the latest boundary at the 96th, the
		// ring holding the latest 40: its phase is (96-1-60) mod 16 = 3.
		s.clock = &clockState{key: key, m: 16, phase: 0, occ: 100, all: 100, lastAll: 96}
		for range 40 {
			s.toks = append(s.toks, stepclock.Token{Key: key})
		}
		if p := s.ringPhase(); p != 3 {
			t.Fatalf("ring phase %d, want 3", p)
		}
		return s
	}
	s := setup()
	f := stepclock.Found{Key: key, M: 16, Phase: 5}
	s.realign(f)
	s.realign(f)
	if s.clock.phase != 2 {
		t.Errorf("realigned twice to the ring's phase 5: phase %d, want 2 (moved once)", s.clock.phase)
	}
	s = setup()
	s.realign(stepclock.Found{Key: key, M: 16, Phase: 4})
	if s.clock.phase != 0 {
		t.Errorf("the ring's phase one copy off: phase %d, want 0 (unmoved)", s.clock.phase)
	}
}
