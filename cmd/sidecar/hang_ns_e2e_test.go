package main_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// Hangs as a user meets them in a container: gaptrace and the job in a PID
// namespace of their own (deploy/'s sidecar with a shared process
// namespace; a pod per rank), on a machine whose cores are all busy.

// cpuHog keeps every core busy with a spinning shell until the test ends.
func cpuHog(t *testing.T) {
	t.Helper()
	for range runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

// nsRank finds, as this test sees it, the pid of the simtrain of rank r
// among p's descendants (not gaptrace, whose command line names it too).
func nsRank(t *testing.T, p *gtProc, r int) int {
	t.Helper()
	want := "\x00--rank\x00" + strconv.Itoa(r) + "\x00"
	pid := 0
	if !testutil.Poll(60*time.Second, 50*time.Millisecond, func() bool {
		for _, d := range proc.Descendants(p.cmd.Process.Pid) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", d))
			argv0, _, _ := strings.Cut(string(b), "\x00")
			if filepath.Base(argv0) == "simtrain" && strings.Contains(string(b), want) {
				pid = d
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no simtrain of rank %d under pid %d\n%s", r, p.cmd.Process.Pid, p.stderr)
	}
	return pid
}

func rankArgv(dir, id string, r int) []string {
	return []string{filepath.Join(simgpuDir, "simtrain"), "--truth", filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)),
		"--rank", strconv.Itoa(r), "--nranks", "2", "--device", strconv.Itoa(r), "--steps", "1000000", "--collectives", "1",
		"--kernels-per-step", "9", "--kernel-us", "1500", "--comm-id", id, "--workers", "0", "--quiet", "--await-probes", "60"}
}

// TestHangInPIDNamespaceBesideCPUHog: gaptrace runs two ranks inside a
// new PID namespace while every core spins elsewhere; rank 1 stops. The
// report names it by its pid in that namespace, within the threshold and
// a tick of the wait's start, and `gaptrace dump` from the host reads the
// session through its run directory.
func TestHangInPIDNamespaceBesideCPUHog(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	cpuHog(t)
	dir := t.TempDir()
	id := fmt.Sprintf("hangns%d", time.Now().UnixNano())
	gaps, runDir := filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "run")
	rank := func(r int) string {
		return "RANK=" + strconv.Itoa(r) + " WORLD_SIZE=2 " + strings.Join(rankArgv(dir, id, r), " ")
	}
	argv := []string{"unshare", "--pid", "--fork", "--mount-proc", gaptraceBin, "run", "--live", "off", "--hang-after",
		hangAfter.String(), "--gaps-out", gaps, "--spans-out", filepath.Join(dir, "spans.jsonl"),
		"--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--", "sh", "-c", rank(0) + " & " + rank(1) + "; wait"}
	p := startArgv(t, append(os.Environ(), "SIMGPU_DIR="+t.TempDir(), "SIMGPU_DEVICES=2", "GAPTRACE_RUN_DIR="+runDir), argv...)
	var nsPID [2]int
	for r := range 2 {
		nsPID[r] = truthPID(t, filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), 20, 2*time.Minute)
	}
	host1 := nsRank(t, p, 1)
	t.Cleanup(func() { _ = syscall.Kill(host1, syscall.SIGCONT) })
	if host1 == nsPID[1] {
		t.Fatalf("rank 1 has pid %d both here and in its namespace: not a namespace of its own", host1)
	}
	if err := syscall.Kill(host1, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := awaitHang(t, p, gaps, hangAfter+60*time.Second, "rank 0 waits on stopped rank 1 (namespace pids)",
		waitingOn(nsPID[0], nsPID[1], hang.StateStopped))
	lat := checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	t.Logf("beside %d spinning shells, detected %v after the sync began (--hang-after %v): %s", runtime.NumCPU(), lat,
		hangAfter, r.Reason)
	out, err := exec.Command(gaptraceBin, "dump", "--run-dir", runDir).Output()
	if err != nil {
		t.Fatalf("gaptrace dump from the host: %v", err)
	}
	var d struct {
		InFlight []hang.Call    `json:"in_flight"`
		Hangs    []*hang.Report `json:"hangs"`
		Stacks   []hang.Stacks  `json:"processes"`
	}
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("dump does not parse: %v\n%s", err, out)
	}
	stopped := false
	for _, st := range d.Stacks {
		stopped = stopped || st.PID == uint32(nsPID[1]) && st.State == hang.StateStopped
	}
	if len(d.Hangs) == 0 || d.Hangs[0].PID != uint32(nsPID[0]) || !stopped {
		t.Errorf("dump: hangs %+v, processes %+v; want rank 0's hang and rank 1 (pid %d) stopped", d.Hangs, d.Stacks, nsPID[1])
	}
	_ = syscall.Kill(host1, syscall.SIGCONT)
	awaitHang(t, p, gaps, 30*time.Second, "the hang ended", func(e *hang.Report) bool {
		return e.ID == r.ID && e.Status == hang.Ended
	})
}

