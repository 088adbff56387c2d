package main_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/hang"
)

// sockJob starts two ranks of testdata/sockreduce.py (an all-reduce over
// TCP, not NCCL) under gaptrace run --hang-after 2s, and returns gaptrace,
// the ranks' pids and the gaps file. extra goes before the command.
func sockJob(t *testing.T, wrap []string, extra ...string) (p *gtProc, pids [2]int, gaps string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	script, err := filepath.Abs("testdata/sockreduce.py")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	dir := t.TempDir()
	gaps = filepath.Join(dir, "gaps.jsonl")
	rank := func(r int) string {
		return fmt.Sprintf("RANK=%d WORLD_SIZE=2 %s %s --lib %s --rank %d --port %s --truth %s", r, py, script, simgpuDir, r, port,
			filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)))
	}
	args := append([]string{"run", "--live", "off", "--hang-after", hangAfter.String(), "--gaps-out", gaps,
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1")}, extra...)
	args = append(append(append(args, "--"), wrap...), "sh", "-c", rank(0)+" & "+rank(1)+"; wait")
	environ := append(os.Environ(), "SIMGPU_DIR="+t.TempDir(), "GAPTRACE_RUN_DIR="+filepath.Join(dir, "run"))
	p = start(t, environ, args...)
	for r := range 2 {
		pids[r] = truthPID(t, filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), 20, 90*time.Second)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return p, pids, gaps
}

// TestHangSocketPeerStopped: two ranks all-reduce over TCP (no NCCL call,
// as under gloo); rank 1 stops. Rank 0 blocks in its recv: the report
// names the socket's other end, rank 1, its pid and state, within the
// threshold and a tick; and it ends once rank 1 goes on.
func TestHangSocketPeerStopped(t *testing.T) {
	need(t)
	p, pids, gaps := sockJob(t, nil)
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := awaitHang(t, p, gaps, hangAfter+30*time.Second, "rank 0 waits in recv on stopped rank 1", func(r *hang.Report) bool {
		return r.PID == uint32(pids[0]) && r.Status == hang.Ongoing && len(r.Missing) == 1 && r.Missing[0].PID == uint32(pids[1]) &&
			r.Missing[0].State == hang.StateStopped
	})
	checkSocketWait(t, &r, pids)
	if err := syscall.Kill(pids[1], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	awaitHang(t, p, gaps, 30*time.Second, "the hang ended", func(e *hang.Report) bool {
		return e.ID == r.ID && e.Status == hang.Ended
	})
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.wait(t, 2*time.Minute)
}

func checkSocketWait(t *testing.T, r *hang.Report, pids [2]int) {
	t.Helper()
	lat := checkPrompt(t, r)
	if r.Call.Kind != hang.Syscall || !strings.HasPrefix(r.Call.Name, "recv") || r.Call.PeerPID != uint32(pids[1]) ||
		!strings.HasPrefix(r.Call.PeerAddr, "127.0.0.1:") {
		t.Errorf("waiting call %+v, want a recv from rank 1 (pid %d)", r.Call, pids[1])
	}
	if m := r.Missing[0]; m.Rank != 1 {
		t.Errorf("missing %+v, want rank 1 (its RANK)", m)
	}
	want := fmt.Sprintf("missing: rank 1 (pid %d", pids[1])
	if !strings.Contains(r.Reason, want) || !strings.Contains(r.Reason, "stopped") {
		t.Errorf("reason %q, want %q and its state", r.Reason, want)
	}
	t.Logf("detected %v after the recv began (--hang-after %v): %s", lat, hangAfter, r.Reason)
}
