package correlate

import (
	"slices"
	"sort"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestCommStall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sm      float64
		want    bool
		wantSrc string
	}{
		{"no gpm", -1, true, "host"},
		{"gpm low sm confirms", 0.25, true, "host+gpu"},
		{"gpm high sm rejects", 0.9, false, ""},
		// A GPM window (100 ms) is longer than the wait, so its mean
		// SM activity mixes the wait with the compute around it: a
		// 30 ms wait in a window that otherwise computes reads ~0.65.
		// The stall stands unless the window must have computed during
		// the wait.
		{"gpm window mixes compute around the wait", 0.65, true, "host+gpu"},
		{"gpm window computing through the wait", 0.95, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			commStep := func(late int64) {
				s.launches(20, 2*ms, 100*us)
				s.collective(event.NCCLAllReduce, 3*ms+late)
				s.sync()
			}
			for i := 0; i < 12; i++ {
				commStep(0)
			}
			lateAt := s.t
			commStep(30 * ms)
			lateEnd := s.t
			for i := 0; i < 6; i++ {
				commStep(0)
			}
			var wins []event.GPUWindow
			if tc.sm >= 0 {
				wins = s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 {
					if a < lateEnd && b > lateAt {
						return tc.sm
					}
					return 0.8
				})
			}
			c := &collect{}
			e := newEngine(c, nil)
			sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var stalls []Gap
			for _, g := range c.gaps {
				if g.Kind == GapStall {
					stalls = append(stalls, g)
				}
			}
			if !tc.want {
				if len(stalls) != 0 {
					t.Fatalf("stall reported despite high SM activity: %+v", stalls)
				}
				return
			}
			if len(stalls) != 1 {
				t.Fatalf("stalls = %+v", stalls)
			}
			g := stalls[0]
			if g.Cause != CauseComm || !near(g.Duration, 30*ms, 200*us) || !near(g.End, lateEnd, 10*us) {
				t.Errorf("stall %s %d end %d want end %d", g.Cause, g.Duration, g.End-t0, lateEnd-t0)
			}
			if g.Evidence.Collective == nil || g.Evidence.Collective.Op != "AllReduce" || g.Evidence.Collective.Bytes != 64<<20 {
				t.Errorf("collective %+v", g.Evidence.Collective)
			}
			if g.Evidence.Source != tc.wantSrc {
				t.Errorf("source %q", g.Evidence.Source)
			}
			if tc.sm >= 0 && (g.Evidence.SMActivity == nil || *g.Evidence.SMActivity > tc.sm+0.01) {
				t.Errorf("sm activity %v, want at most the window's %.2f", g.Evidence.SMActivity, tc.sm)
			}
			if sum.GPUStallNS != g.Duration || sum.ByCause[CauseComm] < g.Duration {
				t.Errorf("summary %+v", sum)
			}
			checkTotals(t, c, sum)
		})
	}
}

// TestCommBaselineHostDelay: one step where the host reaches its sync 3 ms
// after its last enqueue waits 3 ms less. That must neither be a stall nor
// lower the baseline so that the ordinary steps after it look 3 ms late;
// a peer 30 ms late later on is one stall of 30 ms.
func TestCommBaselineHostDelay(t *testing.T) {
	s := newSim()
	commStep := func(late, hostDelay int64) {
		s.launches(20, 2*ms, 100*us)
		s.collective(event.NCCLAllReduce, 3*ms+late)
		s.t += hostDelay
		s.sync()
	}
	for i := 0; i < 8; i++ {
		commStep(0, 0)
	}
	commStep(0, 3*ms)
	for i := 0; i < 8; i++ {
		commStep(0, 0)
	}
	commStep(30*ms, 0)
	lateEnd := s.t
	for i := 0; i < 4; i++ {
		commStep(0, 0)
	}
	c := &collect{}
	e := newEngine(c, nil)
	sum := feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 250*ms)
	var stalls []Gap
	for _, g := range c.gaps {
		if g.Kind == GapStall {
			stalls = append(stalls, g)
		}
	}
	if len(stalls) != 1 || !near(stalls[0].Duration, 30*ms, 200*us) || !near(stalls[0].End, lateEnd, 10*us) {
		for _, g := range stalls {
			t.Logf("stall %d..%d (%d)", g.Start-t0, g.End-t0, g.Duration)
		}
		t.Fatalf("%d stalls, want one of 30 ms ending at %d", len(stalls), lateEnd-t0)
	}
	checkTotals(t, c, sum)
}

