package correlate

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEngine(c *collect, mod func(*Config)) *Engine {
	cfg := Config{Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	return New(cfg, c)
}

const (
	workerPID = 200
	stallNS   = 40 * ms
)

// stallCase injects one stall between a sync's return and the next step's
// first launch, as the simulated trainer does.
type stallCase struct {
	name   string
	cause  Cause
	inject func(s *gpuSim)
	check  func(t *testing.T, g Gap)
}

func stallCases() []stallCase {
	return []stallCase{
		{"io.read", CauseIORead, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "pread64", FDKind: event.FDFile,
				Path: "/data/shard-0007.bin", Ret: 4 << 20}, stallNS)
		}, func(t *testing.T, g Gap) {
			if len(g.Evidence.Files) != 1 || g.Evidence.Files[0].Path != "/data/shard-0007.bin" ||
				g.Evidence.Files[0].Bytes != 4<<20 || g.Evidence.Files[0].Op != "read" {
				t.Errorf("files evidence = %+v", g.Evidence.Files)
			}
			if g.Evidence.Syscalls["pread64"] != 1 {
				t.Errorf("syscalls = %v", g.Evidence.Syscalls)
			}
		}},
		{"io.write", CauseIOWrite, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile,
				Path: "/ckpt/step_1200.pt", Ret: 64 << 20}, stallNS/2)
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFsync, Name: "fsync", FDKind: event.FDFile,
				Path: "/ckpt/step_1200.pt"}, stallNS/2)
		}, func(t *testing.T, g Gap) {
			if len(g.Evidence.Files) != 2 {
				t.Errorf("files evidence = %+v", g.Evidence.Files)
			}
		}},
		{"io.write with a slow truncating open", CauseIOWrite, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysOpen, Name: "openat", FDKind: event.FDFile,
				Path: "/ckpt/last.pt"}, stallNS/4)
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile,
				Path: "/ckpt/last.pt", Ret: 64 << 20}, stallNS/4)
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFsync, Name: "fsync", FDKind: event.FDFile,
				Path: "/ckpt/last.pt"}, stallNS/2)
		}, func(t *testing.T, g Gap) {
			if g.Breakdown[CauseOther] != 0 || g.Breakdown[CauseIOWrite] < stallNS*9/10 {
				t.Errorf("breakdown = %v: the open belongs to the checkpoint write", g.Breakdown)
			}
		}},
		{"io.write: a slow open for writing alone (the writes in a later gap)", CauseIOWrite, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysOpen, Name: "openat", FDKind: event.FDFile,
				Path: "/ckpt/state.pt", OpenFlags: 0x1 | 0x40 | 0x200}, stallNS) // O_WRONLY|O_CREAT|O_TRUNC
		}, func(t *testing.T, g Gap) {
			if g.Breakdown[CauseIOWrite] < stallNS*9/10 || len(g.Evidence.Files) != 1 || g.Evidence.Files[0].Op != "open" {
				t.Errorf("breakdown = %v, files %+v: an open for writing is writing", g.Breakdown, g.Evidence.Files)
			}
		}},
		{"io.read: a slow read-only open alone", CauseIORead, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysOpen, Name: "openat", FDKind: event.FDFile,
				Path: "/data/shard-0009.bin", OpenFlags: 0x80000}, stallNS) // O_RDONLY|O_CLOEXEC
		}, func(t *testing.T, g Gap) {
			if g.Breakdown[CauseIORead] < stallNS*9/10 {
				t.Errorf("breakdown = %v: a read-only open is reading", g.Breakdown)
			}
		}},
		{"io.read after a slow open", CauseIORead, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysOpen, Name: "openat", FDKind: event.FDFile,
				Path: "/data/shard-0008.bin"}, stallNS/2)
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile,
				Path: "/data/shard-0008.bin", Ret: 1 << 20}, stallNS/2)
		}, func(t *testing.T, g Gap) {
			if g.Breakdown[CauseOther] != 0 || g.Breakdown[CauseIORead] < stallNS*9/10 {
				t.Errorf("breakdown = %v: the open belongs to the read", g.Breakdown)
			}
		}},
		{"net", CauseNet, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysNet, Name: "sendto", FDKind: event.FDSocket,
				PeerAddr: "127.0.0.1:8080", PeerPID: 300, Ret: 1200}, stallNS)
		}, func(t *testing.T, g Gap) {
			if len(g.Evidence.Peers) != 1 || g.Evidence.Peers[0].Address != "127.0.0.1:8080" || g.Evidence.Peers[0].PID != 300 {
				t.Errorf("peers = %+v", g.Evidence.Peers)
			}
		}},
		{"loader.wait", CauseLoaderWait, func(s *gpuSim) {
			a := s.t
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDPipe,
				Path: "pipe:[991]", WakerPID: workerPID, WakerTID: workerPID}, stallNS)
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: workerPID, TID: workerPID, Start: a + ms,
				End: a + 35*ms, Syscall: event.SysRead, Name: "pread64", FDKind: event.FDFile, Path: "/data/img-17.jpg"})
		}, func(t *testing.T, g Gap) {
			if len(g.Evidence.Workers) != 1 || g.Evidence.Workers[0].PID != workerPID || g.Evidence.Workers[0].Activity != "io" ||
				len(g.Evidence.Workers[0].Files) != 1 {
				t.Errorf("workers = %+v", g.Evidence.Workers)
			}
		}},
		{"cuda.memcpy", CauseCUDAMemcpy, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindMemcpy, CUDA: event.CUMemcpyHtoD, Bytes: 512 << 20}, stallNS)
		}, func(t *testing.T, g Gap) {
			if g.Evidence.CUDACall != "cuMemcpyHtoD" {
				t.Errorf("cuda call = %q", g.Evidence.CUDACall)
			}
		}},
		{"cuda.alloc", CauseCUDAAlloc, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindAlloc, CUDA: event.CUMemAlloc, Bytes: 1 << 30}, stallNS)
		}, func(t *testing.T, g Gap) {
			if g.Evidence.CUDACall != "cuMemAlloc" {
				t.Errorf("cuda call = %q", g.Evidence.CUDACall)
			}
		}},
		{"cpu", CauseCPU, func(s *gpuSim) { s.t += stallNS }, nil},
		{"cpu.contention", CauseCPUContention, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindRunqueue}, stallNS)
		}, nil},
		{"sleep", CauseSleep, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysSleep, Name: "clock_nanosleep"}, stallNS)
		}, nil},
		{"other", CauseOther, func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysOther, Name: "ioctl", FD: 9}, stallNS)
		}, func(t *testing.T, g Gap) {
			if g.Evidence.Syscalls["ioctl"] != 1 {
				t.Errorf("syscalls = %v", g.Evidence.Syscalls)
			}
		}},
	}
}

