package main_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/hang"
)

// pyHangJob runs pytrain.py with --hang-at under gaptrace and returns
// gaptrace, the trainer's truth records of the hang (once written) and the
// paths of the gaps file and the run directory.
func pyHangJob(t *testing.T, kind string) (p *gtProc, truth string, gaps, runDir string, pid int) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	script, err := filepath.Abs("../../testdata/simgpu/pytrain.py")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	truth, gaps, runDir = filepath.Join(dir, "truth.jsonl"), filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "run")
	environ := append(os.Environ(), "SIMGPU_DIR="+t.TempDir(), "GAPTRACE_RUN_DIR="+runDir)
	p = start(t, environ, "run", "--live", "off", "--hang-after", hangAfter.String(), "--gaps-out", gaps,
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--",
		py, script, "--lib", simgpuDir, "--kernel-us", "500", "--hang-at", "60",
		"--hang-kind", kind, "--truth", truth, "--data-dir", dir)
	pid = truthPID(t, truth, 1, 60*time.Second)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return p, truth, gaps, runDir, pid
}

// pyHangTruth is the trainer's record of where it hangs.
type pyHangTruth struct {
	Start    int64  `json:"start"`
	TID      uint32 `json:"tid"`
	Worker   int    `json:"worker"`
	Function string `json:"function"`
	Line     int    `json:"line"`
}

func readPyHang(t *testing.T, path string) pyHangTruth {
	t.Helper()
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"type": "hang"`) {
			var h pyHangTruth
			if err := json.Unmarshal([]byte(l), &h); err != nil {
				t.Fatal(err)
			}
			return h
		}
	}
	t.Fatalf("no hang record in the truth:\n%s", b)
	return pyHangTruth{}
}

// pyFrameAt finds the thread's stack in a report and whether its Python
// frames hold function at line.
func pyFrameAt(r *hang.Report, pid, tid uint32, function string, line int) bool {
	for _, st := range r.Stacks {
		for _, th := range st.Threads {
			if st.PID != pid || (tid != 0 && th.TID != tid) {
				continue
			}
			for _, f := range th.Python {
				if f.Function == function && (line == 0 || f.Line == line) {
					return true
				}
			}
		}
	}
	return false
}

// TestHangPythonLoaderDeadlock: a Python job's loader worker deadlocks
// (forked while a lock was held); the main thread waits for good in a read
// of its pipe. The report names the read and the pipe, with the Python
// frames of the main thread at the read and of the worker at the lock; a
// `gaptrace dump` meanwhile lists the read in flight.
func TestHangPythonLoaderDeadlock(t *testing.T) {
	need(t)
	p, truth, gaps, runDir, pid := pyHangJob(t, "loader")
	r := awaitHang(t, p, gaps, 90*time.Second, "the main thread's read", func(r *hang.Report) bool {
		return r.PID == uint32(pid) && r.Call.Kind == hang.Syscall
	})
	h := readPyHang(t, truth)
	t.Cleanup(func() { _ = syscall.Kill(h.Worker, syscall.SIGKILL) })
	checkPrompt(t, &r)
	if r.TID != h.TID || r.Call.Name != "read" || !strings.HasPrefix(r.Call.File, "pipe:[") {
		t.Errorf("call %+v on tid %d, want tid %d's read of a pipe", r.Call, r.TID, h.TID)
	}
	if d := time.Duration(r.Since - h.Start); d < 0 || d > time.Second {
		t.Errorf("hang since %d, the trainer blocked at %d", r.Since, h.Start)
	}
	if !pyFrameAt(&r, uint32(pid), h.TID, h.Function, h.Line) {
		t.Errorf("no Python frame %s line %d in the main thread's stack: %+v", h.Function, h.Line, r.Stacks)
	}
	if !pyFrameAt(&r, uint32(h.Worker), 0, "next_batch", 0) {
		t.Errorf("the worker's (pid %d) Python stack is not in the report: %+v", h.Worker, r.Stacks)
	}
	out, err := exec.Command(gaptraceBin, "dump", "--run-dir", runDir).Output()
	if err != nil {
		t.Fatalf("gaptrace dump: %v", err)
	}
	var d struct {
		InFlight []hang.Call   `json:"in_flight"`
		Stacks   []hang.Stacks `json:"processes"`
	}
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("dump does not parse: %v\n%s", err, out)
	}
	found := false
	for _, c := range d.InFlight {
		found = found || c.TID == h.TID && c.Name == "read"
	}
	if !found || len(d.Stacks) < 2 {
		t.Errorf("dump: in flight %+v, %d processes; want the read and both processes", d.InFlight, len(d.Stacks))
	}
	_ = syscall.Kill(h.Worker, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	p.wait(t, 2*time.Minute)
}