func TestTwoRanks(t *testing.T) {
	// Two DDP ranks (siblings under a launcher), each on its own device.
	// Rank 1 stalls in a futex woken by rank 0: a sibling rank is not a
	// data-loader worker.
	var evs []event.Event
	var wins []event.GPUWindow
	launcher := uint32(50)
	end := int64(0)
	for r, pid := range []uint32{100, 101} {
		s := newSim()
		s.pid, s.tid = pid, pid
		s.evs = append(s.evs, event.Event{Kind: event.KindFork, PID: launcher, TID: launcher, Start: t0 - ms, End: t0 - ms, ChildPID: pid})
		for i := 0; i < 30; i++ {
			if i == 15 {
				if r == 0 {
					readStall(s, 30*ms)
				} else {
					s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: 100, WakerTID: 100}, 30*ms)
				}
			}
			s.step(20, 2*ms, 100*us)
		}
		evs = append(evs, s.evs...)
		for _, w := range s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil) {
			w.Device = r
			wins = append(wins, w)
		}
		end = max(end, s.t)
	}
	c := &collect{}
	e := newEngine(c, nil)
	e.SetDevice(100, 0)
	e.SetDevice(101, 1)
	sum := feed(e, c, evs, wins, end+2e9, 20*ms, 250*ms)
	big := bigGaps(c.gaps)
	if len(big) != 2 {
		t.Fatalf("gaps %+v", big)
	}
	for _, g := range big {
		switch g.PID {
		case 100:
			if g.Device != 0 || g.Cause != CauseIORead {
				t.Errorf("rank 0 gap %+v", g)
			}
		case 101:
			if g.Device != 1 || g.Cause != CauseOther || g.Evidence.Syscalls["futex"] != 1 {
				t.Errorf("rank 1 gap %+v", g)
			}
		}
		if g.Step != big[0].Step {
			t.Errorf("ranks disagree on the step: %d vs %d", g.Step, big[0].Step)
		}
	}
	per := map[uint32]int{}
	for _, st := range c.steps {
		per[st.PID]++
		if int(st.PID-100) != st.Device {
			t.Errorf("step of pid %d on device %d", st.PID, st.Device)
		}
	}
	if per[100] < 25 || per[101] < 25 {
		t.Errorf("steps per rank %v", per)
	}
	checkTotals(t, c, sum)
}

// A peer late in every step from the very first one leaves no baseline
// to compare waits with: GPM alone shows the wait was spent spinning.
func TestCommStallLateFromFirstStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		sm   float64
		want bool
	}{
		{"gpm low sm", 0.1, true},
		{"gpm high sm is compute", 0.9, false},
		{"no gpm, no verdict", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			s.evs = append(s.evs, event.Event{Kind: event.KindCommInit, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
				Comm: 0xc0ffee, Count: 2, PeerRank: 1})
			var late int64
			for i := 0; i < 20; i++ {
				s.launches(20, 50*us, 100*us)
				s.collective(event.NCCLAllReduce, 3*ms+30*ms)
				s.sync()
				late += 30 * ms
			}
			// NVML sees the spinning collective as busy; GPM sees few SMs.
			wins := s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil)
			if tc.sm >= 0 {
				wins = append(wins, s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 { return tc.sm })...)
			}
			c := &collect{}
			e := newEngine(c, nil)
			feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var comm int64
			n := 0
			for _, g := range c.gaps {
				if g.Kind != GapStall {
					continue
				}
				if g.Cause != CauseComm || g.Evidence.Collective == nil || g.Evidence.SMActivity == nil {
					t.Fatalf("stall without comm evidence: %+v", g)
				}
				if c := g.Evidence.Collective; c.Ranks != 2 || c.Rank == nil || *c.Rank != 1 || !slices.Equal(c.WaitingOn, []int32{0}) {
					t.Errorf("communicator evidence: ranks %d rank %v waiting on %v, want 2, 1, [0]", c.Ranks, c.Rank, c.WaitingOn)
				}
				if len(g.Ops) != 1 || g.Duration > g.Ops[0].End-g.Ops[0].Start {
					t.Errorf("stall of %d ns is longer than the sync's wait %+v", g.Duration, g.Ops)
				}
				comm += g.Duration
				n++
			}
			if !tc.want {
				if n != 0 {
					t.Fatalf("%d comm stalls reported (%d ns) where GPM does not show spinning", n, comm)
				}
				return
			}
			// The job ends after step 20: the last NVML window is half idle,
			// which hides the last few steps' spinning (busy − compute < half).
			if n < 17 || float64(comm) < 0.8*float64(late) || float64(comm) > 1.1*float64(late) {
				t.Fatalf("%d stalls, %d ns of comm; the peer was late %d ns over 20 steps", n, comm, late)
			}
		})
	}
}

