package correlate

import (
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

func TestWindowsSkipClockJump(t *testing.T) {
	s := newSim()
	for s.t < t0+4_000*ms {
		s.launches(50, 200*us, 300*us)
	}
	before := len(s.evs)
	s.t += int64(30 * 24 * time.Hour) // the wall clock jumps a month
	s.launches(50, 200*us, 300*us)
	c := &collect{}
	e := newEngine(c, nil)
	for _, ev := range s.evs[:before] {
		e.Event(ev)
	}
	e.Advance(t0 + 5_000*ms)
	for _, ev := range s.evs[before:] {
		e.Event(ev)
	}
	e.Advance(s.t + 2e9)
	e.Close(s.t + 2e9)
	if len(c.steps) > 20 {
		t.Fatalf("%d windows emitted", len(c.steps))
	}
	for i := 1; i < len(c.steps); i++ {
		if c.steps[i].Number != c.steps[i-1].Number+1 {
			t.Errorf("numbering %d after %d", c.steps[i].Number, c.steps[i-1].Number)
		}
	}
}

// setupThenLoop simulates a model's setup (.to(device): per layer, each
// parameter copied from pageable memory and synced, the same sizes layer
// after layer) followed, after a pause, by a training loop of iters
// iterations: a batch copy, kernels, a sync. It returns the loop's
// iteration ends and when the setup ended.
func setupThenLoop(s *gpuSim, layers, iters int, batchCopy bool, compile int64) (ends []int64, setupEnd int64) {
	param := func(bytes uint64, staged bool) {
		s.t += 5 * us
		dur := int64(bytes)/(8<<10)*us/4 + 2*us // ~30 GB/s
		start := s.t
		ev := event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: start, End: start,
			CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: bytes, CopyDir: event.CUMemcpyHtoD}
		s.evs = append(s.evs, ev)
		s.addBusy(max(start, s.gpuFree), max(start, s.gpuFree)+dur)
		s.gpuFree = max(start, s.gpuFree) + dur
		if staged {
			ev.Kind, ev.End = event.KindMemcpyStaged, s.gpuFree
			s.evs = append(s.evs, ev)
			s.t = s.gpuFree
		}
		s.sync()
		s.t += 30 * us // Python between parameters
	}
	for l := 0; l < layers; l++ {
		param(2<<20, true)
		param(1<<20, false)
		param(2048, false)
		param(3<<20, true)
		param(6<<10, false)
		param(4<<20, true)
		param(8<<10, false)
		param(4<<20, true)
		for i := 0; i < 5; i++ {
			param(2048, false)
		}
	}
	setupEnd = s.t
	s.t += compile // compiling, starting the data loader
	for n := 0; n < iters; n++ {
		if batchCopy {
			s.copyAsync(100*us, s.stream)
		}
		s.launches(30, 300*us, 20*us)
		s.sync()
		ends = append(ends, s.t)
		s.t += 500 * us // the next batch
	}
	return ends, setupEnd
}

// TestSetupIsNotSteps: a model's setup copies its parameters one by one,
// each with a sync, in a pattern that repeats layer after layer; no kernel
// runs. Those repeats are not iterations of the training loop: no step may
// end before the loop starts, and the loop's iterations are its steps.
// Full sees that no kernel ran; auto sees it inside its warm-up window,
// which covers the setup and closes before the loop (a window that ended
// on setup "steps"); lite, blind to launches, learns it from GPM, which
// read no SM activity on the whole device meanwhile (on the H200 a 10 ms
// setup of 51 copy-and-sync pairs made 51 lite steps before).
func TestSetupIsNotSteps(t *testing.T) {
	type variant struct {
		name    string
		copy    bool
		probe   string
		compile int64
	}
	var vs []variant
	for _, probe := range []string{ProbesFull, ProbesAuto, ProbesLite} {
		// A compile of 2 s runs the warm-up out into fixed windows, one
		// of 100 ms does not; without a batch copy the sync period
		// counts the loop.
		vs = append(vs, variant{probe, true, probe, 2000 * ms}, variant{probe + "-syncs", false, probe, 2000 * ms},
			variant{probe + "-short", true, probe, 100 * ms}, variant{probe + "-syncs-short", false, probe, 100 * ms})
	}
	for _, v := range vs {
		probes := v.probe
		t.Run(v.name, func(t *testing.T) {
			s := newSim()
			s.lite = probes == ProbesLite
			ends, setupEnd := setupThenLoop(s, 3, 60, v.copy, v.compile)
			c := &collect{}
			e := newEngine(c, func(cfg *Config) { cfg.Probes = probes })
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			if probes == ProbesLite {
				for i := range s.evs {
					if s.evs[i].Kind == event.KindSync {
						s.evs[i].Count = 0
					}
				}
				// GPM: SM activity is kernels only, and kernels run only
				// in the loop (the setup's copies keep the copy engines
				// busy, not the SMs).
				loop := setupEnd + v.compile/2
				wins = append(wins, s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 {
					if b <= loop {
						return 0
					}
					a = max(a, loop)
					return float64(interval.Overlap(s.busy, a, b)) / float64(100*ms)
				})...)
			}
			if probes == ProbesAuto {
				e.ProbesLive(true, t0)
				e.ProbesLive(false, setupEnd+100*ms)
				// Lite from there on: no launches seen.
				var evs []event.Event
				for _, ev := range s.evs {
					if ev.Start > setupEnd+100*ms && ev.Kind == event.KindEnqueue {
						continue
					}
					if ev.Start > setupEnd+100*ms && ev.Kind == event.KindSync {
						ev.Count = 0
					}
					evs = append(evs, ev)
				}
				s.evs = evs
			}
			feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			loopStart := ends[0] - 10*ms
			early, inLoop, windows := 0, 0, 0
			for _, st := range c.steps {
				switch {
				case st.End <= loopStart:
					if !st.Window {
						early++
					}
				case st.End > loopStart && st.End <= ends[len(ends)-1]:
					if st.Window {
						windows++
					} else {
						inLoop++
					}
				}
			}
			// Before the loop: fixed windows (no period yet), no steps.
			if early > 0 {
				t.Errorf("%d steps end before the loop starts (the setup's parameter copies), want none", early)
			}
			// The loop's first iteration is a step like the others.
			if inLoop != len(ends) || windows > 0 {
				t.Errorf("%d steps and %d fixed windows in the loop of %d iterations", inLoop, windows, len(ends))
			}
		})
	}
}
