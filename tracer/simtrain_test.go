package tracer

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// The workload: one stall of every host cause at least twice in 30 steps.
var (
	simArgs = []string{
		"--steps", "30", "--kernels-per-step", "20", "--kernel-us", "50", "--streams", "2",
		"--collectives", "2", "--workers", "2", "--launch-api", "mix",
	}
	stalls = []string{
		"io.read:every=10:ms=15",
		"io.write:every=10:ms=15",
		"net:every=15:ms=15",
		"loader.wait.io:every=10:ms=15",
		"loader.wait.cpu:every=15:ms=15",
		"cuda.memcpy:every=10:ms=10",
		"cuda.alloc:every=15:ms=10",
		"sleep:every=10:ms=10",
		"cpu.contention:every=15:ms=15",
	}
)

func TestSimtrainFull(t *testing.T) { testSimtrain(t, ProbesFull) }
func TestSimtrainLite(t *testing.T) { testSimtrain(t, ProbesLite) }

// TestSimtrainFullSingleUprobes runs the full set through the attach path
// of kernels without uprobe_multi.
func TestSimtrainFullSingleUprobes(t *testing.T) {
	disableUprobeMulti = true
	defer func() { disableUprobeMulti = false }()
	testSimtrain(t, ProbesFull)
}

// canRealtime reports whether this process may create SCHED_FIFO threads
// (simtrain's cpu.contention helper needs it; some containers deny it even
// to root).
// probeWakeupLatency samples, until stop is closed, how late an absolute
// CLOCK_MONOTONIC sleep on the CPUs of set returns for a SCHED_FIFO thread
// of priority 2: above the test's hog (1) and every normal task, so what it
// measures is the delay of the timer and of the wakeup, not a wait for the
// CPU. The returned func waits for the sampler and gives the worst lateness.
func probeWakeupLatency(t *testing.T, set unix.CPUSet, stop <-chan struct{}) func() time.Duration {
	t.Helper()
	var worst time.Duration
	var failed error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread keeps the policy and the affinity: it is never
		// unlocked, so it exits with this goroutine.
		runtime.LockOSThread()
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			failed = fmt.Errorf("pin the wakeup probe: %w", err)
			return
		}
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 1 /* SCHED_FIFO */, Priority: 2}, 0); err != nil {
			failed = fmt.Errorf("make the wakeup probe real-time: %w", err)
			return
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			worst = max(worst, sleepLateness(2*time.Millisecond))
		}
	}()
	return func() time.Duration {
		<-done
		if failed != nil {
			t.Fatal(failed)
		}
		return worst
	}
}

// sleepLateness sleeps until d from now and returns how late it woke.
// Raw system calls: the Go scheduler never takes the thread between the
// wakeup and the clock read (a garbage collection's stop waiting for
// starved threads would be measured as the kernel's lateness).
func sleepLateness(d time.Duration) time.Duration {
	var now unix.Timespec
	syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&now)), 0) //nolint:errcheck // CLOCK_MONOTONIC cannot fail
	target := now.Nano() + int64(d)
	ts := unix.NsecToTimespec(target)
	for {
		_, _, e := syscall.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if e != unix.EINTR {
			break
		}
	}
	syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&now)), 0) //nolint:errcheck // CLOCK_MONOTONIC cannot fail
	return time.Duration(now.Nano() - target)
}

func canRealtime() bool {
	ok := make(chan bool)
	go func() {
		// The thread keeps the policy: it is never unlocked, so it exits
		// with this goroutine instead of returning to the pool.
		runtime.LockOSThread()
		ok <- unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 1 /* SCHED_FIFO */, Priority: 1}, 0) == nil
	}()
	return <-ok
}