// trainer builds warm steps, the injected stall, then more steps.
func trainer(inject func(*gpuSim)) (*gpuSim, int64) {
	s := newSim()
	s.evs = append(s.evs, event.Event{Kind: event.KindFork, PID: s.pid, TID: s.pid, Start: s.t, End: s.t, ChildPID: workerPID})
	s.t += ms
	for i := 0; i < 12; i++ {
		s.step(20, 2*ms, 100*us)
	}
	at := s.t
	inject(s)
	for i := 0; i < 12; i++ {
		s.step(20, 2*ms, 100*us)
	}
	return s, at
}

func TestStallCauses(t *testing.T) {
	for _, tc := range stallCases() {
		t.Run(tc.name, func(t *testing.T) {
			s, at := trainer(tc.inject)
			c := &collect{}
			e := newEngine(c, nil)
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			big := bigGaps(c.gaps)
			if len(big) != 1 {
				t.Fatalf("want 1 gap ≥1ms, got %d: %+v", len(big), big)
			}
			g := big[0]
			if g.Cause != tc.cause {
				t.Errorf("cause = %s, want %s (breakdown %v)", g.Cause, tc.cause, g.Breakdown)
			}
			if g.Kind != GapIdle || g.Evidence.Source != "host" {
				t.Errorf("kind %s source %s", g.Kind, g.Evidence.Source)
			}
			if !near(g.Start, at, 50*us) || !near(g.Duration, stallNS, 100*us) {
				t.Errorf("gap [%d,+%d], want [%d,+%d]", g.Start-t0, g.Duration, at-t0, stallNS)
			}
			var bsum int64
			for _, ns := range g.Breakdown {
				bsum += ns
			}
			if bsum != g.Duration {
				t.Errorf("breakdown sums to %d, duration %d", bsum, g.Duration)
			}
			if g.Breakdown[tc.cause] < stallNS*9/10 {
				t.Errorf("breakdown[%s] = %d", tc.cause, g.Breakdown[tc.cause])
			}
			if tc.check != nil {
				tc.check(t, g)
			}
			if g.Step < 1 {
				t.Errorf("step = %d", g.Step)
			}
			checkTotals(t, c, sum)
		})
	}
}