// TestHangPeersPIDNamespacesBesideCPUHog: a pod per rank: each rank and
// its gaptrace in a PID namespace of their own, so both ranks may have the
// same pid; the sidecars share collectives and process states through
// --peers under the job's secret, with every core busy. Rank 1 stops:
// rank 0's sidecar names rank 1 of the other sidecar, stopped, not its own
// process that has the same pid.
func TestHangPeersPIDNamespacesBesideCPUHog(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	cpuHog(t)
	dir := t.TempDir()
	id := fmt.Sprintf("hangpns%d", time.Now().UnixNano())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	secret := writeSecret(t, "bnMtaGFuZy1zZWNyZXQtbnMtaGFuZy1zZWNyZXQtbnMK\n", 0o600)
	environ := append(os.Environ(), "SIMGPU_DIR="+t.TempDir(), "SIMGPU_DEVICES=2")
	var ps [2]*gtProc
	for r := range 2 {
		argv := append([]string{"unshare", "--pid", "--fork", "--mount-proc", gaptraceBin, "run", "--live", "off",
			"--hang-after", hangAfter.String(), "--gaps-out", filepath.Join(dir, fmt.Sprintf("gaps%d.jsonl", r)),
			"--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--job-id", id, "--rank", strconv.Itoa(r),
			"--peers", addr, "--peers-secret-file", secret, "--"}, rankArgv(dir, id, r)...)
		ps[r] = startArgv(t, append(environ, "RANK="+strconv.Itoa(r), "WORLD_SIZE=2",
			"GAPTRACE_RUN_DIR="+filepath.Join(dir, "run"+strconv.Itoa(r))), argv...)
	}
	var nsPID [2]int
	for r := range 2 {
		nsPID[r] = truthPID(t, filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), 20, 2*time.Minute)
	}
	host1 := nsRank(t, ps[1], 1)
	t.Cleanup(func() { _ = syscall.Kill(host1, syscall.SIGCONT) })
	if err := syscall.Kill(host1, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := awaitHang(t, ps[0], filepath.Join(dir, "gaps0.jsonl"), hangAfter+60*time.Second, "rank 0 waits on rank 1 of the other pod",
		func(r *hang.Report) bool {
			return r.PID == uint32(nsPID[0]) && len(r.Missing) == 1 && r.Missing[0].Rank == 1 && r.Missing[0].Sidecar != ""
		})
	lat := checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	if m := r.Missing[0]; m.PID != uint32(nsPID[1]) || m.State != hang.StateStopped || !strings.Contains(m.Sidecar, "/rank1/") {
		t.Errorf("missing %+v, want rank 1 (pid %d in its namespace) of the rank-1 sidecar, stopped", m, nsPID[1])
	}
	t.Logf("pids in their namespaces %v; detected %v after the sync began (--hang-after %v): %s", nsPID, lat, hangAfter, r.Reason)
}
