package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestLitePreemptedFeeder: in lite the launches are invisible, so a feeder
// preempted in the middle of its launch loop shows only as a run-queue
// wait (or time blocked outside any call) between a sync's return and the
// step's copy. Where the queue is
// shallow (a launch-bound loop: 100 µs kernels every 250 µs, syncs that
// find the queue about empty) the GPU idles for the whole wait, and the
// gap is reported there, cpu.contention, bounded by the host and capped
// by the windows; before the step's first launch the host alone bounds it,
// whatever the loop. Where the queue is deep (a GPU-bound loop: 2 ms kernels
// launched 100 µs apart, syncs that wait for most of the step) the same
// wait leaves the GPU busy, and nothing is reported.
func TestLitePreemptedFeeder(t *testing.T) {
	for _, tc := range []struct {
		name       string
		kernels    int
		kdur, cpu  int64
		wantGap    bool
		preemptsAt int // launches before the preemption
		off        event.Kind
		cause      Cause
		source     string
		ranBefore  int64 // host work between the sync's return and the preemption
	}{
		{"launch-bound", 60, 100 * us, 250 * us, true, 30, event.KindRunqueue, CauseCPUContention, "host+gpu", 0},
		// Before the first launch the queue is empty for sure.
		{"launch-bound, preempted at the step's start", 60, 100 * us, 250 * us, true, 0, event.KindRunqueue, CauseCPUContention, "host", 0},
		{"launch-bound, blocked outside any call", 60, 100 * us, 250 * us, true, 40, event.KindOffCPU, CauseOther, "host+gpu", 0},
		{"gpu-bound", 20, 2 * ms, 100 * us, false, 10, event.KindRunqueue, "", "", 0},
		{"gpu-bound, blocked outside any call", 20, 2 * ms, 100 * us, false, 10, event.KindOffCPU, "", "", 0},
		{"gpu-bound, preempted at the step's start", 20, 2 * ms, 100 * us, true, 0, event.KindRunqueue, CauseCPUContention, "host", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, auto := range []bool{false, true} {
				s := newSim()
				// Under auto a full window (launches seen) covers the
				// first steps, where auto learns the loop.
				s.lite = !auto
				step := func(pre func()) {
					for i := 0; i < tc.kernels; i++ {
						if i == tc.preemptsAt && pre != nil {
							pre()
						}
						s.launches(1, tc.kdur, tc.cpu)
					}
					s.copyAsync(20*us, 1)
					s.sync()
				}
				var window int64
				for i := 0; i < 16; i++ {
					if i == 4 {
						window, s.lite = s.t, true
					}
					step(nil)
				}
				var a, b int64
				step(func() {
					// The GPU idles from the sync's return when the
					// feeder had launched nothing.
					a = s.t
					s.t += tc.ranBefore
					s.block(event.Event{Kind: tc.off}, 3*ms)
					b = s.t
				})
				for i := 0; i < 16; i++ {
					step(nil)
				}
				wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
				c := &collect{}
				e := newEngine(c, func(cfg *Config) {
					cfg.Probes = ProbesLite
					if auto {
						cfg.Probes = ProbesAuto
					}
				})
				if auto {
					e.ProbesLive(true, t0)
					e.ProbesLive(false, window)
				}
				sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
				big := bigGaps(c.gaps)
				truth := s.idle(a, b)
				switch {
				case !tc.wantGap:
					if truth > 100*us {
						t.Fatalf("the GPU idled %d during the preemption: not a deep queue", truth)
					}
					if len(big) != 0 {
						t.Errorf("auto=%v: deep queue, preemption reported as idle: %+v", auto, big)
					}
				case len(big) != 1:
					t.Errorf("auto=%v: gaps %+v, want one over %d..%d", auto, big, a-t0, b-t0)
				default:
					g := big[0]
					if !near(g.Start, a, 150*us) || !near(g.End, b, 50*us) || g.Evidence.Source != tc.source {
						t.Errorf("auto=%v: gap %d..%d from %s, want %d..%d (idle %d)", auto, g.Start-t0, g.End-t0, g.Evidence.Source, a-t0, b-t0, truth)
					}
					if g.Cause != tc.cause {
						t.Errorf("auto=%v: cause %s %v", auto, g.Cause, g.Breakdown)
					}
					if g.Duration > truth+50*us {
						t.Errorf("auto=%v: %d reported, the GPU idled %d", auto, g.Duration, truth)
					}
				}
				checkTotals(t, c, sum)
			}
		})
	}
}

// TestLitePreemptedBeforeTheCopy: a GPU-bound loop that does host work
// after its sync, then copies the batch and launches. Lite sees the sync
// and the copy, not the launches, and its usual lead (the host work) may
// hold launches as far as it knows: a feeder preempted halfway through it
// would have queued half the step. The next sync, waiting as long as every
// other, says the queue was empty: the GPU idled from the sync's return.
// Preempted halfway through its launches instead, the feeder's queue
// covers the wait and the next sync waits that much less: nothing is
// reported.
func TestLitePreemptedBeforeTheCopy(t *testing.T) {
	const host, ran, wait = 150 * us, 80 * us, 3 * ms
	for _, midLaunch := range []bool{false, true} {
		s := newSim()
		s.lite = true
		step := func(pre func()) {
			if pre != nil && !midLaunch {
				s.t += ran
				pre()
				s.t += host - ran
			} else {
				s.t += host
			}
			s.copyAsync(20*us, 1)
			for i := 0; i < 20; i++ {
				if i == 10 && pre != nil && midLaunch {
					pre()
				}
				s.launches(1, 2*ms, 100*us)
			}
			s.sync()
		}
		for i := 0; i < 16; i++ {
			step(nil)
		}
		a := s.t // the sync's return
		var b int64
		step(func() {
			if midLaunch {
				a = s.t
			}
			s.block(event.Event{Kind: event.KindRunqueue}, wait)
			b = s.t
		})
		for i := 0; i < 16; i++ {
			step(nil)
		}
		wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
		c := &collect{}
		e := newEngine(c, func(cfg *Config) { cfg.Probes = ProbesLite })
		sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
		big := bigGaps(c.gaps)
		truth := s.idle(a, b)
		switch {
		case midLaunch:
			if truth > 100*us {
				t.Fatalf("the GPU idled %d during the preemption: not a deep queue", truth)
			}
			if len(big) != 0 {
				t.Errorf("preempted mid-launch: reported %+v", big)
			}
		case len(big) != 1:
			t.Errorf("gaps %+v, want one over %d..%d", big, a-t0, b-t0)
		default:
			g := big[0]
			if !near(g.Start, a, 150*us) || !near(g.End, b, 50*us) || g.Cause != CauseCPUContention {
				t.Errorf("gap %d..%d %s, want %d..%d cpu.contention (idle %d)", g.Start-t0, g.End-t0, g.Cause, a-t0, b-t0, truth)
			}
		}
		checkTotals(t, c, sum)
	}
}