// checkTotals: the summary is the sum of what was emitted.
func checkTotals(t *testing.T, c *collect, sum Summary) {
	t.Helper()
	var idle, stall, micro int64
	for _, g := range c.gaps {
		if g.Kind == GapStall {
			stall += g.Duration
		} else {
			idle += g.Duration
		}
	}
	byCause := map[Cause]int64{}
	for _, st := range c.steps {
		micro += st.MicroIdleNS
		if st.IdleNS != st.BoundedIdleNS+st.MicroIdleNS {
			t.Errorf("step %d: idle %d != bounded %d + micro %d", st.Number, st.IdleNS, st.BoundedIdleNS, st.MicroIdleNS)
		}
		var sc int64
		for k, v := range st.ByCause {
			sc += v
			byCause[k] += v
		}
		if sc != st.IdleNS+st.StallNS {
			t.Errorf("step %d: by cause %d != idle %d + stall %d", st.Number, sc, st.IdleNS, st.StallNS)
		}
	}
	if sum.GPUIdleNS != idle+micro {
		t.Errorf("summary idle %d != gaps %d + micro %d", sum.GPUIdleNS, idle, micro)
	}
	if sum.GPUStallNS != stall {
		t.Errorf("summary stall %d != %d", sum.GPUStallNS, stall)
	}
	var bc int64
	for k, v := range sum.ByCause {
		bc += v
		if byCause[k] != v {
			t.Errorf("summary by cause %s = %d, steps say %d", k, v, byCause[k])
		}
	}
	if bc != sum.GPUIdleNS+sum.GPUStallNS {
		t.Errorf("summary by cause sums to %d, want %d", bc, sum.GPUIdleNS+sum.GPUStallNS)
	}
	var windows int64
	for i := range c.steps {
		if c.steps[i].Window {
			windows++
		}
	}
	if sum.Gaps != int64(len(c.gaps)) || sum.Steps != int64(len(c.steps))-windows || sum.Windows != windows {
		t.Errorf("summary gaps %d steps %d windows %d, emitted %d gaps, %d steps of which %d windows",
			sum.Gaps, sum.Steps, sum.Windows, len(c.gaps), len(c.steps), windows)
	}
}

func TestTwoCausesInOneGap(t *testing.T) {
	s, _ := trainer(func(s *gpuSim) {
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/a"}, 25*ms)
		s.t += 3 * ms
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile, Path: "/logs/x"}, 12*ms)
	})
	c := &collect{}
	e := newEngine(c, nil)
	feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("gaps: %+v", big)
	}
	g := big[0]
	if g.Cause != CauseIORead || !near(g.Breakdown[CauseIORead], 25*ms, 10*us) || !near(g.Breakdown[CauseIOWrite], 12*ms, 10*us) ||
		!near(g.Breakdown[CauseCPU], 3*ms, 50*us) {
		t.Errorf("cause %s breakdown %v", g.Cause, g.Breakdown)
	}
	if len(g.Ops) != 2 || g.Ops[0].Name != "read" || g.Ops[0].Attrs["file.path"] != "/data/a" {
		t.Errorf("ops %+v", g.Ops)
	}
}

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
			if tc.sm >= 0 && (g.Evidence.SMActivity == nil || *g.Evidence.SMActivity > 0.5) {
				t.Errorf("sm activity %v", g.Evidence.SMActivity)
			}
			if sum.GPUStallNS != g.Duration || sum.ByCause[CauseComm] < g.Duration {
				t.Errorf("summary %+v", sum)
			}
			checkTotals(t, c, sum)
		})
	}
}

