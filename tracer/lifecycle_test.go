package tracer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/hostproc"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// ourObjects lists the IDs of every program and link the tracer holds.
func (t *Tracer) ourObjects() (progs []ebpf.ProgramID, links []link.ID) {
	for _, p := range []*ebpf.Program{
		t.cuda.CudaLaunch, t.cuda.CudaAsync, t.cuda.CudaBlockEnter, t.cuda.CudaBlockExit,
		t.nccl.NcclColl, t.nccl.NcclGroupStart, t.nccl.NcclGroupEndEnter, t.nccl.NcclGroupEndExit,
		t.nccl.NcclCommInitEnter, t.nccl.NcclCommInitExit,
		t.sys.SysEnter, t.sys.SysExit,
		t.sched.OnSchedSwitch, t.sched.OnSchedWaking, t.sched.OnSchedWakeupNew,
		t.sched.OnSchedProcessFork, t.sched.OnSchedProcessExec, t.sched.OnSchedProcessExit,
	} {
		if info, err := p.Info(); err == nil {
			if id, ok := info.ID(); ok {
				progs = append(progs, id)
			}
		}
	}
	for _, l := range t.tps {
		if info, err := l.Info(); err == nil {
			links = append(links, info.ID)
		}
	}
	return progs, links
}

// waitGone waits until none of the programs and links exist any more in the
// kernel (they are freed after an RCU grace period, not synchronously).
func waitGone(t *testing.T, progs []ebpf.ProgramID, links []link.ID) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive []string
		for _, id := range progs {
			if p, err := ebpf.NewProgramFromID(id); err == nil {
				p.Close()
				alive = append(alive, fmt.Sprintf("prog %d", id))
			}
		}
		for _, id := range links {
			if l, err := link.NewFromID(id); err == nil {
				l.Close()
				alive = append(alive, fmt.Sprintf("link %d", id))
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still loaded 10s after the tracer went away: %v", alive)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// uprobeEventsMention reports whether tracefs still lists a uprobe on path
// (uprobes created through tracefs rather than the perf PMU show up there).
func uprobeEventsMention(path string) bool {
	for _, f := range []string{"/sys/kernel/tracing/uprobe_events", "/sys/kernel/debug/tracing/uprobe_events"} {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), path) {
			return true
		}
	}
	return false
}

// startSimtrain starts a long simtrain run and returns it (killed at cleanup).
func startSimtrain(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	dir := simgpu(t)
	cmd := exec.Command(filepath.Join(dir, "simtrain"), append([]string{"--quiet"}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func TestCloseLeavesNothing(t *testing.T) {
	tr := newTestTracer(t, Config{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	cmd := startSimtrain(t, "--steps", "1000000", "--kernels-per-step", "4", "--kernel-us", "100", "--collectives", "1")
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// Libraries are discovered from /proc/PID/maps (no explicit paths).
	traceStart := time.Now()
	testutil.WaitFor(t, 10*time.Second, "uprobes on the mapped libcuda and libnccl", func() bool {
		cuda, nccl := false, false
		for _, p := range tr.Stats().Attached {
			cuda = cuda || p.Kind == "uprobe" && p.Symbol == "cuLaunchKernel"
			nccl = nccl || p.Kind == "uprobe" && p.Symbol == "ncclAllReduce"
		}
		return cuda && nccl
	})
	t.Logf("uprobes attached %v after Trace", time.Since(traceStart))
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan event.Event, 1024)
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, out) }()
	testutil.WaitFor(t, 30*time.Second, "a collective and a sync from the running process", func() bool {
		return drainUntil(out, event.KindCollective) && drainUntil(out, event.KindSync)
	})
	progs, links := tr.ourObjects()
	if len(progs) != 18 || len(links) == 0 {
		t.Fatalf("%d programs, %d links before Close", len(progs), len(links))
	}
	closeStart := time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(closeStart))
	if err := <-done; err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
	cancel()
	goneStart := time.Now()
	waitGone(t, progs, links)
	t.Logf("programs and links gone %v after Close", time.Since(goneStart))
	if uprobeEventsMention(simgpu(t)) {
		t.Error("uprobe_events still lists a probe on the simulated libraries")
	}
}

// TestKilledTracerLeavesNothing runs a tracer in a child process, kills it
// with SIGKILL and checks that the kernel dropped every program, link and
// uprobe with its file descriptors (nothing is pinned).
func TestKilledTracerLeavesNothing(t *testing.T) {
	testutil.NeedRoot(t, "loads BPF programs")
	target := startSimtrain(t, "--steps", "1000000", "--kernels-per-step", "4", "--kernel-us", "100")
	helper := exec.Command(os.Args[0], "-test.run=^TestTracerHelperProcess$")
	helper.Env = append(os.Environ(), "GAPTRACE_TRACER_HELPER_PID="+fmt.Sprint(target.Process.Pid))
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = helper.Process.Kill() }()
	var objs struct {
		Progs   []ebpf.ProgramID
		Links   []link.ID
		Uprobes int
		Err     string
	}
	sc := bufio.NewScanner(stdout)
	found := false
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "OBJECTS "); ok {
			if err := json.Unmarshal([]byte(line), &objs); err != nil {
				t.Fatal(err)
			}
			found = true
			break
		}
	}
	if !found {
		t.Fatal("helper did not report its objects")
	}
	if objs.Err != "" {
		if strings.Contains(objs.Err, ebpf.ErrNotSupported.Error()) {
			t.Skipf("kernel lacks a required feature: %s", objs.Err)
		}
		t.Fatal(objs.Err)
	}
	if objs.Uprobes == 0 || len(objs.Progs) != 18 {
		t.Fatalf("helper attached %d uprobes, %d programs", objs.Uprobes, len(objs.Progs))
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	waitGone(t, objs.Progs, objs.Links)
	if uprobeEventsMention(simgpu(t)) {
		t.Error("uprobe_events still lists a probe on the simulated libraries")
	}
}

