package tracer

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// A thread spinning in user space (no syscall: a Python `while not flag`
// loop) has its native stack from a perf sample taken as it spins, and
// its Python frames from the interpreter as they are now: after it moves
// from one spinning function to another, the stacks say the second.
func TestThreadStacksSpinning(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("perf events on another process need root")
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	flag := filepath.Join(dir, "next")
	script := filepath.Join(dir, "spin.py")
	src := `import os, sys, threading
flag = sys.argv[1]
def spin_first():
    n = 0
    while not os.path.exists(flag) if n % 100000 == 0 else True:
        n += 1
def spin_second():
    n = 0
    while True:
        n += 1
print(threading.get_native_id(), flush=True)
spin_first()
spin_second()
`
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script, flag)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, tid := uint32(cmd.Process.Pid), strings.TrimSpace(line)
	tr := &Tracer{syms: newSymbolizer(), py: newPyStacks()}
	defer tr.syms.close()
	proc, _ := procfs.NewProc(int(pid))
	maps, _ := proc.ProcMaps()
	if p, err := tr.py.inspect(pid, maps); err != nil || p == nil {
		t.Skipf("python stacks unsupported here: %v", err)
	}
	for _, fn := range []string{"spin_first", "spin_second"} {
		if fn == "spin_second" {
			if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var th ThreadStack
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			got, err := tr.ThreadStacks(pid)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range got {
				if itoa(g.TID) == tid {
					th = g
				}
			}
			if hasFunction(th.Python, fn) && len(th.Native) > 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !hasFunction(th.Python, fn) || len(th.Native) == 0 || th.Err != "" || th.Syscall != "" {
			t.Fatalf("spinning in %s: state %s, syscall %q, native %v, python %v, err %q", fn, th.State, th.Syscall, th.Native,
				th.Python, th.Err)
		}
		inPython := false
		for _, f := range th.Native {
			inPython = inPython || strings.Contains(f.File, "python") || strings.Contains(f.Function, "PyEval")
		}
		if !inPython {
			t.Errorf("spinning in %s: native frames %v are not the interpreter's", fn, th.Native)
		}
		t.Logf("spinning in %s: %d native frames, innermost %v", fn, len(th.Native), th.Native[0])
	}
}