// TestCommStallGPMWindowMixesCompute: a GPM window (100 ms) is longer than
// a late-peer wait, so its mean SM activity mixes the wait with the compute
// around it; a 30 ms wait in a window that otherwise computes reads ~0.65.
// The stall stands unless the window must have computed during the wait.
func TestCommStallGPMWindowMixesCompute(t *testing.T) {
	for _, tc := range []struct {
		name string
		sm   float64
		want bool
	}{
		{"compute around the wait", 0.65, true},
		{"computing through the wait", 0.95, false},
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
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 {
				if a < lateEnd && b > lateAt {
					return tc.sm
				}
				return 0.8
			})
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
					t.Fatalf("stall reported although the GPU computed through the wait: %+v", stalls)
				}
				return
			}
			if len(stalls) != 1 {
				t.Fatalf("stalls = %+v", stalls)
			}
			g := stalls[0]
			if g.Cause != CauseComm || !near(g.Duration, 30*ms, 200*us) || !near(g.End, lateEnd, 10*us) ||
				g.Evidence.Source != "host+gpu" || g.Evidence.SMActivity == nil {
				t.Errorf("stall %+v", g)
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

func TestLoaderWorkerActivity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ioNS   int64
		wantAc string
	}{{"io", 30 * ms, "io"}, {"cpu", 2 * ms, "cpu"}} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := trainer(func(s *gpuSim) {
				a := s.t
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysPoll, Name: "poll", WakerPID: workerPID, WakerTID: workerPID + 1}, stallNS)
				s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: workerPID, TID: workerPID + 1, Start: a + 2*ms,
					End: a + 2*ms + tc.ioNS, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/x.tfrecord"})
			})
			c := &collect{}
			e := newEngine(c, nil)
			feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
			big := bigGaps(c.gaps)
			if len(big) != 1 || big[0].Cause != CauseLoaderWait {
				t.Fatalf("gaps %+v", big)
			}
			w := big[0].Evidence.Workers
			if len(w) != 1 || w[0].Activity != tc.wantAc || !near(w[0].IONS, tc.ioNS, 10*us) {
				t.Errorf("workers %+v", w)
			}
		})
	}
}

func TestFutexOnSiblingThread(t *testing.T) {
	// The feeder waits on a futex; the pin-memory thread that wakes it was
	// itself waiting on a worker: one hop makes it loader.wait.
	s, _ := trainer(func(s *gpuSim) {
		a := s.t
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: 100, WakerTID: 101}, stallNS)
		s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: a - ms, End: a + stallNS - 50*us,
			Syscall: event.SysRead, Name: "read", FDKind: event.FDPipe, WakerPID: workerPID, WakerTID: workerPID})
	})
	c := &collect{}
	e := newEngine(c, nil)
	feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 || big[0].Cause != CauseLoaderWait {
		t.Fatalf("gaps %+v", big)
	}
	if big[0].Evidence.Syscalls["futex"] != 1 || big[0].Evidence.Syscalls["read"] != 1 {
		t.Errorf("syscalls %v", big[0].Evidence.Syscalls)
	}
}

func TestNestedSyscallBelongsToCUDACall(t *testing.T) {
	s, _ := trainer(func(s *gpuSim) {
		a := s.t
		s.block(event.Event{Kind: event.KindAlloc, CUDA: event.CUMemAlloc}, stallNS)
		s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: s.tid, Start: a + ms, End: a + 30*ms,
			Syscall: event.SysSleep, Name: "clock_nanosleep"})
	})
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 || big[0].Cause != CauseCUDAAlloc || big[0].Breakdown[CauseSleep] != 0 {
		t.Fatalf("gaps %+v", big)
	}
}

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
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	e := newEngine(c, nil)
	sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	var got []Gap
	for _, g := range c.gaps {
		if g.Evidence.Source == "host+gpu" {
			got = append(got, g)
		}
	}
	if len(got) != 1 {
		t.Fatalf("host+gpu gaps = %+v (all %d)", got, len(c.gaps))
	}
	g := got[0]
	if !near(g.Duration, truth, truth/10) || !near(g.End, wEnd+5*us, 10*us) || g.Cause != CauseIOWrite {
		t.Errorf("gap %s %d..%d (%d), truth %d ending %d", g.Cause, g.Start-t0, g.End-t0, g.Duration, truth, wEnd-t0)
	}
	checkTotals(t, c, sum)
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
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			e := newEngine(c, nil)
			sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var got []Gap
			for _, g := range c.gaps {
				if g.Evidence.Source == "host+gpu" {
					got = append(got, g)
				}
			}
			if len(got) != 1 {
				t.Fatalf("host+gpu gaps = %+v (all %d)", got, len(c.gaps))
			}
			g := got[0]
			if !near(g.Duration, truth, 300*us) || !near(g.End, rEnd+tc.endAt, 10*us) || g.Cause != CauseIORead {
				t.Errorf("gap %s %d..%d (%d), truth %d ending %d", g.Cause, g.Start-t0, g.End-t0, g.Duration, truth, rEnd+tc.endAt-t0)
			}
			checkTotals(t, c, sum)
		})
	}
}

