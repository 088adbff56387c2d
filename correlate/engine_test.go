package correlate

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand"
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
