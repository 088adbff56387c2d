package tracer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// Privileged tests: real probes on the simulated GPU libraries
// (testdata/simgpu), driven by simtrain and checked against its ground truth.

// newTestTracer creates a tracer or skips when the kernel or the privileges
// cannot support one; any other failure is a failure.
func newTestTracer(t testing.TB, cfg Config) *Tracer {
	t.Helper()
	testutil.NeedRoot(t, "loads BPF programs")
	tr, err := New(cfg)
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel lacks a required feature: %v", err)
	}
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return tr
}

// simgpu returns the directory with simtrain and the simulated libraries
// (GAPTRACE_SIMGPU or a build of testdata/simgpu).
var simgpu = testutil.SimGPU

func TestMain(m *testing.M) { testutil.Main(m) }

// truthRec is one line of simtrain's --truth file (CLOCK_MONOTONIC ns).
type truthRec struct {
	Type      string  `json:"type"`
	What      string  `json:"what"`
	API       string  `json:"api"`
	Cause     string  `json:"cause"`
	Step      int     `json:"step"`
	Start     int64   `json:"start"`
	End       int64   `json:"end"`
	TID       uint32  `json:"tid"`
	Stream    uint64  `json:"stream"`
	Bytes     uint64  `json:"bytes"`
	Count     uint64  `json:"count"`
	Op        string  `json:"op"`
	Path      string  `json:"path"`
	Worker    uint32  `json:"worker"`
	ServerPID uint32  `json:"server_pid"`
	PID       uint32  `json:"pid"`
	Workers   []int   `json:"workers"`
	Steps     int     `json:"steps"`
	HelperPID uint32  `json:"helper_pid"`
	PCIe      float64 `json:"pcie_gbps"`
}

