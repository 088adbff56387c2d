package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestAutoProbes: under auto, a stall outside every window is decided as
// lite decides it (it ends at the read's end) and one inside a window as
// full does (at the first launch); each gap says which; the summary has
// the time at full.
func TestAutoProbes(t *testing.T) {
	s := newSim()
	s.lite = true
	steps := func(n int) {
		for i := 0; i < n; i++ {
			s.launches(20, 2*ms, 100*us)
			s.copyAsync(ms, 1)
			s.sync()
		}
	}
	stall := func() (start, end int64) {
		start = s.t
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"}, stallNS)
		end = s.t
		s.t += 2 * ms // Python before the first launch
		return start, end
	}
	steps(10)
	liteStart, liteEnd := stall()
	steps(6)
	winOn := s.t
	s.lite = false
	steps(4)
	fullStart, fullEnd := stall()
	steps(4)
	winOff := s.t
	s.lite = true
	steps(6)

	c := &collect{}
	e := newEngine(c, func(cfg *Config) { cfg.Probes = ProbesAuto })
	e.ProbesLive(true, winOn)
	e.ProbesLive(true, winOn+ms) // a repeat changes nothing
	e.ProbesLive(false, winOff)
	sum := feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 2 {
		t.Fatalf("gaps %+v", big)
	}
	lite, full := big[0], big[1]
	if lite.Probes != ProbesLite || !near(lite.Start, liteStart, 50*us) || lite.End != liteEnd || lite.Cause != CauseIORead {
		t.Errorf("lite-period gap %d..%d %s probes %q, want %d..%d io.read lite", lite.Start-t0, lite.End-t0, lite.Cause, lite.Probes, liteStart-t0, liteEnd-t0)
	}
	firstLaunch := fullEnd + 2*ms + 5*us
	if full.Probes != ProbesFull || !near(full.Start, fullStart, 50*us) || !near(full.End, firstLaunch, 10*us) || full.Cause != CauseIORead {
		t.Errorf("window gap %d..%d %s probes %q, want %d..%d io.read full", full.Start-t0, full.End-t0, full.Cause, full.Probes, fullStart-t0, firstLaunch-t0)
	}
	if sum.Probes != ProbesAuto || sum.ProbesFullNS != winOff-winOn {
		t.Errorf("summary probes %q full %d ns, want auto %d", sum.Probes, sum.ProbesFullNS, winOff-winOn)
	}
	if sum.Steps == 0 {
		t.Error("no steps")
	}
}

// TestProbeModesWindowCoverage: a gap is full only when one window covers
// it from its start; windows beyond the cap still count in the time at full.
func TestProbeModesWindowCoverage(t *testing.T) {
	var m probeModes
	m.set(true, 100)
	m.set(false, 200)
	m.set(false, 250) // not open: ignored
	m.set(true, 300)  // open to now
	for _, c := range []struct {
		lo, hi int64
		full   bool
	}{
		{100, 200, true}, {120, 180, true}, {90, 150, false}, {150, 250, false},
		{250, 310, false}, {300, 1 << 40, true}, {50, 60, false},
	} {
		if got := m.fullOver(c.lo, c.hi); got != c.full {
			t.Errorf("fullOver(%d,%d) = %v, want %v", c.lo, c.hi, got, c.full)
		}
	}
	if got := m.fullNS(0, 400); got != 200 {
		t.Errorf("fullNS = %d, want 200", got)
	}
	var many probeModes
	for i := int64(0); i < 2*maxWindows; i++ {
		many.set(true, i*10)
		many.set(false, i*10+5)
	}
	if len(many.wins) != maxWindows || many.fullNS(0, 1<<40) != 2*maxWindows*5 {
		t.Errorf("%d windows kept, %d ns at full; want %d, %d", len(many.wins), many.fullNS(0, 1<<40), maxWindows, 2*maxWindows*5)
	}
}

// TestAutoPureCPUStallAfterWindow: the first steps after a window are lite,
// and a gap no blocking call explains (the feeder computed) is placed with
// the usual lead from a sync's return to the next work lite sees. The
// window measured those leads as lite would have, so the stall in the
// first lite step after it is found.
func TestAutoPureCPUStallAfterWindow(t *testing.T) {
	s := newSim()
	step := func() {
		s.launches(20, 2*ms, 100*us)
		s.copyAsync(ms, 1)
		s.sync()
	}
	for i := 0; i < 10; i++ { // the warm-up window: full
		step()
	}
	off := s.t
	s.lite = true
	step()
	at := s.t
	s.t += 30 * ms // the feeder computes
	resume := s.t
	for i := 0; i < 8; i++ {
		step()
	}
	truth := s.idle(at, resume+5*us)
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	e := newEngine(c, func(cfg *Config) { cfg.Probes = ProbesAuto })
	e.ProbesLive(true, t0-ms)
	e.ProbesLive(false, off)
	sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	checkTotals(t, c, sum)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("gaps %+v", big)
	}
	g := big[0]
	if !near(g.Start, at, 50*us) || !near(g.Duration, truth, 500*us) || g.Cause != CauseCPU || g.Probes != ProbesLite {
		t.Errorf("gap %d..%d (%d) %s probes %q, want %d..+%d cpu lite", g.Start-t0, g.End-t0, g.Duration, g.Cause, g.Probes, at-t0, truth)
	}
}
