package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPollLooksOnceMoreAtTheDeadline(t *testing.T) {
	calls := 0
	if Poll(-time.Second, time.Millisecond, func() bool { calls++; return calls == 2 }) {
		t.Error("a condition that holds on the second look held with no time to look twice")
	}
	calls = 0
	if !Poll(time.Minute, time.Millisecond, func() bool { calls++; return calls == 3 }) {
		t.Error("Poll gave up before the condition held")
	}
	if calls != 3 {
		t.Errorf("cond called %d times after it held on the 3rd", calls)
	}
}

func TestLockedBufferLimit(t *testing.T) {
	b := &LockedBuffer{Limit: 4}
	for _, s := range []string{"ab", "cde", "fgh"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v: a capped buffer must still accept everything", s, n, err)
		}
	}
	if got := b.String(); got != "abcde" {
		t.Errorf("kept %q, want the writes up to the one that crossed the cap", got)
	}
	var u LockedBuffer
	_, _ = u.Write([]byte(strings.Repeat("x", 1<<20)))
	if len(u.String()) != 1<<20 {
		t.Error("an uncapped buffer dropped data")
	}
}

func TestKillGroupKillsTheWholeGroup(t *testing.T) {
	// sh and its sleep child share the group sh leads.
	cmd := exec.Command("sh", "-c", "sleep 300 & echo $!; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var line [32]byte
	n, _ := out.Read(line[:])
	child := strings.TrimSpace(string(line[:n]))
	KillGroup(t, cmd.Process.Pid)
	_ = cmd.Wait() // the kill's status
	if !Poll(10*time.Second, 10*time.Millisecond, func() bool {
		b, err := os.ReadFile(filepath.Join("/proc", child, "stat"))
		return err != nil || strings.Contains(string(b), ") Z ")
	}) {
		t.Errorf("the group's sleep (pid %s) survived KillGroup", child)
	}
	// A group that is gone already is no error.
	KillGroup(t, cmd.Process.Pid)
}

func TestRunDelayFollowsAProcessWaitingForACPU(t *testing.T) {
	// Two busy loops pinned to one CPU: the scheduler shares it, so each
	// waits runnable about half the time, which schedstat records.
	var cpu0 unix.CPUSet
	cpu0.Set(0)
	var pids []int
	for range 2 {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := unix.SchedSetaffinity(cmd.Process.Pid, &cpu0); err != nil {
			t.Fatalf("pin to CPU 0: %v", err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	rd := TrackRunDelay(pids[0], 5*time.Millisecond)
	before := rd.Total()
	start := time.Now()
	time.Sleep(300 * time.Millisecond)
	waited := rd.Stop() - before
	elapsed := time.Since(start)
	t.Logf("waited %v for a CPU in %v", waited, elapsed)
	if waited < elapsed/5 {
		t.Errorf("a loop sharing its CPU with another waited %v of %v runnable", waited, elapsed)
	}
	if _, err := ThreadRunDelay(pids[0], pids[0]); err != nil {
		t.Errorf("schedstat of the loop: %v", err)
	}
	if _, err := ThreadRunDelay(os.Getpid(), 1<<30); err == nil {
		t.Error("a thread that does not exist has a run delay")
	}
}

func TestRepoRootFindsTheModule(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "testutil", "testutil.go")); err != nil {
		t.Errorf("RepoRoot %s is not this repository: %v", root, err)
	}
}
