package correlate

import (
	"github.com/gaptrace/gaptrace/event"
)

// ReplayScenario is a simulated run whose recorded calls and golden output
// the replay tier keeps (replay_test.go, an external test: it replays
// through correlate/record).
type ReplayScenario struct {
	Name string
	Lite bool
	Gen  func() ([]event.Event, []event.GPUWindow, int64)
}

// ReplayScenarios mix every mechanism the engine has: all host causes,
// loader workers, two feeder threads, side streams, CPU-ahead read loops,
// comm stalls confirmed and rejected by GPM, lite probes, fixed windows.
func ReplayScenarios() []ReplayScenario {
	return []ReplayScenario{
		{"mixed-full", false, func() ([]event.Event, []event.GPUWindow, int64) {
			s := mixedTrainer(false)
			return s.evs, mixedWindows(s), s.t + 2e9
		}},
		{"mixed-lite", true, func() ([]event.Event, []event.GPUWindow, int64) {
			s := mixedTrainer(true)
			return s.evs, mixedWindows(s), s.t + 2e9
		}},
		{"irregular-windows", false, func() ([]event.Event, []event.GPUWindow, int64) {
			s := newSim()
			// Syncs with no repeating signature: fixed windows, then a
			// period, then an evaluation phase without syncs.
			for i := 0; i < 40; i++ {
				s.launches(5+(i*7)%13, 1*ms, 80*us)
				if i%3 == 0 {
					s.copyAsync(500*us, 9)
				}
				s.sync()
				if i%4 == 1 {
					readStall(s, int64(2+i%5)*ms)
				}
			}
			for i := 0; i < 30; i++ {
				s.step(12, 2*ms, 100*us)
			}
			s.launches(400, 2*ms, 3*ms) // an eval loop: no sync for ~2 s
			for i := 0; i < 20; i++ {
				s.step(12, 2*ms, 100*us)
			}
			return s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t + 3e9
		}},
	}
}

// mixedTrainer is a two-stream trainer with a loader worker, a second
// feeder thread and every stall kind in turn.
func mixedTrainer(lite bool) *gpuSim {
	s := newSim()
	s.lite = lite
	s.evs = append(s.evs, event.Event{Kind: event.KindFork, PID: s.pid, TID: s.pid, Start: s.t, End: s.t, ChildPID: workerPID})
	s.evs = append(s.evs, event.Event{Kind: event.KindCommInit, PID: s.pid, TID: s.pid, Start: s.t, End: s.t,
		Comm: 0xc0ffee, Count: 2, PeerRank: 0})
	s.t += ms
	step := func(late int64, coll bool) {
		for i := 0; i < 8; i++ {
			if i%2 == 0 {
				s.stream = 1
			} else {
				s.stream = 0x5a00
			}
			s.launches(3, 600*us, 90*us)
		}
		s.stream = 1
		s.copyAsync(400*us, 7)
		if coll {
			s.collective(event.NCCLAllReduce, 2*ms+late)
		}
		s.sync()
	}
	cases := stallCases()
	for n := 0; n < 90; n++ {
		late := int64(0)
		if n%11 == 10 {
			late = 25 * ms
		}
		step(late, true)
		switch {
		case n%6 == 5:
			cases[(n/6)%len(cases)].inject(s)
		case n%17 == 8:
			// CPU ahead: the queue still holds a step's work while the
			// feeder reads in a loop.
			s.launches(10, 3*ms, 50*us)
			for i := 0; i < 60; i++ {
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "pread64",
					FDKind: event.FDFile, Path: "/data/shard-1"}, 450*us)
				s.t += 50 * us
			}
		case n%23 == 12:
			// A second feeder reads and launches while the first sleeps.
			at := s.t
			s.tid = 101
			readStall(s, 20*ms)
			s.kernel(2 * ms)
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: at, End: at + 24*ms,
				Syscall: event.SysSleep, Name: "clock_nanosleep"})
			s.tid = 100
			s.t = at + 24*ms
		case n%13 == 3:
			// A futex on a sibling that was reading.
			at := s.t
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 102, Start: at, End: at + 8*ms,
				Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/sib"})
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: 100, WakerTID: 102}, 9*ms)
		}
	}
	return s
}

// mixedWindows are NVML windows and GPM windows whose SM activity drops
// during late collectives (confirming some stalls) but not all of them.
func mixedWindows(s *gpuSim) []event.GPUWindow {
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	k := 0
	gpm := s.windows(t0+30*ms, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 {
		k++
		idle := float64(s.idle(a, b)) / float64(b-a)
		if k%3 == 0 {
			return 0.9 * (1 - idle)
		}
		return 0.45*idle + 0.2
	})
	return append(wins, gpm...)
}