func TestSeveralStreams(t *testing.T) {
	t.Run("side stream work before the main stream's last work is consumed", func(t *testing.T) {
		s, at := trainer(func(s *gpuSim) {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"}, stallNS)
			s.copyAsync(ms, 7) // the batch copy on a side stream opens the next step
		})
		c := &collect{}
		feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
		big := bigGaps(c.gaps)
		if len(big) != 1 || !near(big[0].Start, at, 50*us) || big[0].Cause != CauseIORead {
			t.Fatalf("gaps %+v", big)
		}
	})
	t.Run("side stream still busy after the sync", func(t *testing.T) {
		s := newSim()
		for i := 0; i < 10; i++ {
			s.step(20, 2*ms, 100*us)
		}
		s.launches(5, 2*ms, 100*us)
		s.copyAsync(50*ms, 7) // enqueued after the main stream's last launch: not covered
		s.sync()
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"}, stallNS)
		for i := 0; i < 4; i++ {
			s.step(20, 2*ms, 100*us)
		}
		c := &collect{}
		feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
		if big := bigGaps(c.gaps); len(big) != 0 {
			t.Fatalf("a gap while stream 7 held work: %+v", big)
		}
	})
}

func TestTwoFeederThreads(t *testing.T) {
	s := newSim()
	for i := 0; i < 10; i++ {
		s.step(20, 2*ms, 100*us)
	}
	// Thread 101 reads a shard, then launches the next step; thread 100
	// (which synced) sleeps meanwhile and launches later.
	at := s.t
	s.tid = 101
	s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/b"}, 30*ms)
	s.kernel(2 * ms)
	end := s.t
	s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: at, End: at + 35*ms,
		Syscall: event.SysSleep, Name: "clock_nanosleep"})
	s.tid = 100
	s.t = at + 35*ms
	for i := 0; i < 6; i++ {
		s.step(20, 2*ms, 100*us)
	}
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("gaps %+v", big)
	}
	g := big[0]
	if g.TID != 101 || g.Cause != CauseIORead || !near(g.End, end, 10*us) {
		t.Errorf("gap tid %d cause %s end %d", g.TID, g.Cause, g.End-t0)
	}
	if len(g.Evidence.Threads) != 2 {
		t.Errorf("threads %v", g.Evidence.Threads)
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

func TestOutOfOrderEvents(t *testing.T) {
	base, _ := trainer(stallCases()[0].inject)
	ref := &collect{}
	feed(newEngine(ref, nil), ref, base.evs, nil, base.t+2e9, 20*ms, 0)

	// Deliver events up to 300 ms late, threads interleaved at random.
	r := rand.New(rand.NewSource(1))
	evs := append([]event.Event(nil), base.evs...)
	delay := make([]int64, len(evs))
	for i := range delay {
		delay[i] = r.Int63n(300 * ms)
	}
	type dl struct {
		ev event.Event
		at int64
	}
	var q []dl
	for i, ev := range evs {
		q = append(q, dl{ev, ev.End + delay[i]})
	}
	c := &collect{}
	e := newEngine(c, nil)
	for now := t0; now <= base.t+2e9; now += 20 * ms {
		c.now = now
		k := 0
		for _, d := range q {
			if d.at <= now {
				e.Event(d.ev)
				continue
			}
			q[k] = d
			k++
		}
		q = q[:k]
		e.Advance(now)
	}
	e.Close(base.t + 2e9)
	a, b := bigGaps(ref.gaps), bigGaps(c.gaps)
	if len(a) != len(b) || len(a) != 1 {
		t.Fatalf("in order %d gaps, out of order %d", len(a), len(b))
	}
	ja, _ := json.Marshal(a[0])
	jb, _ := json.Marshal(b[0])
	if !bytes.Equal(ja, jb) {
		t.Errorf("out-of-order result differs:\n%s\n%s", ja, jb)
	}
	if len(ref.steps) != len(c.steps) {
		t.Errorf("steps %d vs %d", len(ref.steps), len(c.steps))
	}
}

func TestEmissionLatency(t *testing.T) {
	// Host-bounded gaps, CPU-ahead gaps (waiting for NVML windows) and
	// comm stalls (waiting for GPM windows), windows 200 ms long arriving
	// 300 ms late, Advance every 100 ms.
	s := newSim()
	r := rand.New(rand.NewSource(7))
	cases := stallCases()
	kinds := map[string]int{}
	for i := 0; i < 300; i++ {
		s.launches(20, 2*ms, 100*us)
		s.collective(event.NCCLAllReduce, 2*ms)
		switch {
		case i > 20 && i%9 == 0:
			s.gpuFree += 25 * ms // a late peer
			s.addBusy(s.gpuFree-25*ms, s.gpuFree)
			kinds["comm"]++
		case i > 20 && i%13 == 0:
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile, Path: "/l"}, 70*ms)
			kinds["ahead"]++
		}
		s.sync()
		if i%5 == 4 {
			cases[r.Intn(len(cases))].inject(s)
			kinds["bounded"]++
		}
	}
	wins := s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil)
	wins = append(wins, s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 { return 0.3 })...)
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+3e9, 100*ms, 300*ms)
	got := map[string]int{}
	for _, g := range bigGaps(c.gaps) {
		switch {
		case g.Kind == GapStall:
			got["comm"]++
		case g.Evidence.Source == "host+gpu":
			got["ahead"]++
		default:
			got["bounded"]++
		}
	}
	for k, n := range kinds {
		if got[k] < n*8/10 {
			t.Errorf("%s: %d of %d found", k, got[k], n)
		}
	}
	var worst int64
	for i, g := range c.gaps {
		if d := c.gapAt[i] - g.End; d > worst {
			worst = d
		}
	}
	if worst > 1e9 {
		t.Errorf("worst emission latency %v > 1s", worst)
	}
	t.Logf("worst emission latency %.0f ms over %d gaps %v (Advance every 100 ms)", float64(worst)/1e6, len(c.gaps), got)
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
	err := Config{Probes: "most", MinGap: -1, EmitDelay: 2e9}.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"probes", "min gap", "emit delay"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestGapsJSONL(t *testing.T) {
	var buf bytes.Buffer
	w := WriteGapsJSONL(&buf)
	g := Gap{PID: 1, TID: 2, Step: 3, Kind: GapIdle, Start: 10, End: 20, Duration: 10, Cause: CauseIORead,
		Breakdown: map[Cause]int64{CauseIORead: 10}, Evidence: Evidence{Source: "host"}}
	w.Gap(g)
	w.Gap(g)
	w.Step(StepResult{})
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 || w.Err() != nil || w.Written() != 2 {
		t.Fatalf("%d lines, err %v", len(lines), w.Err())
	}
	var m map[string]any
	if err := json.Unmarshal(lines[0], &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pid", "tid", "device", "step", "start_unix_nano", "end_unix_nano", "duration_ns", "cause", "breakdown", "evidence"} {
		if _, ok := m[k]; !ok {
			t.Errorf("missing %q in %s", k, lines[0])
		}
	}
	if m["breakdown"].(map[string]any)["io.read"].(float64) != 10 {
		t.Errorf("breakdown %v", m["breakdown"])
	}
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

func TestForgetSilentProcesses(t *testing.T) {
	c := &collect{}
	e := newEngine(c, nil)
	now := t0
	for i := 0; i < 2*sweepProcs; i++ {
		pid := uint32(1000 + i)
		e.Event(event.Event{Kind: event.KindFork, PID: 100, TID: 100, Start: now, End: now, ChildPID: pid})
		e.Event(event.Event{Kind: event.KindSyscall, PID: pid, TID: pid, Start: now, End: now + ms, Syscall: event.SysRead, FDKind: event.FDFile, Path: "/x"})
		now += ms
	}
	e.Advance(now + 2e9)
	if len(e.procs) < 2*sweepProcs {
		t.Fatalf("processes forgotten too early: %d", len(e.procs))
	}
	// One worker stays alive by waking the parent now and then.
	for k := int64(0); k < 12; k++ {
		now += int64(time.Minute)
		e.Event(event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: now, End: now + ms, Syscall: event.SysRead,
			FDKind: event.FDPipe, WakerPID: 1000, WakerTID: 1000})
		e.Advance(now + 2e9)
	}
	if len(e.procs) > 3 || e.procs[1000] == nil || e.procs[100] == nil {
		t.Errorf("%d processes left (worker kept: %v)", len(e.procs), e.procs[1000] != nil)
	}
	if len(e.threads) > 3 {
		t.Errorf("%d threads left", len(e.threads))
	}
}

