package tracer

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/gaptrace/gaptrace/event"
)

// ThreadStacks reads a live Python process that blocks in two threads
// without stopping it: each thread's native frames down from its blocking
// call and its Python frames, matched to the right thread.
func TestThreadStacksPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	script := filepath.Join(t.TempDir(), "blocked.py")
	src := `import threading, time, sys, os
def waits_in_thread(ev):
    ev.wait()
def sleeps_in_main():
    print(threading.get_native_id(), th.native_id, flush=True)
    time.sleep(60)
ev = threading.Event()
th = threading.Thread(target=waits_in_thread, args=(ev,), name="waiter")
th.start()
sleeps_in_main()
`
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(line)
	pid := uint32(cmd.Process.Pid)
	tr := &Tracer{syms: newSymbolizer(), py: newPyStacks()}
	defer tr.syms.close()
	proc, _ := procfs.NewProc(int(pid))
	maps, _ := proc.ProcMaps()
	if p, err := tr.py.inspect(pid, maps); err != nil || p == nil {
		t.Skipf("python stacks unsupported here: %v", err)
	}
	// The main thread may still be on its way into the sleep.
	var got []ThreadStack
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if got, err = tr.ThreadStacks(pid); err != nil {
			t.Fatal(err)
		}
		if len(got) == 2 && got[0].Syscall != "" && got[1].Syscall != "" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := map[string]string{ids[0]: "sleeps_in_main", ids[1]: "waits_in_thread"}
	for _, th := range got {
		fn, ok := want[itoa(th.TID)]
		if !ok {
			continue
		}
		delete(want, itoa(th.TID))
		if !hasFunction(th.Python, fn) {
			t.Errorf("tid %d: Python frames %v lack %s", th.TID, th.Python, fn)
		}
		if len(th.Native) < 2 || !strings.Contains(th.Native[0].File, "libc") {
			t.Errorf("tid %d (%s): native frames %v, want the libc call first", th.TID, th.Syscall, th.Native)
		}
		if th.State != "sleeping" || th.Syscall == "" {
			t.Errorf("tid %d: state %q syscall %q", th.TID, th.State, th.Syscall)
		}
	}
	if len(want) > 0 {
		t.Errorf("threads %v not found in %+v", want, got)
	}
}

func hasFunction(fs []event.Frame, fn string) bool {
	for _, f := range fs {
		if f.Function == fn {
			return true
		}
	}
	return false
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
