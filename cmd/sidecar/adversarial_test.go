package main_test

// The adversarial tier: gaptrace runs as root beside code it does not
// control. Each test plays the hostile side (a planted link, a file name
// made of terminal escapes, a secret on the command line, a collector that
// never answers) against the built binary and checks what the operator's
// system, terminal and telemetry receive.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runIn runs gaptrace in dir and returns its exit code and output.
func runIn(t *testing.T, dir string, environ []string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(gaptraceBin, args...)
	cmd.Dir, cmd.Env = dir, environ
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("gaptrace %v did not exit\n%s\n%s", args, &stdout, &stderr)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func victimFile(t *testing.T) string {
	t.Helper()
	v := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(v, []byte("not gaptrace's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return v
}

func assertUntouched(t *testing.T, victim string) {
	t.Helper()
	if b, err := os.ReadFile(victim); err != nil || string(b) != "not gaptrace's\n" {
		t.Errorf("a file gaptrace was never told to write changed: %q %v", b, err)
	}
}

// A symbolic link planted where an output goes must never be written
// through; gaptrace refuses before anything loads (exit 2), or, for the
// summary, replaces the link itself.
func TestPlantedSymlinksNeverWrittenThrough(t *testing.T) {
	need(t)
	victim := victimFile(t)
	for _, flag := range []string{"--gaps-out", "--spans-out", "--windows-out"} {
		dir := t.TempDir()
		link := filepath.Join(dir, "out.jsonl")
		os.Symlink(victim, link)
		code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", flag, link, "--", "true")
		if code != 2 || !strings.Contains(stderr, "symbolic link") {
			t.Errorf("%s through a symlink: exit %d, want 2 with a clear refusal\n%s", flag, code, stderr)
		}
	}
	// The default spans file, in the current directory.
	dir := t.TempDir()
	os.Symlink(victim, filepath.Join(dir, "gaptrace-spans.jsonl"))
	code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--", "true")
	if code != 2 || !strings.Contains(stderr, "symbolic link") || !strings.Contains(stderr, "--spans-out") {
		t.Errorf("default spans file through a symlink: exit %d, want 2 naming --spans-out\n%s", code, stderr)
	}
	assertUntouched(t, victim)

	// The summary: links at its name and at the old fixed temporary name.
	dir = t.TempDir()
	sum := filepath.Join(dir, "summary.json")
	os.Symlink(victim, sum)
	os.Symlink(victim, sum+".tmp")
	code, _, stderr = runIn(t, dir, env(t), "run", "--live", "off", "--summary-json", sum,
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--", "true")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	assertUntouched(t, victim)
	for _, p := range []string{sum, filepath.Join(dir, "spans.jsonl")} {
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o007 != 0 {
			t.Errorf("%s: %v %v, want a regular file not readable by others", p, st.Mode(), err)
		}
	}
}