func TestHWContextPerStepAndStats(t *testing.T) {
	s, _ := trainer(stallCases()[0].inject)
	calls := map[[2]int64]int{}
	c := &collect{}
	e := newEngine(c, func(cfg *Config) {
		cfg.HW = func(dev int, a, b int64) *event.HWContext {
			calls[[2]int64{a, b}]++
			return &event.HWContext{Device: dev, SMClockMHz: 1980, SMActivity: -1}
		}
	})
	feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
	if len(c.steps) < 20 {
		t.Fatalf("%d steps", len(c.steps))
	}
	for _, st := range c.steps {
		if st.HW == nil || st.HW.SMClockMHz != 1980 || calls[[2]int64{st.Start, st.End}] != 1 {
			t.Errorf("step %d hw %+v calls %d", st.Number, st.HW, calls[[2]int64{st.Start, st.End}])
		}
	}
	// An event older than the watermark is late: evidence only.
	e.Event(event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: t0, End: t0 + ms, Syscall: event.SysRead})
	if st := e.Stats(); st.LateEvents != 1 || st.Buffered != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestUnseenWaker(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   event.Event
		want Cause
	}{
		{"pipe from an unseen process is a worker", event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read",
			FDKind: event.FDPipe, WakerPID: 555, WakerTID: 555}, CauseLoaderWait},
		{"futex from an unseen process is not", event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex",
			WakerPID: 555, WakerTID: 555}, CauseOther},
		{"loopback service peer is the network", event.Event{Kind: event.KindSyscall, Syscall: event.SysNet, Name: "recvfrom",
			FDKind: event.FDSocket, Path: "socket:[77]", PeerPID: workerPID, WakerPID: workerPID, WakerTID: workerPID}, CauseNet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := trainer(func(s *gpuSim) { s.block(tc.ev, stallNS) })
			c := &collect{}
			feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
			big := bigGaps(c.gaps)
			if len(big) != 1 || big[0].Cause != tc.want {
				t.Fatalf("gaps %+v", big)
			}
		})
	}
}

