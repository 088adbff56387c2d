package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestCPUAheadWithoutSync(t *testing.T) {
	// The host enqueues 30 ms of work, then blocks 60 ms in write() while
	// the queue drains: ~30 ms idle at the end of the write.
	s := newSim()
	for i := 0; i < 10; i++ {
		s.step(20, 2*ms, 100*us)
	}
	for i := 0; i < 6; i++ {
		s.launches(10, 3*ms, 50*us)
		s.sync()
	}
	s.launches(10, 3*ms, 50*us)
	wAt := s.t
	s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile, Path: "/ckpt/a.pt"}, 60*ms)
	wEnd := s.t
	s.launches(10, 3*ms, 50*us)
	s.sync()
	for i := 0; i < 8; i++ {
		s.step(20, 2*ms, 100*us)
	}
	truth := s.idle(wAt, wEnd+5*us)
	g := onlyHostGPUGap(t, s)
	if !near(g.Duration, truth, truth/10) || !near(g.End, wEnd+5*us, 10*us) || g.Cause != CauseIOWrite {
		t.Errorf("gap %s %d..%d (%d), truth %d ending %d", g.Cause, g.Start-t0, g.End-t0, g.Duration, truth, wEnd-t0)
	}
}

// onlyHostGPUGap feeds s's job (NVML windows) to an engine, checks its
// totals, and returns its one gap that both the host and the GPU showed.
func onlyHostGPUGap(t *testing.T, s *gpuSim) Gap {
	t.Helper()
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	e := newEngine(c, nil)
	sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	checkTotals(t, c, sum)
	var got []Gap
	for _, g := range c.gaps {
		if g.Evidence.Source == "host+gpu" {
			got = append(got, g)
		}
	}
	if len(got) != 1 {
		t.Fatalf("host+gpu gaps = %+v (all %d)", got, len(c.gaps))
	}
	return got[0]
}

// TestCPUAheadReadLoop: after enqueueing 30 ms of work the feeder reads a
// file in 0.45 ms calls for 60 ms. No call reaches MinGap; their blocking
// adds up. The queue drains as long after the last enqueue as in the steps
// before, which places the idle to the host's precision, not a window's.
// What ends it: the next launch, a sync that finds the queue empty, or one
// that takes a few hundred µs on a loaded host although the queue is empty.
func TestCPUAheadReadLoop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		end   func(s *gpuSim)
		endAt int64 // after the reads
	}{
		{"next launch", func(s *gpuSim) {}, 5 * us},
		{"sync finds the queue empty", func(s *gpuSim) { s.sync() }, 0},
		{"slow sync finds the queue empty", func(s *gpuSim) {
			s.sync()
			s.evs[len(s.evs)-1].End += 290 * us
			s.t += 290 * us
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			for i := 0; i < 16; i++ {
				s.launches(10, 3*ms, 50*us)
				s.sync()
			}
			s.launches(10, 3*ms, 50*us)
			rAt := s.t
			for i := 0; i < 120; i++ {
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "pread64", FDKind: event.FDFile, Path: "/data/shard-0"}, 450*us)
				s.t += 50 * us
			}
			rEnd := s.t
			tc.end(s)
			for i := 0; i < 9; i++ {
				s.launches(10, 3*ms, 50*us)
				s.sync()
			}
			truth := s.idle(rAt, rEnd+tc.endAt)
			g := onlyHostGPUGap(t, s)
			if !near(g.Duration, truth, 300*us) || !near(g.End, rEnd+tc.endAt, 10*us) || g.Cause != CauseIORead {
				t.Errorf("gap %s %d..%d (%d), truth %d ending %d", g.Cause, g.Start-t0, g.End-t0, g.Duration, truth, rEnd+tc.endAt-t0)
			}
		})
	}
}

func TestLiteProbes(t *testing.T) {
	s := newSim()
	s.lite = true
	for i := 0; i < 10; i++ {
		s.launches(20, 2*ms, 100*us)
		s.copyAsync(ms, 1)
		s.sync()
	}
	at := s.t
	s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"}, stallNS)
	stallEnd := s.t
	s.t += 2 * ms // Python between the read and the first launch: invisible in lite
	for i := 0; i < 6; i++ {
		s.launches(20, 2*ms, 100*us)
		s.copyAsync(ms, 1)
		s.sync()
	}
	for _, ev := range s.evs {
		if ev.Kind == event.KindEnqueue {
			t.Fatal("lite stream has enqueue events")
		}
	}
	c := &collect{}
	sum := feed(newEngine(c, func(cfg *Config) { cfg.Probes = ProbesLite }), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("gaps %+v", big)
	}
	g := big[0]
	// The documented lite error: the gap ends at the read's end, not at
	// the first launch 2 ms later.
	if !near(g.Start, at, 50*us) || g.End != stallEnd || g.Cause != CauseIORead {
		t.Errorf("gap %d..%d %s, want %d..%d", g.Start-t0, g.End-t0, g.Cause, at-t0, stallEnd-t0)
	}
	if sum.Steps == 0 {
		t.Error("no steps in lite")
	}
}

// TestLitePureCPUStall: in lite, a gap no blocking call explains (the
// feeder computed for 30 ms before launching) was dropped, or ended at a
// preemption inside it. The usual lead from a sync's return to the first
// work the probes see places the resumption; the windows cap the idle.
func TestLitePureCPUStall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		preempt bool
	}{{"computes", false}, {"computes, preempted once", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			s.lite = true
			step := func() {
				s.launches(20, 2*ms, 100*us)
				s.copyAsync(ms, 1)
				s.sync()
			}
			for i := 0; i < 10; i++ {
				step()
			}
			at := s.t
			if tc.preempt {
				s.t += 10 * ms
				s.block(event.Event{Kind: event.KindRunqueue}, 2*ms)
				s.t += 18 * ms
			} else {
				s.t += 30 * ms
			}
			resume := s.t
			for i := 0; i < 8; i++ {
				step()
			}
			truth := s.idle(at, resume+5*us)
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			sum := feed(newEngine(c, func(cfg *Config) { cfg.Probes = ProbesLite }), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			big := bigGaps(c.gaps)
			if len(big) != 1 {
				t.Fatalf("gaps %+v", big)
			}
			g := big[0]
			if !near(g.Start, at, 50*us) || !near(g.Duration, truth, 500*us) || g.Evidence.Source != "host+gpu" {
				t.Errorf("gap %d..%d (%d) from %s, want %d..+%d", g.Start-t0, g.End-t0, g.Duration, g.Evidence.Source, at-t0, truth)
			}
			if g.Cause != CauseCPU {
				t.Errorf("cause %s %v", g.Cause, g.Breakdown)
			}
			checkTotals(t, c, sum)
		})
	}
}
