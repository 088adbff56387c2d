package main_test

import (
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// copyTerminal copies what gaptrace writes to its terminal into out. The
// pty's master reads EIO once every holder of the slave has exited: that
// is the end of the output, not a failure.
func copyTerminal(out *testutil.LockedBuffer, master io.Reader) {
	_, _ = io.Copy(out, master)
}

// onTerminal starts argv as the leader of a new session whose controlling
// terminal is a fresh pty (rows×120, or the default size for rows 0), as a
// user's shell is. It returns the command and what the terminal shows,
// read until the pty closes (copied is closed then); the session is killed
// at the end of the test.
func onTerminal(t *testing.T, rows uint16, argv ...string) (*exec.Cmd, *testutil.LockedBuffer, <-chan struct{}) {
	t.Helper()
	master, slave, err := proc.OpenPTY(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = master.Close() })
	if rows > 0 {
		if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: 120}); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = t.TempDir()
	cmd.Env = env(t)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = slave.Close() // the session holds it
	out := &testutil.LockedBuffer{}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		copyTerminal(out, master)
	}()
	t.Cleanup(func() { testutil.KillGroup(t, cmd.Process.Pid) })
	return cmd, out, copied
}

// TestTerminalCtrlC types Ctrl-C on a real (pseudo) terminal: the kernel
// sends SIGINT to the whole foreground process group, so gaptrace must not
// forward a second one to the trainer.
func TestTerminalCtrlC(t *testing.T) {
	need(t)
	// A new session with the pty as its controlling terminal: gaptrace's
	// group is the terminal's foreground group, as in an interactive shell.
	cmd, out, copied := onTerminal(t, 0, append([]string{gaptraceBin, "run", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--"},
		simtrain("--steps", "100000", "--quiet")...)...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for !attached.MatchString(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("never attached:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// What the terminal does on Ctrl-C.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !exitStatusOnly(err) {
			t.Fatalf("wait for gaptrace: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("gaptrace did not exit after Ctrl-C:\n%s", out.String())
	}
	// The copy ends when the last holder of the terminal exits; on a busy
	// machine that can be a while after gaptrace's own exit.
	select {
	case <-copied:
	case <-time.After(time.Minute):
		t.Error("terminal output still open a minute after gaptrace exited")
	}
	o := out.String()
	if !strings.Contains(o, "forwarded=false") {
		t.Errorf("SIGINT from the terminal was forwarded again (or not logged):\n%s", o)
	}
	if !strings.Contains(o, "summary") {
		t.Errorf("no summary after Ctrl-C:\n%s", o)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 && code != 130 {
		t.Errorf("exit %d, want the trainer's (0 or 130)", code)
	}
}