func TestReadLoopHolesAreRead(t *testing.T) {
	// 200 µs preads 30 µs apart (loop overhead, calls under the threshold),
	// then 2 ms of real computation: the holes are io.read, the 2 ms cpu.
	s, _ := trainer(func(s *gpuSim) {
		for i := 0; i < 100; i++ {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "pread64", FDKind: event.FDFile, Path: "/d"}, 200*us)
			s.t += 30 * us
		}
		s.t += 2 * ms
	})
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("gaps %+v", big)
	}
	bd := big[0].Breakdown
	if !near(bd[CauseIORead], 100*230*us-30*us, 10*us) || !near(bd[CauseCPU], 2*ms+30*us, 20*us) {
		t.Errorf("breakdown %v", bd)
	}
	if big[0].Evidence.Files[0].Calls != 100 {
		t.Errorf("files %+v", big[0].Evidence.Files)
	}
}

func TestSpanHelpers(t *testing.T) {
	var l []span
	for _, s := range []span{{10, 20}, {30, 40}, {15, 32}, {50, 60}, {45, 46}, {60, 61}} {
		l = addSpan(l, s)
	}
	want := []span{{10, 40}, {45, 46}, {50, 61}}
	if len(l) != len(want) {
		t.Fatalf("addSpan: %v", l)
	}
	for i := range want {
		if l[i] != want[i] {
			t.Fatalf("addSpan: %v", l)
		}
	}
	m := mergeSpans([]span{{0, 5}, {20, 25}}, []span{{3, 8}, {9, 10}, {24, 30}})
	if len(m) != 3 || m[0] != (span{0, 8}) || m[1] != (span{9, 10}) || m[2] != (span{20, 30}) {
		t.Errorf("mergeSpans: %v", m)
	}
	if n := overlapLen(l, 35, 55); n != 5+1+5 {
		t.Errorf("overlapLen = %d", n)
	}
	if c := clip(l, 41, 50); len(c) != 1 || c[0] != (span{45, 46}) {
		t.Errorf("clip = %v", c)
	}
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

// A sync that slept until the GPU was done and then waited for a CPU (a
// loaded host): the GPU idled from the wakeup, and that wait is
// cpu.contention, not time the GPU spent busy.
func TestSyncWokenThenWaitedForCPU(t *testing.T) {
	const late = 20 * ms
	var wake int64
	s, _ := trainer(func(s *gpuSim) {
		s.launches(20, 2*ms, 100*us)
		start := s.t
		wake = s.gpuFree
		run := wake + late
		end := run + 5*us
		s.evs = append(s.evs,
			event.Event{Kind: event.KindRunqueue, PID: s.pid, TID: s.tid, Start: wake, End: run, Woken: true},
			event.Event{Kind: event.KindSync, PID: s.pid, TID: s.tid, Start: start, End: end,
				CUDA: event.CUStreamSynchronize, Stream: s.stream, Count: s.pending[s.tid]})
		s.pending[s.tid] = 0
		s.flushed[s.tid] = false
		s.t = end
	})
	c := &collect{}
	e := newEngine(c, nil)
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("want 1 gap ≥1ms, got %d: %+v", len(big), big)
	}
	g := big[0]
	if !near(g.Start, wake, 50*us) || !near(g.Duration, late, 100*us) {
		t.Errorf("gap [%d,+%d], want [%d,+%d]: it starts at the wakeup", g.Start-t0, g.Duration, wake-t0, late)
	}
	if g.Cause != CauseCPUContention || g.Breakdown[CauseCPUContention] < late*9/10 {
		t.Errorf("cause %s breakdown %v, want cpu.contention", g.Cause, g.Breakdown)
	}
	checkTotals(t, c, sum)

	// The same run-queue wait without Woken (a preemption while spinning in
	// the sync) says nothing about when the GPU finished: no gap.
	for i := range s.evs {
		s.evs[i].Woken = false
	}
	c = &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	if big := bigGaps(c.gaps); len(big) != 0 {
		t.Errorf("a preemption inside a sync opened a gap: %+v", big)
	}
}

