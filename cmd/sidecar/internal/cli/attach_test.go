package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestAttachNoSuchPID(t *testing.T) {
	h := newHarness(t)
	pid := unusedPID(t)
	if code := h.main(context.Background(), "attach", "--pid", fmt.Sprint(pid)); code != ExitFailure {
		t.Errorf("exit %d, want 1", code)
	}
	if got, want := h.stderr.String(), fmt.Sprintf("gaptrace attach: no such process: pid %d\n", pid); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

func unusedPID(t *testing.T) int {
	for pid := 4_000_000; pid > 3_000_000; pid -= 7919 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return pid
		}
	}
	t.Fatal("no unused pid")
	return 0
}

func startSleep(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reap(t, cmd) })
	// Start returns when execve has closed the child's close-on-exec
	// descriptors, which it does before it lays out the new program's
	// arguments: on a loaded machine /proc/PID/cmdline is empty a while.
	path := fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && bytes.HasPrefix(b, []byte("sleep\x00")) {
			break
		}
	}
	return cmd
}

// reap kills cmd and waits for it. Wait's error is the kill's signal (or
// that an earlier reap already waited), so only a failed kill of a live
// process is a problem.
func reap(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("kill %d: %v", cmd.Process.Pid, err)
	}
	_ = cmd.Wait()
}

func TestAttachProcessExitsWhileAttaching(t *testing.T) {
	h := newHarness(t)
	cmd := startSleep(t, "30")
	inner := h.deps.NewPipeline
	h.deps.NewPipeline = func(ctx context.Context, pc PipelineConfig) (Pipeline, error) {
		// The target dies while probes load.
		reap(t, cmd)
		return inner(ctx, pc)
	}
	code := h.main(context.Background(), "attach", "--pid", fmt.Sprint(cmd.Process.Pid))
	if code != ExitFailure {
		t.Errorf("exit %d, want 1", code)
	}
	if got, want := h.stderr.String(), fmt.Sprintf("gaptrace attach: process %d exited while attaching\n", cmd.Process.Pid); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if h.pipe.closes != 1 {
		t.Errorf("pipeline closed %d times, want 1", h.pipe.closes)
	}
}

func TestAttachNoCUDALibrary(t *testing.T) {
	h := newHarness(t)
	cmd := startSleep(t, "30")
	code := h.main(context.Background(), "attach", "--live", "off", "--cuda-wait", "300ms", "--pid", fmt.Sprint(cmd.Process.Pid))
	if code != ExitFailure {
		t.Errorf("exit %d, want 1", code)
	}
	e := h.stderr.String()
	if !strings.Contains(e, "no CUDA library in the target") || !strings.Contains(e, "libcuda.so") {
		t.Errorf("stderr:\n%s", e)
	}
	if h.pipe.closes != 1 {
		t.Error("pipeline not closed")
	}
	if !strings.Contains(h.stdout.String(), "summary") {
		t.Error("no summary printed")
	}
}

func TestAttachUntilTargetExits(t *testing.T) {
	h := newHarness(t)
	cmd := startSleep(t, "0.5")
	code := h.main(context.Background(), "attach", "--live", "off", "--cuda-wait", "0", "--pid", fmt.Sprint(cmd.Process.Pid))
	if code != 0 {
		t.Errorf("exit %d: %s", code, h.stderr)
	}
	if got := h.pipe.tracedPIDs(); len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Errorf("traced %v", got)
	}
}

func TestAttachMatchFollowsRestarts(t *testing.T) {
	h := newHarness(t)
	// A duration nobody else on the machine sleeps for.
	arg := fmt.Sprintf("%d.%d", 100+os.Getpid()%800, time.Now().UnixNano()%1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- h.main(ctx, "attach", "--live", "off", "--match", `^sleep `+strings.ReplaceAll(arg, ".", `\.`)+`$`)
	}()
	waitTraced := func(pid int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			for _, p := range h.pipe.tracedPIDs() {
				if p == pid {
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("pid %d never traced (traced %v); stderr:\n%s", pid, h.pipe.tracedPIDs(), h.stderr)
	}
	first := startSleep(t, arg)
	waitTraced(first.Process.Pid)
	reap(t, first)
	second := startSleep(t, arg)
	waitTraced(second.Process.Pid)
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d: %s", code, h.stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("attach --match did not stop on cancel")
	}
	if got := h.pipe.tracedPIDs(); len(got) != 2 {
		t.Errorf("traced %v, want exactly the two processes", got)
	}
	if h.pipe.closes != 1 {
		t.Error("pipeline not closed")
	}
}