// A sidecar attached to a job whose peer is late in every step: the GPM
// sampler calibrates for its first few hundred ms and only then sends the
// windows of the refreshes it read, all at once; on a loaded host, later
// than the engine's emit delay. The stalls of those first steps wait for
// them on a device whose GPM windows will come (Config.GPMDevices) and are
// found; judged at once without GPM, as on a device that has none, those
// the engine reached before the windows came cannot be.
func TestCommStallWaitsForCalibrationWindows(t *testing.T) {
	const calibrated = 800 * ms // when the sampler sends its first windows
	for _, tc := range []struct {
		name      string
		gpmComing bool
	}{
		{"gpm coming", true},
		{"gpm not announced", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			s.evs = append(s.evs, event.Event{Kind: event.KindCommInit, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
				Comm: 0xc0ffee, Count: 2, PeerRank: 1})
			var early []int64 // the stalls' ends before the first windows came
			for range 30 {
				s.launches(20, 50*us, 100*us)
				s.collective(event.NCCLAllReduce, 3*ms+30*ms)
				s.sync()
				if s.t < t0+calibrated {
					early = append(early, s.t)
				}
			}
			wins := s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil)
			gpm := s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 { return 0.1 })
			c := &collect{}
			e := newEngine(c, func(cfg *Config) {
				if tc.gpmComing {
					cfg.GPMDevices = []int{0}
				}
			})
			evs := append([]event.Event(nil), s.evs...)
			sort.SliceStable(evs, func(i, j int) bool { return evs[i].End < evs[j].End })
			i, j, k := 0, 0, 0
			until := s.t + 2e9
			for now := int64(t0); now <= until; now += 20 * ms {
				c.now = now
				for ; i < len(evs) && evs[i].End <= now; i++ {
					e.Event(evs[i])
				}
				for ; j < len(wins) && wins[j].End+250*ms <= now; j++ {
					e.Window(wins[j])
				}
				for ; k < len(gpm) && (now >= t0+calibrated && gpm[k].End <= now || gpm[k].End+20*ms <= now && gpm[k].End > t0+calibrated); k++ {
					e.Window(gpm[k])
				}
				e.Advance(now)
			}
			e.Close(until)
			found := 0
			for _, g := range c.gaps {
				if g.Kind == GapStall && g.Cause == CauseComm && g.End <= early[len(early)-1] {
					found++
				}
			}
			t.Logf("%d of the %d stalls before the first GPM windows came found", found, len(early))
			if tc.gpmComing && found < len(early)-1 {
				t.Errorf("%d of the %d stalls before the first GPM windows came found, want all but the first", found, len(early))
			}
			// Reached before the windows came: the stalls that ended an
			// emit delay before them, less one step for the tick.
			if reached := (calibrated - DefaultEmitDelay.Nanoseconds()) / (40 * ms); !tc.gpmComing && found > len(early)-int(reached)+1 {
				t.Errorf("%d of %d stalls found, yet the engine reached ~%d of them with no GPM window to judge them by",
					found, len(early), reached)
			}
		})
	}
}