// A socket with a timeout (Python's http.client, requests, urllib3) waits in
// poll or select before each non-blocking recv: when the tracer names the
// socket the wait was on, the wait is the network, like a recv on it, with
// its peer. Other readiness waits keep their causes: a pipe to a data-loader
// worker is loader.wait, a unix socket is a local channel, a wait on fds the
// tracer did not resolve is judged by its waker as before.
func TestPollOnSockets(t *testing.T) {
	poll := func(ev event.Event) event.Event {
		ev.Kind, ev.Syscall = event.KindSyscall, event.SysPoll
		if ev.Name == "" {
			ev.Name = "poll"
		}
		return ev
	}
	for _, tc := range []struct {
		name string
		ev   event.Event
		want Cause
		peer PeerEvidence
	}{
		{"loopback service woke it", poll(event.Event{FD: 5, FDKind: event.FDSocket, Path: "socket:[77]", PeerAddr: "127.0.0.1:8080",
			PeerPID: workerPID, WakerPID: workerPID, WakerTID: workerPID}), CauseNet, PeerEvidence{Address: "127.0.0.1:8080", PID: workerPID}},
		{"remote peer", poll(event.Event{Name: "ppoll", FD: 5, FDKind: event.FDSocket, Path: "socket:[78]", PeerAddr: "10.0.0.5:443"}),
			CauseNet, PeerEvidence{Address: "10.0.0.5:443"}},
		{"select on a remote peer", poll(event.Event{Name: "pselect6", FD: 6, FDKind: event.FDSocket, Path: "socket:[79]",
			PeerAddr: "10.0.0.5:443", WakerPID: 555, WakerTID: 555}), CauseNet, PeerEvidence{Address: "10.0.0.5:443"}},
		{"socket closed before it was resolved", poll(event.Event{FD: 5, FDKind: event.FDSocket, WakerPID: workerPID, WakerTID: workerPID}),
			CauseNet, PeerEvidence{}},
		{"unix socket to a worker", poll(event.Event{FD: 5, FDKind: event.FDSocket, Path: "/run/q.sock", WakerPID: workerPID, WakerTID: workerPID}),
			CauseLoaderWait, PeerEvidence{}},
		{"pipe to a worker", poll(event.Event{FD: -1, WakerPID: workerPID, WakerTID: workerPID}), CauseLoaderWait, PeerEvidence{}},
		{"fds of several kinds", poll(event.Event{FD: -1, WakerPID: 555, WakerTID: 555}), CauseOther, PeerEvidence{}},
		{"epoll_wait", poll(event.Event{Name: "epoll_wait", FD: -1, WakerPID: 555, WakerTID: 555}), CauseOther, PeerEvidence{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := trainer(func(s *gpuSim) {
				// The loop of a socket with a timeout: a wait, a recv
				// too short to trace, the wait for the close, a recv.
				s.block(tc.ev, stallNS-300*us)
				s.t += 20 * us
				s.block(tc.ev, 260*us)
				s.t += 20 * us
			})
			c := &collect{}
			feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
			big := bigGaps(c.gaps)
			if len(big) != 1 || big[0].Cause != tc.want {
				t.Fatalf("gaps %+v", big)
			}
			g := big[0]
			if tc.want != CauseNet {
				return
			}
			if share := float64(g.Breakdown[CauseNet]) / float64(g.Duration); share < 0.98 {
				t.Errorf("net %.3f of the gap, want ≥ 0.98 (breakdown %v)", share, g.Breakdown)
			}
			if len(g.Evidence.Peers) != 1 || g.Evidence.Peers[0].Address != tc.peer.Address || g.Evidence.Peers[0].PID != tc.peer.PID ||
				g.Evidence.Peers[0].Calls != 2 {
				t.Errorf("peers %+v, want %+v in 2 calls", g.Evidence.Peers, tc.peer)
			}
		})
	}
}