// TestTracerHelperProcess is the tracer that TestKilledTracerLeavesNothing
// kills; it does nothing unless started by that test.
func TestTracerHelperProcess(t *testing.T) {
	pidStr := os.Getenv("GAPTRACE_TRACER_HELPER_PID")
	if pidStr == "" {
		t.Skip("helper process for TestKilledTracerLeavesNothing")
	}
	report := func(v any) { b, _ := json.Marshal(v); fmt.Printf("OBJECTS %s\n", b) }
	tr, err := New(Config{})
	if err != nil {
		report(map[string]string{"Err": err.Error()})
		return
	}
	var pid int
	if _, err := fmt.Sscan(pidStr, &pid); err != nil {
		report(map[string]string{"Err": "pid " + pidStr + ": " + err.Error()})
		return
	}
	if err := tr.Trace(pid); err != nil {
		report(map[string]string{"Err": err.Error()})
		return
	}
	uprobes := 0
	for _, p := range tr.Stats().Attached {
		if strings.HasPrefix(p.Kind, "uprobe") || strings.HasPrefix(p.Kind, "uretprobe") {
			uprobes++
		}
	}
	progs, links := tr.ourObjects()
	report(map[string]any{"Progs": progs, "Links": links, "Uprobes": uprobes})
	time.Sleep(time.Minute) // killed long before
}

var seenKinds = map[event.Kind]bool{}

// drainUntil consumes what is pending in out and reports whether an event
// of kind k was seen so far.
func drainUntil(out <-chan event.Event, k event.Kind) bool {
	for {
		select {
		case ev := <-out:
			seenKinds[ev.Kind] = true
		default:
			return seenKinds[k]
		}
	}
}

