package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestAutoLearnsFirstOpAfterSync: a loop reads its loss (a sync), then
// spends 1.5 ms of host time fetching the next batch and copies it before
// it launches anything: the GPU idles from the sync's return to the copy.
// Auto's full window sees that no kernel comes before the copy, and its
// lite stretch then ends such a gap at the copy, as full does; lite alone
// cannot know it. A loop that launches a kernel during that time (loud)
// must not have its gaps stretched to the copy.
func TestAutoLearnsFirstOpAfterSync(t *testing.T) {
	for _, loud := range []bool{false, true} {
		name := map[bool]string{false: "copy first", true: "kernel before the copy"}[loud]
		t.Run(name, func(t *testing.T) {
			s := newSim()
			var window int64
			const steps = 60
			for n := 0; n < steps; n++ {
				s.copyAsync(100*us, s.stream)
				s.launches(20, 300*us, 20*us)
				s.sync()
				s.t += 1500 * us // the next batch: host work, no call
				if loud {
					s.kernel(50 * us)
					s.t += 200 * us
				}
				if n == 20 {
					window = s.t
				}
			}
			// After the window, lite: no launch is seen.
			var evs []event.Event
			for _, ev := range s.evs {
				if ev.Start > window && ev.Kind == event.KindEnqueue {
					continue
				}
				if ev.Start > window && ev.Kind == event.KindSync {
					ev.Count = 0
				}
				evs = append(evs, ev)
			}
			c := &collect{}
			e := newEngine(c, func(cfg *Config) { cfg.Probes = ProbesAuto })
			e.ProbesLive(true, t0)
			e.ProbesLive(false, window)
			sum := feed(e, c, evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
			var n int
			var reported, right int64
			for _, g := range bigGaps(c.gaps) {
				if g.Start <= window+10*ms {
					continue
				}
				n++
				reported += g.Duration
				right += g.Duration - s.idle(g.Start, g.End)
			}
			right = reported - right
			switch {
			case !loud && n < steps-20-5:
				t.Errorf("%d gaps after the window, want about one per step (%d)", n, steps-21)
			case loud && n > 0:
				t.Errorf("%d gaps after the window for a loop that launches before its copy: %d ns reported, %d idle", n, reported, right)
			}
			if reported > 0 && float64(right) < 0.98*float64(reported) {
				t.Errorf("of %d ns reported after the window, the GPU idled %d", reported, right)
			}
			checkTotals(t, c, sum)
		})
	}
}