func testSimtrain(t *testing.T, set ProbeSet) {
	args := slices.Clone(simArgs)
	realtime := canRealtime()
	if !realtime {
		t.Log("SCHED_FIFO not permitted here: running without the cpu.contention stall")
	}
	for _, st := range stalls {
		if realtime || !strings.HasPrefix(st, "cpu.contention") {
			args = append(args, "--stall", st)
		}
	}
	r := runSimtrain(t, set, args...)
	main := r.meta.PID
	t.Logf("%s: %d events, %d probes attached, stats: drops %d read %d short %v", set, len(r.events), len(r.stats.Attached), r.stats.RingDrops, r.stats.EventsRead, r.stats.ShortSyscalls)

	checkSimtrainCUDA(t, r, set)

	// Async copies: one per step.
	copies := r.kind(event.KindMemcpyAsync, main)
	if len(copies) != r.meta.Steps {
		t.Errorf("%d async copies, want %d", len(copies), r.meta.Steps)
	}
	for _, ev := range copies {
		if ev.Bytes == 0 || ev.Stream != 0 {
			t.Errorf("async copy: bytes %d stream %#x", ev.Bytes, ev.Stream)
			break
		}
	}

	// Synchronous copies, allocations and frees.
	bytesMatch := func(what string) func(event.Event, truthRec) {
		return func(ev event.Event, tr truthRec) {
			if ev.Bytes != tr.Bytes && (what != "free" || ev.Bytes != 0) {
				t.Errorf("%s: bytes %d, truth %d", what, ev.Bytes, tr.Bytes)
			}
		}
	}
	r.matchIntervals(t, "memcpy", r.kind(event.KindMemcpy, main), r.calls("memcpy"), bytesMatch("memcpy"))
	r.matchIntervals(t, "alloc", filterAfter(r.kind(event.KindAlloc, main), r.calls("alloc")), r.calls("alloc"), bytesMatch("alloc"))
	r.matchIntervals(t, "free", r.kind(event.KindFree, main), r.calls("free"), bytesMatch("free"))

	// Collectives: exactly one event per call (weak aliases probed once).
	colls := r.kind(event.KindCollective, main)
	truthColl := r.calls("collective")
	if len(colls) != len(truthColl) {
		t.Errorf("%d collective events, truth %d", len(colls), len(truthColl))
	} else {
		for i, tr := range truthColl {
			ev := colls[i]
			if ev.Op.String() != tr.Op || ev.Count != tr.Count || ev.Bytes != tr.Bytes || ev.Stream != tr.Stream || ev.Comm == 0 {
				t.Errorf("collective %d: op %v count %d bytes %d stream %#x comm %#x; truth %s %d %d %#x", i, ev.Op, ev.Count, ev.Bytes, ev.Stream, ev.Comm, tr.Op, tr.Count, tr.Bytes, tr.Stream)
			}
			if ev.Start < mono(tr.Start)-tolerance || ev.Start > mono(tr.End)+tolerance {
				t.Errorf("collective %d at %d outside truth [%d,%d]", i, ev.Start, mono(tr.Start), mono(tr.End))
			}
		}
	}

	// Stalls: each shows up as the right evidence on the right thread.
	nstalls := 0
	for _, st := range r.truth {
		if st.Type != "stall" {
			continue
		}
		nstalls++
		checkStall(t, r, st)
	}
	if nstalls == 0 {
		t.Fatal("truth has no stalls")
	}

	checkSimtrainProcs(t, r)
	checkStacksFeedersOnly(t, r)
	checkWorkerReadRuns(t, r)
}

