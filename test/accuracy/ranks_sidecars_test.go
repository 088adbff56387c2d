package accuracy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// runSidecars runs each rank of the job under a gaptrace of its own, the
// two exchanging through --peers on a free local port, and merges their
// gaps and spans files into gaps.jsonl and spans.jsonl; it returns both
// logs. attach: the ranks run on their own for a second, then each
// gaptrace attaches to its rank.
func runSidecars(ctx context.Context, t *testing.T, bin, dir string, env []string, job string, ranks [2]string,
	outsOf func(string) []string, attach, pidns bool) string {
	t.Helper()
	var jobs [2]*exec.Cmd
	if attach {
		for r := range jobs {
			j := exec.CommandContext(ctx, "sh", "-c", ranks[r])
			j.Dir, j.Env = dir, env
			j.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
			if err := j.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = syscall.Kill(-j.Process.Pid, syscall.SIGKILL)
				_ = j.Wait()
			}()
			if err := raisePriority(j.Process.Pid); err != nil {
				t.Fatal(err)
			}
			jobs[r] = j
		}
		time.Sleep(time.Second)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	secret := peersSecret(t)
	var cmds [2]*exec.Cmd
	var outs [2]testutil.LockedBuffer
	var lines []string
	for r := range cmds {
		args := append(append([]string{"run"}, outsOf(fmt.Sprint(r))...),
			"--job-id", job, "--rank", fmt.Sprint(r), "--peers", addr, "--peers-secret-file", secret, "--", "sh", "-c", ranks[r])
		if attach {
			args = append(append([]string{"attach", "--pid", fmt.Sprint(jobs[r].Process.Pid)}, outsOf(fmt.Sprint(r))...),
				"--job-id", job, "--rank", fmt.Sprint(r), "--peers", addr, "--peers-secret-file", secret)
		}
		argv := append([]string{bin}, args...)
		if pidns {
			argv = append([]string{"unshare", "--pid", "--fork", "--mount-proc"}, argv...)
		}
		lines = append(lines, strings.Join(argv, " "))
		c := exec.CommandContext(ctx, argv[0], argv[1:]...)
		c.Dir, c.Env = dir, env
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		c.Stdout, c.Stderr = &outs[r], &outs[r]
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }()
		if err := raisePriority(c.Process.Pid); err != nil {
			t.Fatal(err)
		}
		cmds[r] = c
	}
	if err := os.WriteFile(filepath.Join(dir, "command"), []byte(strings.Join(lines, " &\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	for r, c := range cmds {
		err := c.Wait()
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("gaptrace%d.log", r)), []byte(outs[r].String()), 0o644)
		if err != nil {
			t.Errorf("gaptrace of rank %d: %v (log in %s)", r, err, dir)
		}
		logs.WriteString(outs[r].String())
	}
	for r, j := range jobs {
		if j != nil {
			if err := j.Wait(); err != nil {
				t.Errorf("rank %d: %v (%s)", r, err, dir)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, f := range []string{"gaps", "spans"} {
		var all []byte
		for r := range cmds {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s%d.jsonl", f, r)))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, b...)
		}
		if err := os.WriteFile(filepath.Join(dir, f+".jsonl"), all, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return logs.String()
}

// TestRanksSidecarKilled: of two sidecars exchanging through --peers, the
// one serving the address is killed with SIGKILL mid-run. Its rank's job
// runs on to the end untraced; the other sidecar takes the address over
// (same host), keeps tracing its rank and exits cleanly when the job ends.
func TestRanksSidecarKilled(t *testing.T) {
	s := need(t)
	dir := filepath.Join(s.root, accuracyOutRoot, "ranks", "sidecar-killed")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	sim, tl := filepath.Join(dir, "simgpu"), filepath.Join(dir, "timeline")
	for _, d := range []string{sim, tl} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"simtrain", "libcuda.so.1", "libnccl.so.2", "libnvidia-ml.so.1"} {
		if err := copyFile(filepath.Join(s.sim, f), filepath.Join(sim, f)); err != nil {
			t.Fatal(err)
		}
	}
	id := fmt.Sprintf("sidecar-killed-%d", time.Now().UnixNano())
	const steps = 200
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	env := append(cleanEnv(), "SIMGPU_DIR="+tl, "SIMGPU_DEVICES=2")
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	var cmds [2]*exec.Cmd
	var outs [2]testutil.LockedBuffer
	for r := range cmds {
		stall := ""
		if r == 1 {
			stall = "--stall cpu:every=1:ms=30"
		}
		rank := fmt.Sprintf("%s --truth %s --rank %d --nranks 2 --device %d --steps %d --collectives 1 "+
			"--kernels-per-step 9 --kernel-us 1500 --launch-gap-us 20 --comm-id %s --workers 0 --quiet --await-probes 60 %s",
			filepath.Join(sim, "simtrain"), filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), r, r, steps, id, stall)
		c := exec.CommandContext(ctx, s.bin, "run", "--live", "off", "--log-level", "debug",
			"--gaps-out", filepath.Join(dir, fmt.Sprintf("gaps%d.jsonl", r)),
			"--spans-out", filepath.Join(dir, fmt.Sprintf("spans%d.jsonl", r)),
			"--nvml-lib", filepath.Join(sim, "libnvidia-ml.so.1"),
			"--job-id", id, "--rank", fmt.Sprint(r), "--peers", addr, "--peers-secret-file", peersSecret(t), "--", "sh", "-c", rank)
		c.Dir, c.Env = dir, env
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Stdout, c.Stderr = &outs[r], &outs[r]
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		// The whole group at the end: the killed sidecar's job included.
		defer func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }()
		cmds[r] = c
		if r == 0 {
			waitLog(t, &outs[0], "peer exchange: serving at", dir)
		}
	}
	waitLog(t, &outs[1], "peer exchange: joined hub at", dir)
	time.Sleep(2 * time.Second)
	// SIGKILL to the sidecar alone: its job is its child and runs on.
	if err := cmds[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmds[0].Wait()
	err = cmds[1].Wait()
	for r := range outs {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("gaptrace%d.log", r)), []byte(outs[r].String()), 0o644)
	}
	if err != nil {
		t.Fatalf("the surviving sidecar: %v (log in %s)", err, dir)
	}
	log := outs[1].String()
	if i, j := strings.Index(log, "peer exchange: lost hub"), strings.LastIndex(log, "peer exchange: serving at"); i < 0 || j < i {
		t.Errorf("rank 1's sidecar did not take the address over after the hub died (log in %s)", dir)
	}
	// Both ranks ran every step: the killed sidecar's rank too, which its
	// peer's collectives kept pace with.
	for r := range cmds {
		tr, err := ReadTruth(filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)))
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Steps) != steps {
			t.Errorf("rank %d ran %d of %d steps", r, len(tr.Steps), steps)
		}
	}
	gaps, err := ReadGaps(filepath.Join(dir, "gaps1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the surviving sidecar reported %d gaps", len(gaps))
}

// waitLog waits until out holds msg.
func waitLog(t *testing.T, out *testutil.LockedBuffer, msg, dir string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), msg); {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in a minute (%s):\n%s", msg, dir, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// peersSecret writes a secret for a job's --peers exchange (mode 0600)
// and returns its path.
func peersSecret(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "peers.secret")
	if err := os.WriteFile(path, []byte("accuracy-test-secret-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