func readTruth(t testing.TB, path string) []truthRec {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open truth: %v", err)
	}
	defer f.Close()
	var out []truthRec
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r truthRec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("truth line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

type simRun struct {
	events   []event.Event
	truth    []truthRec
	meta     truthRec
	stats    Stats
	attached []ProbeInfo // right after Trace
	shell    uint32      // the traced pid (it execs simtrain)
}

// runSimtrain runs simtrain under a tracer from its first instruction: a
// shell traced first waits for a line on stdin and then execs simtrain, so
// the uprobes (on the explicitly configured libraries) and the in-kernel
// fork following are in place before simtrain runs.
func runSimtrain(t *testing.T, set ProbeSet, args ...string) simRun {
	t.Helper()
	return runSimtrainHook(t, set, nil, args...)
}

// runSimtrainHook is runSimtrain with hook called on the traced shell's pid
// before simtrain is released (to set its CPU affinity, start a load, ...).
func runSimtrainHook(t *testing.T, set ProbeSet, hook func(pid int), args ...string) simRun {
	t.Helper()
	var h func(*Tracer, int)
	if hook != nil {
		h = func(_ *Tracer, pid int) { hook(pid) }
	}
	return runSimtrainWith(t, set, h, args...)
}

// runSimtrainWith is runSimtrainHook with the tracer handed to the hook.
func runSimtrainWith(t *testing.T, set ProbeSet, hook func(tr *Tracer, pid int), args ...string) simRun {
	t.Helper()
	dir := simgpu(t)
	tr := newTestTracer(t, Config{
		Probes: set,
		// Low enough that every checkpoint pwrite/fsync on a fast disk
		// is emitted rather than only counted.
		SyscallThreshold: 10 * time.Microsecond,
		LibCUDA:          filepath.Join(dir, "libcuda.so.1"),
		LibNCCL:          filepath.Join(dir, "libnccl.so.2"),
	})
	truthPath := filepath.Join(t.TempDir(), "truth.jsonl")
	args = append([]string{"-c", `read _ && exec "$0" "$@"`, filepath.Join(dir, "simtrain"), "--quiet", "--truth", truthPath}, args...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("Trace: %v", err)
	}
	// Uprobes are detached when the process exits: look at them now.
	attached := tr.Stats().Attached
	if hook != nil {
		hook(tr, cmd.Process.Pid)
	}

	ctx, cancel := context.WithCancel(context.Background())
	evc := make(chan event.Event, 4096)
	runErr := make(chan error, 1)
	go func() { runErr <- tr.Run(ctx, evc) }()
	var events []event.Event
	collected := make(chan struct{})
	mainExited := make(chan struct{})
	pid := uint32(cmd.Process.Pid)
	go func() {
		defer close(collected)
		for ev := range evc {
			events = append(events, ev)
			if ev.Kind == event.KindExit && ev.PID == pid && ev.TID == pid {
				close(mainExited)
			}
		}
	}()

	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("simtrain: %v\n%s", err, out.String())
	}
	// simtrain reaps its children before it exits, so the exit of its
	// main thread is the last record of the run: once it was read,
	// everything before it was too.
	select {
	case <-mainExited:
	case <-time.After(10 * time.Second):
		cancel()
		if err := <-runErr; err != nil {
			t.Logf("Run: %v", err)
		}
		close(evc)
		<-collected
		for _, ev := range events[max(0, len(events)-8):] {
			t.Logf("%+v", ev)
		}
		t.Fatalf("exit of simtrain (pid %d) not seen within 10s", pid)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tr.Stats().Processes != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := tr.Stats()
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(evc)
	<-collected
	if st.Processes != 0 {
		t.Fatalf("%d processes still traced after simtrain exited (pid %d)", st.Processes, pid)
	}
	r := simRun{events: events, truth: readTruth(t, truthPath), stats: st, attached: attached, shell: pid}
	for _, rec := range r.truth {
		if rec.Type == "meta" {
			r.meta = rec
		}
	}
	if r.meta.PID != pid {
		t.Fatalf("truth meta pid %d, traced %d", r.meta.PID, pid)
	}
	if st.RingDrops != 0 {
		t.Fatalf("%d ring-buffer drops", st.RingDrops)
	}
	return r
}

const tolerance = int64(100 * time.Microsecond)

func (r simRun) probed(symbol, kind string) bool {
	for _, p := range r.attached {
		if p.Symbol == symbol && p.Kind == kind && p.PID == int(r.shell) {
			return true
		}
	}
	return false
}

func (r simRun) calls(what string) []truthRec {
	var out []truthRec
	for _, rec := range r.truth {
		if rec.Type == "call" && rec.What == what {
			out = append(out, rec)
		}
	}
	return out
}

func (r simRun) kind(k event.Kind, tid uint32) []event.Event {
	var out []event.Event
	for _, ev := range r.events {
		if ev.Kind == k && (tid == 0 || ev.TID == tid) {
			out = append(out, ev)
		}
	}
	return out
}

func mono(ns int64) int64 { return MonotonicToUnix(ns) }

// descheduled sums the runqueue and off-CPU time of tid inside [a,b].
func (r simRun) descheduled(tid uint32, a, b int64) int64 {
	var sum int64
	for _, ev := range r.events {
		if ev.TID != tid || (ev.Kind != event.KindRunqueue && ev.Kind != event.KindOffCPU) {
			continue
		}
		lo, hi := max(a, ev.Start), min(b, ev.End)
		if hi > lo {
			sum += hi - lo
		}
	}
	return sum
}

// matchIntervals checks that events and truth records pair up one to one,
// in order, each event inside its truth interval to within tolerance.
func (r simRun) matchIntervals(t *testing.T, what string, evs []event.Event, truth []truthRec, check func(event.Event, truthRec)) {
	t.Helper()
	if len(evs) != len(truth) {
		t.Errorf("%s: %d events, truth has %d", what, len(evs), len(truth))
		return
	}
	outliers := 0
	for i, tr := range truth {
		ev := evs[i]
		s, e := mono(tr.Start), mono(tr.End)
		// Time the thread spent preempted between simtrain's clock read
		// and the probe (a loaded machine) is not a timestamp error.
		startErr := ev.Start - s - r.descheduled(tr.TID, s, ev.Start)
		endErr := e - ev.End - r.descheduled(tr.TID, ev.End, e)
		if ev.Start < s-tolerance || ev.End > e+tolerance || startErr > tolerance || endErr > tolerance {
			outliers++
			t.Logf("%s %d: event [%d,%d] vs truth [%d,%d] (start %+dns, end %+dns)", what, i, ev.Start, ev.End, s, e, ev.Start-s, ev.End-e)
		}
		if ev.TID != tr.TID {
			t.Errorf("%s %d: tid %d, truth %d", what, i, ev.TID, tr.TID)
		}
		if check != nil {
			check(ev, tr)
		}
	}
	// A vCPU stolen by the hypervisor between simtrain's clock read and the
	// probe is invisible to the guest scheduler; allow it for one interval
	// in fifty, never more.
	if outliers > max(1, len(truth)/50) {
		t.Errorf("%s: %d of %d intervals off by more than %v", what, outliers, len(truth), time.Duration(tolerance))
	}
}

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

// copyAPIs are simtrain's --copy-api entry points in the order --copy-api
// all takes them, one per step.
var copyAPIs = []string{
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync", "cuMemcpyDtoDAsync_v2",
	"cuMemcpyPeerAsync", "cuMemcpy2DAsync_v2", "cuMemcpy3DAsync_v2", "cuMemsetD8Async",
	"cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
	"cuMemsetD2D32Async",
}

// TestSimtrainCopyAPIs drives every asynchronous copy and memset entry
// point (simtrain --copy-api all: one per step, steps alternating between
// the legacy default stream and a created one) and checks each decoded
// size and stream against the truth.
func TestSimtrainCopyAPIs(t *testing.T) { testCopyAPIs(t) }

// TestSimtrainCopyAPIsSingleUprobes does the same through the attach path
// of kernels without uprobe_multi (cookies per link, not per array slot).
func TestSimtrainCopyAPIsSingleUprobes(t *testing.T) {
	disableUprobeMulti = true
	defer func() { disableUprobeMulti = false }()
	testCopyAPIs(t)
}

func testCopyAPIs(t *testing.T) {
	// Two rounds: with two streams each entry point runs once on each.
	steps := 2 * len(copyAPIs)
	r := runSimtrain(t, ProbesFull, "--steps", fmt.Sprint(steps), "--kernels-per-step", "2",
		"--kernel-us", "300", "--streams", "2", "--workers", "0", "--copy-api", "all")
	main := r.meta.PID

	// Every probed async entry point and its per-thread-stream variant is
	// attached, and no driver symbol of the probe table is reported absent.
	for _, api := range copyAPIs {
		for _, sym := range []string{api, api + "_ptsz"} {
			if !r.probed(sym, "uprobe") {
				t.Errorf("%s not probed", sym)
			}
		}
	}
	for _, m := range r.stats.Missing {
		if strings.HasPrefix(m, libCUDA.String()) {
			t.Errorf("the simulated driver lacks a probed symbol: %s", m)
		}
	}

	truth := r.calls("copy")
	onDefault, onCreated := map[string]int{}, map[string]int{}
	for i, tr := range truth {
		if want := copyAPIs[i%len(copyAPIs)]; tr.API != want || tr.Step != i+1 {
			t.Fatalf("truth copy %d: %s at step %d, want %s at step %d", i, tr.API, tr.Step, want, i+1)
		}
		if tr.Stream == 0 {
			onDefault[tr.API]++
		} else {
			onCreated[tr.API]++
		}
	}
	if len(truth) != steps {
		t.Fatalf("truth has %d copies for %d steps", len(truth), steps)
	}
	for _, api := range copyAPIs {
		if onDefault[api] == 0 || onCreated[api] == 0 {
			t.Errorf("%s called %d times on the default stream and %d on a created one, want both", api, onDefault[api], onCreated[api])
		}
	}

	var evs []event.Event
	for _, ev := range r.events {
		if ev.TID == main && (ev.Kind == event.KindMemcpyAsync || ev.Kind == event.KindMemset) {
			evs = append(evs, ev)
		}
	}
	// Paired in order; each event inside its step (the call itself lasts
	// microseconds, too short to hold a timestamp on a loaded machine).
	stepOf := map[int]truthRec{}
	for _, rec := range r.truth {
		if rec.Type == "step" {
			stepOf[rec.Step] = rec
		}
	}
	inStep := func(ev event.Event, step int) bool {
		st, ok := stepOf[step]
		return ok && ev.Start >= mono(st.Start)-tolerance && ev.Start <= mono(st.End)+tolerance
	}
	if len(evs) != len(truth) {
		// Name the calls that left no event (or more than one).
		for _, tr := range truth {
			n := 0
			for _, ev := range evs {
				if inStep(ev, tr.Step) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s (step %d, stream %#x): %d events", tr.API, tr.Step, tr.Stream, n)
			}
		}
		t.Fatalf("%d async copy/memset events, truth has %d", len(evs), len(truth))
	}
	for i, tr := range truth {
		ev := evs[i]
		kind, fn := event.KindMemcpyAsync, event.CUMemcpyAsync
		if strings.HasPrefix(tr.API, "cuMemset") {
			kind, fn = event.KindMemset, event.CUMemsetAsync
		}
		if ev.Kind != kind || ev.CUDA != fn {
			t.Errorf("%s (step %d): event %v %v, want %v %v", tr.API, tr.Step, ev.Kind, ev.CUDA, kind, fn)
		}
		if ev.Bytes != tr.Bytes {
			t.Errorf("%s (step %d): decoded %d bytes, truth %d", tr.API, tr.Step, ev.Bytes, tr.Bytes)
		}
		if ev.Stream != tr.Stream {
			t.Errorf("%s (step %d): decoded stream %#x, truth %#x", tr.API, tr.Step, ev.Stream, tr.Stream)
		}
		if !inStep(ev, tr.Step) || ev.TID != tr.TID {
			st := stepOf[tr.Step]
			t.Errorf("%s (step %d): event at %d on tid %d, step [%d,%d] on tid %d", tr.API, tr.Step, ev.Start, ev.TID, mono(st.Start), mono(st.End), tr.TID)
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
			fail("no socket event with peer pid %d: %+v", st.ServerPID, evs[0])
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

// A sync that sleeps until the GPU is done and then waits for a CPU: the
// tracer reports the wait from the wakeup (Woken), inside the sync, and the
// wakeup is when the simulated GPU finished, give or take how late the
// machine delivers timer wakeups on that CPU meanwhile (measured, not
// assumed: a loaded host makes it milliseconds). simtrain runs pinned to
// CPU 0 while a SCHED_FIFO thread of this test spins there half the time.
func TestSyncWakeupThenRunqueue(t *testing.T) {
	if !canRealtime() {
		t.Skip("needs SCHED_FIFO (root or CAP_SYS_NICE)")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs a second CPU for the tracer while CPU 0 is hogged")
	}
	var cpu0 unix.CPUSet
	cpu0.Set(0)
	hogDone, stopHog := make(chan struct{}), make(chan struct{})
	// How late a timer wakes a sleeper on CPU 0 while the job runs: the
	// machine's share of the distance between a GPU end and the wakeup
	// it causes (a busy host or hypervisor delays the timer interrupt).
	var lat func() time.Duration
	r := runSimtrainHook(t, ProbesFull, func(pid int) {
		lat = probeWakeupLatency(t, cpu0, stopHog)
		if err := unix.SchedSetaffinity(pid, &cpu0); err != nil {
			t.Fatalf("pin simtrain to CPU 0: %v", err)
		}
		go func() {
			defer close(hogDone)
			// The thread keeps the policy and the affinity: it is never
			// unlocked, so it exits with this goroutine.
			runtime.LockOSThread()
			if err := unix.SchedSetaffinity(0, &cpu0); err != nil {
				return
			}
			if unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 1 /* SCHED_FIFO */, Priority: 1}, 0) != nil {
				return
			}
			// Spin 15 ms, sleep 15 ms, until simtrain is done: whenever its
			// steps run, some of their syncs end while CPU 0 is taken.
			for {
				for end := time.Now().Add(15 * time.Millisecond); time.Now().Before(end); {
				}
				select {
				case <-stopHog:
					return
				case <-time.After(15 * time.Millisecond):
				}
			}
		}()
	}, "--steps", "60", "--kernels-per-step", "2", "--kernel-us", "4000", "--workers", "0")
	close(stopHog)
	<-hogDone
	late := lat()
	// Timer slack and the wakeup path on an idle machine stay well under
	// 500 µs; what the machine added during this run comes on top.
	allowed := 500*int64(time.Microsecond) + int64(late)
	t.Logf("timer wakeups on CPU 0 up to %v late during the run: a wakeup may be %v from a GPU end", late, time.Duration(allowed))
	main := r.meta.TID
	var busyEnds []int64
	for _, rec := range r.truth {
		if rec.Type == "busy" {
			busyEnds = append(busyEnds, mono(rec.End))
		}
	}
	slices.Sort(busyEnds)
	syncs := r.kind(event.KindSync, main)
	var woken int
	var longest int64
	for _, ev := range r.kind(event.KindRunqueue, main) {
		if !ev.Woken {
			continue
		}
		woken++
		longest = max(longest, ev.End-ev.Start)
		var in *event.Event
		for i := range syncs {
			if syncs[i].Start < ev.Start && ev.End <= syncs[i].End {
				in = &syncs[i]
			}
		}
		if in == nil {
			t.Errorf("woken run-queue wait [%d,+%d] is inside no sync", ev.Start, ev.End-ev.Start)
			continue
		}
		// The simulated sync sleeps until the GPU's end: the wakeup is
		// the end of a busy interval, give or take timer slack.
		i, _ := slices.BinarySearch(busyEnds, ev.Start)
		best := int64(1 << 62)
		for _, j := range []int{i - 1, i} {
			if j >= 0 && j < len(busyEnds) {
				best = min(best, max(busyEnds[j]-ev.Start, ev.Start-busyEnds[j]))
			}
		}
		if best > allowed {
			t.Errorf("woken at %d, %d µs from the nearest end of GPU work (allowed %d µs)", ev.Start, best/1000, allowed/1000)
		}
	}
	if woken == 0 {
		t.Fatalf("no woken run-queue wait seen in %d syncs of tid %d while CPU 0 was hogged", len(syncs), main)
	}
	// The hog held CPU 0 half the time: some wakeup waited far longer than
	// the machine's usual wakeup latency.
	if longest < int64(time.Millisecond) {
		t.Errorf("longest woken run-queue wait %d µs while CPU 0 was hogged half the time", longest/1000)
	}
	t.Logf("%d woken run-queue waits inside %d syncs, longest %.1f ms", woken, len(syncs), float64(longest)/1e6)
}

// TestSimtrainStagedCopies: a copy from pageable memory that keeps the host
// is reported by the copy's return probe (full and lite), with the bytes,
// the direction and the entry's start; a pinned batch copy, which returns at
// once, is not; launches never get a return probe.
func TestSimtrainStagedCopies(t *testing.T) {
	for _, set := range []ProbeSet{ProbesFull, ProbesLite} {
		t.Run(string(set), func(t *testing.T) {
			r := runSimtrain(t, set, "--steps", "12", "--kernels-per-step", "4", "--kernel-us", "50",
				"--batch-copies", "1", "--batch-bytes", "1048576", "--stall", "pageable:every=3:ms=5")
			main := r.meta.PID
			var truth []truthRec
			for _, c := range r.calls("copy") {
				if c.Bytes > 4<<20 {
					truth = append(truth, c)
				}
			}
			if len(truth) != 4 {
				t.Fatalf("truth has %d pageable copies, want 4", len(truth))
			}
			// A pinned copy held inside the call on a loaded machine is
			// reported too: it kept the host. It must have been off a CPU
			// for all but the threshold, or the job's own clock must say
			// its call took that long (a virtual CPU the hypervisor
			// stopped is never off a CPU to the guest's scheduler).
			var pinned []truthRec
			for _, c := range r.calls("copy") {
				if c.Bytes <= 4<<20 {
					pinned = append(pinned, c)
				}
			}
			var staged []event.Event
			for _, ev := range r.kind(event.KindMemcpyStaged, main) {
				if ev.Bytes > 4<<20 {
					staged = append(staged, ev)
					continue
				}
				d := r.descheduled(ev.TID, ev.Start, ev.End)
				if ev.Duration()-d <= 200*int64(time.Microsecond)+tolerance {
					continue
				}
				measured := int64(-1)
				for _, c := range pinned {
					if c.Bytes == ev.Bytes && mono(c.Start) <= ev.Start+tolerance && mono(c.End) >= ev.End-tolerance {
						measured = c.End - c.Start
					}
				}
				if measured >= ev.Duration()-tolerance {
					t.Logf("pinned copy of %d bytes reported staged for %d ns, %d ns of it off a CPU; the job measured its call at %d ns",
						ev.Bytes, ev.Duration(), d, measured)
					continue
				}
				t.Errorf("pinned copy of %d bytes reported staged for %d ns, %d ns of it off a CPU; the job measured its call at %d ns (-1: no such call)",
					ev.Bytes, ev.Duration(), d, measured)
			}
			entries := map[int64]bool{}
			for _, ev := range r.kind(event.KindMemcpyAsync, main) {
				entries[ev.Start] = true
			}
			r.matchIntervals(t, "staged copy", staged, truth, func(ev event.Event, tr truthRec) {
				if ev.Bytes != tr.Bytes || ev.CUDA != event.CUMemcpyHtoD || ev.Stream != tr.Stream {
					t.Errorf("staged copy: bytes %d %v stream %#x, truth %d HtoD %#x", ev.Bytes, ev.CUDA, ev.Stream, tr.Bytes, tr.Stream)
				}
				if !entries[ev.Start] {
					t.Errorf("staged copy starting %d has no async copy entry at that time", ev.Start)
				}
				if len(ev.Stack) == 0 {
					t.Errorf("staged copy has no stack")
				}
			})
			for _, sym := range []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync"} {
				if !r.probed(sym, "uretprobe") {
					t.Errorf("%s has no return probe", sym)
				}
			}
			for _, p := range r.attached {
				if p.Kind == "uretprobe" && (strings.HasPrefix(p.Symbol, "cuLaunch") || strings.HasPrefix(p.Symbol, "cuMemset") ||
					strings.HasPrefix(p.Symbol, "cuMemcpyDtoDAsync") || strings.HasPrefix(p.Symbol, "cuMemcpyPeerAsync")) {
					t.Errorf("%s has a return probe", p.Symbol)
				}
			}
		})
	}
}