// checkWorkerReadRuns: a loader worker's cold read is a run of preads of
// one fd, call after call; each run is one record (bpf/readrun.h) whose
// Count says how many calls it stands for and whose Ret and Bytes sum
// theirs. The main process feeds the GPU: its reads stay one record each.
func checkWorkerReadRuns(t *testing.T, r simRun) {
	t.Helper()
	workers := r.workerPIDs()
	var records, calls, runs uint64
	for _, ev := range r.events {
		if ev.Kind != event.KindSyscall || ev.Syscall != event.SysRead {
			continue
		}
		if !workers[ev.PID] {
			if ev.Count > 1 {
				t.Errorf("pid %d (not a worker): a %s record stands for %d calls", ev.PID, ev.Name, ev.Count)
			}
			continue
		}
		records++
		calls += max(ev.Count, 1)
		if ev.Count > 1 {
			runs++
			if ev.Ret <= 0 || ev.Bytes != uint64(ev.Ret) || ev.End < ev.Start || ev.FD < 0 {
				t.Errorf("worker %d: run of %d %s calls: ret %d, bytes %d, %d..%d, fd %d", ev.PID, ev.Count, ev.Name, ev.Ret, ev.Bytes, ev.Start, ev.End, ev.FD)
			}
		}
	}
	t.Logf("workers' reads: %d records for %d calls (%d runs)", records, calls, runs)
	if runs == 0 || calls < 2*records {
		t.Errorf("workers' reads: %d records for %d calls (%d runs); want runs of several calls each", records, calls, runs)
	}
}

// checkStacksFeedersOnly: the main process feeds the GPU and its long
// syscalls take stacks; the loader workers never call the GPU, their long
// syscalls (cold reads) are emitted without one, and their waits (futex,
// poll, sleep) and run-queue waits not at all (TGID_GPU).
func checkStacksFeedersOnly(t *testing.T, r simRun) {
	t.Helper()
	workers := r.workerPIDs()
	var mainN, mainStacks, workerN int
	for _, ev := range r.events {
		if workers[ev.PID] && (ev.Kind == event.KindRunqueue ||
			ev.Kind == event.KindSyscall && (ev.Syscall == event.SysFutex || ev.Syscall == event.SysPoll || ev.Syscall == event.SysSleep)) {
			t.Errorf("worker %d: %v %s emitted: workers never call the GPU", ev.PID, ev.Kind, ev.Name)
			return
		}
		if ev.Kind != event.KindSyscall {
			continue
		}
		switch {
		case ev.PID == r.meta.PID:
			mainN++
			if len(ev.Stack) > 0 {
				mainStacks++
			}
		case workers[ev.PID]:
			workerN++
			if len(ev.Stack) > 0 {
				t.Errorf("worker %d's %s took a stack: workers never call the GPU", ev.PID, ev.Name)
				return
			}
		}
	}
	if workerN == 0 || mainStacks == 0 {
		t.Errorf("long syscalls: %d of the workers, %d of %d of the main process with a stack; want some of each", workerN, mainStacks, mainN)
	}
}

// checkSimtrainCUDA checks the CUDA side of a simtrain run: syncs against
// the truth, the launch counts (full) or their absence (lite), and which
// entry points were probed.
func checkSimtrainCUDA(t *testing.T, r simRun, set ProbeSet) {
	t.Helper()
	main := r.meta.PID
	// Syncs: exact count, stream, timing; in full mode the launch counts
	// carried by enqueues and syncs add up to the launches made.
	syncs := r.kind(event.KindSync, main)
	r.matchIntervals(t, "sync", syncs, r.calls("sync"), func(ev event.Event, tr truthRec) {
		if ev.Stream != tr.Stream || ev.CUDA != event.CUStreamSynchronize {
			t.Errorf("sync: stream %#x %v, truth %#x %s", ev.Stream, ev.CUDA, tr.Stream, tr.API)
		}
	})
	var launches, truthLaunches uint64
	for _, rec := range r.calls("launch_count") {
		truthLaunches += rec.Count
	}
	enq := r.kind(event.KindEnqueue, main)
	for _, ev := range append(enq, syncs...) {
		launches += ev.Count
	}
	if set == ProbesFull {
		if launches != truthLaunches {
			t.Errorf("launch counts sum to %d, simtrain launched %d", launches, truthLaunches)
		}
		// one burst per step at least (after each sync and each stall)
		if len(enq) < r.meta.Steps {
			t.Errorf("%d enqueue events for %d steps", len(enq), r.meta.Steps)
		}
		// --launch-api mix spreads the launches over every entry point
		// (and _ptsz), so the exact sum above proves each one is probed.
		for _, sym := range []string{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"} {
			if !r.probed(sym, "uprobe") {
				t.Errorf("%s not probed", sym)
			}
		}
	} else {
		if len(enq) != 0 || launches != 0 {
			t.Errorf("lite: %d enqueue events, %d launches counted; want none", len(enq), launches)
		}
		for _, p := range r.attached {
			if strings.HasPrefix(p.Symbol, "cuLaunch") || strings.HasPrefix(p.Symbol, "cuGraphLaunch") {
				t.Errorf("lite: %s probed", p.Symbol)
			}
		}
	}
	for _, sym := range []string{"cuStreamSynchronize", "cuMemcpyHtoD_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "ncclGroupEnd"} {
		if !r.probed(sym, "uretprobe") && !r.probed(sym, "uprobe") {
			t.Errorf("%s not probed", sym)
		}
	}
	// Weak aliases: one probe per NCCL function, under its canonical name.
	if len(r.attached) == 0 {
		t.Error("no probes attached")
	}
	for _, p := range r.attached {
		if strings.HasPrefix(p.Symbol, "pnccl") {
			t.Errorf("alias %s probed besides its canonical name", p.Symbol)
		}
	}
}

