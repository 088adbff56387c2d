package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// trailingRun traces 40 steps of a batch copy, 40 kernels of 300 µs and a
// sync, each
// followed by two 20 µs kernels (GradScaler's update after its found_inf
// read); before every 4th step from the 8th (after the few steps the
// engine learns the loop from) the host computes for 20 ms without a call.
// It returns the gaps of at least 1 ms, where each stall was and how much
// of it the GPU idled.
func trailingRun(t *testing.T, lite bool, trailing int) ([]Gap, [][2]int64, []int64, Summary, *collect) {
	t.Helper()
	s := newSim()
	s.lite = lite
	var stalls [][2]int64
	var idle []int64
	for n := 1; n <= 40; n++ {
		if n%4 == 0 && n > 4 {
			a := s.t
			s.t += 20 * ms
			stalls = append(stalls, [2]int64{a, s.t})
			idle = append(idle, s.idle(a, s.t))
		}
		s.copyAsync(20*us, s.stream)
		s.launches(40, 300*us, 10*us)
		s.sync()
		s.launches(trailing, 20*us, 10*us)
		s.t += 200 * us
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	sum := feed(newEngine(c, func(cfg *Config) {
		if lite {
			cfg.Probes = ProbesLite
		}
	}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	return bigGaps(c.gaps), stalls, idle, sum, c
}

// TestTrailingLaunchesThenHostWork: the kernels launched after a step's
// last sync end the gap that sync opened, and no sync follows the host's
// 20 ms of computing: full probes see the thread's last launch on its next
// call and open the gap when those kernels are done (without it the stall
// was a micro-gap of the windows only).
func TestTrailingLaunchesThenHostWork(t *testing.T) {
	gaps, stalls, idle, sum, c := trailingRun(t, false, 2)
	found := 0
	for i, st := range stalls {
		var g *Gap
		for j := range gaps {
			if gaps[j].Start < st[1] && gaps[j].End > st[0] {
				g = &gaps[j]
				break
			}
		}
		if g == nil {
			t.Errorf("stall %d [%d, %d]: no gap", i, st[0]-t0, st[1]-t0)
			continue
		}
		found++
		// The queue drained about 40 µs after the sync (two short
		// kernels): the gap starts within the usual GPU time of two
		// launches (about 0.6 ms here) after the stall begins and ends at
		// the next launch.
		if g.Start < st[0]-100*us || g.Start > st[0]+800*us || !near(g.End, st[1]+5*us, 10*us) {
			t.Errorf("stall %d [%d, %d]: gap [%d, %d]", i, st[0]-t0, st[1]-t0, g.Start-t0, g.End-t0)
		}
		if g.Cause != CauseCPU || g.Evidence.Source != "host" {
			t.Errorf("stall %d: cause %s source %s, want cpu from the host", i, g.Cause, g.Evidence.Source)
		}
		if g.Duration < idle[i]*9/10 {
			t.Errorf("stall %d: gap of %d covers under 0.9 of the %d idle", i, g.Duration, idle[i])
		}
	}
	if found != len(stalls) {
		t.Errorf("%d of %d stalls found", found, len(stalls))
	}
	// Nothing else is a gap: the ordinary steps' idle is the trailing
	// kernels' and the sync's, well under 1 ms.
	if len(gaps) != len(stalls) {
		t.Errorf("%d gaps ≥ 1 ms, want %d", len(gaps), len(stalls))
	}
	checkTotals(t, c, sum)
}

// TestTrailingBurstLongerThanAStepSlice: a burst of as many launches as a
// step makes is the CPU running ahead, not a trailing burst: its queued
// work is the windows' to judge, and no host gap opens after its launches.
func TestTrailingBurstLongerThanAStepSlice(t *testing.T) {
	s := newSim()
	for i := 0; i < 12; i++ {
		s.step(8, 2*ms, 20*us)
	}
	// Eight 2 ms kernels right after the sync, then 5 ms of host work: the
	// GPU was busy throughout.
	s.launches(8, 2*ms, 20*us)
	a := s.t
	s.t += 5 * ms
	b := s.t
	s.launches(8, 2*ms, 20*us)
	s.sync()
	for i := 0; i < 8; i++ {
		s.step(8, 2*ms, 20*us)
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	for _, g := range bigGaps(c.gaps) {
		if g.Start < b && g.End > a {
			t.Errorf("gap [%d, %d] over the host work [%d, %d] while the GPU ran the queued kernels",
				g.Start-t0, g.End-t0, a-t0, b-t0)
		}
	}
}

// TestTrailingLaunchesLite: lite sees no launch, so the gap the sync opened
// stays open through the trailing kernels and the stall as before.
func TestTrailingLaunchesLite(t *testing.T) {
	gaps, stalls, _, _, _ := trailingRun(t, true, 2)
	for i, st := range stalls {
		covered := int64(0)
		for _, g := range gaps {
			covered += max(0, min(g.End, st[1])-max(g.Start, st[0]))
		}
		if covered < (st[1]-st[0])*9/10 {
			t.Errorf("stall %d: %d of %d covered", i, covered, st[1]-st[0])
		}
	}
}