// TestMissingLibraryAndSymbols: a process without libcuda and a "driver"
// without the driver's symbols produce warnings that name what is missing;
// tracing goes on.
func TestMissingLibraryAndSymbols(t *testing.T) {
	dir := simgpu(t)
	notDriver := filepath.Join(dir, "libnvidia-ml.so.1")
	tr := newTestTracer(t, Config{LibNCCL: notDriver})
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	if err := tr.Trace(sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	st := tr.Stats()
	want := []string{
		fmt.Sprintf("libcuda.so.1: not mapped by pid %d", sleeper.Process.Pid),
		"libnccl.so.2 " + notDriver + ": symbol ncclAllReduce",
		"libnccl.so.2 " + notDriver + ": symbol ncclGroupEnd",
	}
	for _, w := range want {
		found := false
		for _, m := range st.Missing {
			found = found || strings.Contains(m, w)
		}
		if !found {
			t.Errorf("no warning containing %q in %q", w, st.Missing)
		}
	}
	if st.Processes != 1 {
		t.Errorf("%d processes traced, want 1", st.Processes)
	}
}

// TestLateDlopen: a library mapped after Trace (dlopen) is found through
// the executable-mapping event, not the periodic rescan (set to an hour).
func TestLateDlopen(t *testing.T) {
	dir := simgpu(t)
	bin := filepath.Join(t.TempDir(), "dlopen")
	if out, err := exec.Command("cc", "-O2", "-o", bin, "testdata/dlopen.c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("build fixture: %v\n%s", err, out)
	}
	tr := newTestTracer(t, Config{RescanInterval: time.Hour})
	cmd := exec.Command(bin, filepath.Join(dir, "libcuda.so.1"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan event.Event, 1024)
	go func() { _ = tr.Run(ctx, out) }()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "a cuCtxSynchronize event after dlopen", func() bool {
		for {
			select {
			case ev := <-out:
				if ev.Kind == event.KindSync && ev.CUDA == event.CUCtxSynchronize && ev.PID == uint32(cmd.Process.Pid) {
					return true
				}
			default:
				return false
			}
		}
	})
	for _, m := range tr.Stats().Missing {
		if strings.Contains(m, "not mapped") {
			t.Errorf("warning kept after the library was mapped: %s", m)
		}
	}
}

// TestRingDropsCounted fills a one-page ring buffer that nobody reads and
// checks that what did not fit is counted, and that reading resumes after.
func TestRingDropsCounted(t *testing.T) {
	tr := newTestTracer(t, Config{RingBufferBytes: 4096})
	cmd := exec.Command("/bin/sh", "-c", `read _; for i in 1 2 3 4 5 6 7 8 9 10; do cat /dev/null; done; read _`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	// Each cat opens and closes a dozen files: far more than one page of
	// records, and nothing reads them yet.
	testutil.WaitFor(t, 10*time.Second, "ring-buffer drops", func() bool { return tr.Stats().RingDrops > 0 })

	// The shell exits as soon as it reads its next line: its exit record
	// fits only once every cat has ended and the reader has emptied the
	// full ring after that, which on a loaded host may take a while.
	syscallPath := fmt.Sprintf("/proc/%d/syscall", cmd.Process.Pid)
	testutil.WaitFor(t, 10*time.Second, "the shell blocked in its second read", func() bool {
		b, err := os.ReadFile(syscallPath)
		return err == nil && strings.HasPrefix(string(b), "0 ") // read(2), after the last cat
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan event.Event, 1024)
	begin := time.Now().UnixNano()
	go func() { _ = tr.Run(ctx, out) }()
	testutil.WaitFor(t, 10*time.Second, "the reader to empty the full ring", func() bool { return tr.Delivered() >= begin })
	if _, err := io.WriteString(stdin, "done\n"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the shell's exit after the overflow", func() bool {
		for {
			select {
			case ev := <-out:
				if ev.Kind == event.KindExit && ev.PID == uint32(cmd.Process.Pid) {
					return true
				}
			default:
				return false
			}
		}
	})
}

// TestAttachFlagsOnlyTheNamedProcess: attached to a running process, that
// process feeds the GPU from its first event; a descendant already running
// (a data-loader worker forked from it maps libcuda too) starts as one it
// forks later does, traced but not feeding the GPU until it calls a probe.
func TestAttachFlagsOnlyTheNamedProcess(t *testing.T) {
	tr := newTestTracer(t, Config{})
	parent := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })
	var child int
	deadline := time.Now().Add(10 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		if kids := hostproc.Descendants(parent.Process.Pid); len(kids) > 0 {
			child = kids[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("the shell's child never appeared")
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if err := tr.Trace(parent.Process.Pid); err != nil {
		t.Fatal(err)
	}
	flags := func(pid int) uint32 {
		var v uint32
		if err := tr.shared[cudaMapTracedTgids].Lookup(uint32(pid), &v); err != nil {
			t.Fatalf("traced_tgids[%d]: %v", pid, err)
		}
		return v
	}
	if got := flags(parent.Process.Pid); got != tgidTraced|tgidGPU {
		t.Errorf("named process: flags %#x, want traced and GPU (%#x)", got, tgidTraced|tgidGPU)
	}
	if got := flags(child); got != tgidTraced {
		t.Errorf("its running child: flags %#x, want traced only (%#x)", got, tgidTraced)
	}
}