// checkSimtrainProcs checks that simtrain's workers were followed from
// fork to exit and that its communicator was seen created once.
func checkSimtrainProcs(t *testing.T, r simRun) {
	t.Helper()
	main := r.meta.PID
	// Descendants: workers and the log server were followed.
	forks := map[uint32]bool{}
	for _, ev := range r.kind(event.KindFork, main) {
		if !ev.IsThread {
			forks[ev.ChildPID] = true
		}
	}
	for _, w := range r.meta.Workers {
		if !forks[uint32(w)] {
			t.Errorf("fork of worker %d not seen", w)
		}
	}
	exits := map[uint32]bool{}
	for _, ev := range r.kind(event.KindExit, 0) {
		exits[ev.PID] = true
	}
	for _, w := range r.meta.Workers {
		if !exits[uint32(w)] {
			t.Errorf("exit of worker %d not seen", w)
		}
	}

	// The communicator: created once (simtrain: rank 0 of 2 by default),
	// the same handle the collectives carry.
	inits := r.kind(event.KindCommInit, 0)
	if len(inits) != 1 || inits[0].Count != 2 || inits[0].PeerRank != 0 || inits[0].Comm == 0 || inits[0].PID != main {
		t.Fatalf("communicator creation: %+v", inits)
	}
	for _, ev := range r.kind(event.KindCollective, 0) {
		if ev.Comm != inits[0].Comm {
			t.Fatalf("collective on comm %#x, created %#x", ev.Comm, inits[0].Comm)
		}
	}
}

// filterAfter drops allocations made before the first truth record
// (simtrain's setup allocates its buffers untimed).
func filterAfter(evs []event.Event, truth []truthRec) []event.Event {
	if len(truth) == 0 {
		return nil
	}
	first := mono(truth[0].Start) - tolerance
	var out []event.Event
	for _, ev := range evs {
		if ev.Start >= first {
			out = append(out, ev)
		}
	}
	return out
}

// within returns the events of tid (any process when pid == 0) overlapping
// [start,end] of a truth record.
func (r simRun) within(st truthRec, pid, tid uint32, pred func(event.Event) bool) []event.Event {
	s, e := mono(st.Start)-tolerance, mono(st.End)+tolerance
	var out []event.Event
	for _, ev := range r.events {
		if (pid != 0 && ev.PID != pid) || (tid != 0 && ev.TID != tid) {
			continue
		}
		if ev.End < s || ev.Start > e {
			continue
		}
		if pred(ev) {
			out = append(out, ev)
		}
	}
	return out
}

func onPath(pred func(event.Event) bool, path string, kind event.FDKind) func(event.Event) bool {
	return func(ev event.Event) bool { return pred(ev) && ev.Path == path && ev.FDKind == kind }
}

