package tracer

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/gaptrace/gaptrace/event"
)

// TestLaunchProbesWalkNoPython: the per-launch programs (and the entry of a
// blocking call) never touch the Python walk; only the capture points do.
func TestLaunchProbesWalkNoPython(t *testing.T) {
	cuda, err := loadCuda()
	if err != nil {
		t.Fatal(err)
	}
	sys, err := loadSyscalls()
	if err != nil {
		t.Fatal(err)
	}
	walks := func(p *ebpf.ProgramSpec) bool {
		for _, ins := range p.Instructions {
			if ins.Reference() == cudaMapPyProcs || ins.IsBuiltinCall() && asm.BuiltinFunc(ins.Constant) == asm.FnLoop {
				return true
			}
		}
		return false
	}
	for _, name := range []string{cudaProgCudaLaunch, cudaProgCudaAsync, cudaProgCudaBlockEnter} {
		if walks(cuda.Programs[name]) {
			t.Errorf("%s walks Python frames: launches must not pay for it", name)
		}
	}
	if !walks(cuda.Programs[cudaProgCudaBlockExit]) || !walks(sys.Programs[syscallsProgSysExit]) {
		t.Error("the capture points (cuda_block_exit, sys_exit) do not walk Python frames")
	}
	if walks(sys.Programs[syscallsProgSysEnter]) {
		t.Error("sys_enter walks Python frames")
	}
}

// TestPyStackCost measures what a Python stack adds to a capture point, in
// the programs themselves (py_stats: the time from the py_procs hit to the
// record's copy into the ring), for a shallow stack and one past the
// captured depth, and the user-space cost of resolving one (cached code
// objects).
func TestPyStackCost(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	for _, c := range []struct {
		name  string
		depth int
	}{{"depth 5", 2}, {"depth 40", 37}} {
		t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			tr := newTestTracer(t, Config{Probes: ProbesFull, SyscallThreshold: 10 * time.Microsecond})
			const sleeps = 2000
			script := fmt.Sprintf(`
import sys, time
def down(n):
    if n:
        return down(n - 1)
    for _ in range(%d):
        time.sleep(0.0001)
sys.stdin.readline()
down(%d)
`, sleeps, c.depth)
			cmd := exec.Command(py, "-c", script)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Wait() }()
			if err := tr.Trace(cmd.Process.Pid); err != nil {
				_ = cmd.Process.Kill()
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			evc := make(chan event.Event, 1024)
			go func() {
				for range evc { // drained: only the programs' counts matter
				}
			}()
			go func() { _ = tr.Run(ctx, evc) }()
			// The loader maps libpython after exec; the mapping's rescan
			// finds the interpreter.
			deadline := time.Now().Add(10 * time.Second)
			for {
				tr.py.mu.Lock()
				_, ok := tr.py.procs[uint32(cmd.Process.Pid)]
				tr.py.mu.Unlock()
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pid %d not recognised as CPython within 10s", cmd.Process.Pid)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if _, err := stdin.Write([]byte("go\n")); err != nil {
				t.Fatal(err)
			}
			_ = stdin.Close()
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			var stacks, ns uint64
			for _, m := range []*ebpf.Map{tr.cuda.PyStats, tr.sys.PyStats} {
				var per []cudaPyStat
				if err := m.Lookup(uint32(0), &per); err != nil {
					t.Fatal(err)
				}
				for _, s := range per {
					stacks += s.Stacks
					ns += s.Ns
				}
			}
			if stacks < sleeps*9/10 {
				t.Fatalf("%d Python stacks captured for %d sleeps", stacks, sleeps)
			}
			us := float64(ns) / float64(stacks) / 1e3
			t.Logf("%s: %d stacks, %.2f µs per stack in the programs", c.name, stacks, us)
			// Far above what is measured (a few µs): only a walk gone
			// wrong (every thread, every frame unreadable) gets there.
			if us > 100 {
				t.Errorf("%.1f µs per Python stack", us)
			}
		})
	}
}
