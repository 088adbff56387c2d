package tracer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