func checkStall(t *testing.T, r simRun, st truthRec) {
	t.Helper()
	sys := func(classes ...event.SyscallClass) func(event.Event) bool {
		return func(ev event.Event) bool {
			if ev.Kind != event.KindSyscall {
				return false
			}
			for _, c := range classes {
				if ev.Syscall == c {
					return true
				}
			}
			return false
		}
	}
	fail := func(format string, args ...any) {
		t.Errorf("stall %s step %d [%d..%d] tid %d: %s", st.Cause, st.Step, st.Start, st.End, st.TID, fmt.Sprintf(format, args...))
	}
	switch st.Cause {
	case "io.read":
		if len(r.within(st, 0, st.TID, onPath(sys(event.SysRead), st.Path, event.FDFile))) == 0 {
			fail("no read syscall on %s", st.Path)
		}
	case "io.write":
		if len(r.within(st, 0, st.TID, onPath(sys(event.SysWrite, event.SysFsync), st.Path, event.FDFile))) == 0 {
			for _, ev := range r.within(st, 0, st.TID, func(event.Event) bool { return true }) {
				t.Logf("in window: %v %s fd %d %q kind %d dur %d", ev.Kind, ev.Name, ev.FD, ev.Path, ev.FDKind, ev.Duration())
			}
			fail("no write/fsync syscall on %s", st.Path)
		}
	case "net":
		evs := r.within(st, 0, st.TID, sys(event.SysNet))
		if len(evs) == 0 {
			fail("no socket syscall")
			return
		}
		found := false
		for _, ev := range evs {
			if ev.FDKind == event.FDSocket && ev.PeerPID == st.ServerPID && ev.PeerAddr != "" {
				found = true
			}
		}
		if !found {
			var seen []string
			for _, ev := range evs {
				seen = append(seen, fmt.Sprintf("%s fd %d kind %d path %q peer %d %q", ev.Name, ev.FD, ev.FDKind, ev.Path, ev.PeerPID, ev.PeerAddr))
			}
			fail("no socket event with peer pid %d among %d: %s", st.ServerPID, len(evs), strings.Join(seen, "; "))
		}
	case "loader.wait.io", "loader.wait.cpu", "loader.wait":
		evs := r.within(st, 0, st.TID, sys(event.SysRead))
		found := false
		for _, ev := range evs {
			if ev.FDKind == event.FDPipe && ev.WakerPID == st.Worker {
				found = true
			}
		}
		if !found {
			fail("no pipe read woken by worker %d in %d reads", st.Worker, len(evs))
		}
		if st.Cause == "loader.wait.io" && len(r.within(st, st.Worker, 0, sys(event.SysRead))) == 0 {
			fail("worker %d: no read syscall seen", st.Worker)
		}
	case "cuda.memcpy":
		if len(r.within(st, 0, st.TID, func(ev event.Event) bool { return ev.Kind == event.KindMemcpy })) != 1 {
			fail("no synchronous memcpy")
		}
	case "cuda.alloc":
		if len(r.within(st, 0, st.TID, func(ev event.Event) bool { return ev.Kind == event.KindAlloc })) != 1 {
			fail("no allocation")
		}
	case "sleep":
		evs := r.within(st, 0, st.TID, sys(event.SysSleep))
		if len(evs) != 1 || evs[0].Duration() < (st.End-st.Start)*9/10 {
			fail("sleep events %+v", evs)
		}
	case "cpu.contention":
		var waited int64
		for _, ev := range r.within(st, 0, st.TID, func(ev event.Event) bool { return ev.Kind == event.KindRunqueue }) {
			waited += ev.Duration()
		}
		if waited < (st.End-st.Start)/2 {
			fail("runqueue wait %v of a %v stall", time.Duration(waited), time.Duration(st.End-st.Start))
		}
	default:
		fail("cause not checked by this test")
	}
}

// workerPIDs is the set of the run's loader worker processes.
func (r simRun) workerPIDs() map[uint32]bool {
	workers := map[uint32]bool{}
	for _, w := range r.meta.Workers {
		workers[uint32(w)] = true
	}
	return workers
}
