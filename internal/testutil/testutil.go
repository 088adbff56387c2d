// Package testutil holds what gaptrace's test tiers share: locating or
// building the gaptrace binary and the simulated GPU (testdata/simgpu),
// the rule that decides whether a privileged tier runs, polling with a
// deadline, a buffer a child process may write while the test reads it,
// and killing a child's process group.
//
// Tiers: `go test -short ./...` (make unit) is the quick tier: no root, no
// Jaeger, no simulated GPU build. Privileged and Jaeger tests call
// NeedRoot or SkipShort and skip there with the reason; `make test` runs
// every tier.
package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

const modulePath = "github.com/gaptrace/gaptrace"

// SkipShort skips t under -short (make unit), saying which tier it belongs
// to: tier is what the test needs, e.g. "Jaeger" or "the simulated GPU
// build".
func SkipShort(t testing.TB, tier string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: needs %s (make test runs it)", tier)
	}
}

// NeedRoot skips t under -short and when not root: why says what root is
// for ("loads BPF programs").
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	SkipShort(t, "root: it "+why)
	if os.Geteuid() != 0 {
		t.Skipf("needs root: it %s (make test runs as root)", why)
	}
}

// RepoRoot walks up from the working directory to gaptrace's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// SimFiles are the simulated GPU's files the tiers run.
var SimFiles = []string{"simtrain", "libcuda.so.1", "libnccl.so.2", "libnvidia-ml.so.1"}

// scratch holds what this test process built; Main removes it.
var (
	scratchOnce sync.Once
	scratchDir  string
	scratchErr  error

	simOnce sync.Once
	simDir  string
	simErr  error

	binOnce sync.Once
	binPath string
	binErr  error
)

func scratch() (string, error) {
	scratchOnce.Do(func() {
		scratchDir, scratchErr = os.MkdirTemp("", "gaptrace-test-")
	})
	return scratchDir, scratchErr
}

// Main runs the tests and removes what SimGPU and Gaptrace built for them.
// Packages that call either use it as their TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if scratchDir != "" {
		_ = os.RemoveAll(scratchDir) // best effort: a temp dir
	}
	os.Exit(code)
}

// SimGPU returns a directory with simtrain and the simulated libcuda,
// libnccl and libnvidia-ml: $GAPTRACE_SIMGPU (make test sets it) or one
// build per test process with testdata/simgpu's Makefile. It skips under
// -short and fails t when the directory lacks a file or the build fails.
func SimGPU(t testing.TB) string {
	t.Helper()
	SkipShort(t, "the simulated GPU build")
	simOnce.Do(func() { simDir, simErr = locateSimGPU() })
	if simErr != nil {
		t.Fatal(simErr)
	}
	return simDir
}

func locateSimGPU() (string, error) {
	dir, err := locate("GAPTRACE_SIMGPU", "simgpu", "the simulated GPU (make simgpu)", func(root, dst string) *exec.Cmd {
		return exec.Command("make", "-s", "-C", filepath.Join(root, "testdata", "simgpu"), "OUT="+dst)
	})
	if err != nil {
		return "", err
	}
	for _, f := range SimFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("simulated GPU: %w (run `make simgpu` or set GAPTRACE_SIMGPU)", err)
		}
	}
	return dir, nil
}

// locate returns the absolute path that environment variable env names or,
// when it is unset, builds name into the scratch directory with the
// command build gives for the repository root and the destination.
func locate(env, name, what string, build func(root, dst string) *exec.Cmd) (string, error) {
	p := os.Getenv(env)
	if p == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		tmp, err := scratch()
		if err != nil {
			return "", fmt.Errorf("scratch directory: %w", err)
		}
		p = filepath.Join(tmp, name)
		cmd := build(root, p)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build %s: %w\n%s", what, err, out)
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return abs, nil
}

// Gaptrace returns the gaptrace binary: $GAPTRACE_BIN (make test sets it)
// or one `go build ./cmd/sidecar` per test process. The path is absolute:
// tests run it in scratch directories.
func Gaptrace(t testing.TB) string {
	t.Helper()
	SkipShort(t, "the gaptrace binary")
	binOnce.Do(func() { binPath, binErr = locateGaptrace() })
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func locateGaptrace() (string, error) {
	p, err := locate("GAPTRACE_BIN", "gaptrace", "gaptrace (make build)", func(_, dst string) *exec.Cmd {
		return exec.Command("go", "build", "-o", dst, "./cmd/sidecar")
	})
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("gaptrace binary: %w (run `make build` or set GAPTRACE_BIN)", err)
	}
	return p, nil
}

// ErrNoTool says that a built tool (Jaeger, the gateway) was neither named
// by its environment variable nor found under build/.
var ErrNoTool = errors.New("tool binary missing")

// ToolBinary returns a tool that `make NAME` builds into build/NAME: the
// path environment variable env names, which must exist, or build/NAME
// under the repository root. When neither exists the error wraps
// ErrNoTool and says how to get it (how: the make target's description).
func ToolBinary(env, name, how string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w (run `make %s`)", env, p, err, name)
		}
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "build", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %s: run `make %s` (%s) or set %s", ErrNoTool, p, name, how, env)
	}
	return p, nil
}

// Poll calls cond every interval until it holds or timeout passes, and
// reports whether it held. cond runs at least once, and once more at the
// deadline, so a slow machine that let the deadline pass during a sleep
// still gets its last look.
func Poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// WaitFor polls cond every 10 ms and fails t when it does not hold within
// timeout; what names the awaited state in the failure.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, 10*time.Millisecond, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// LockedBuffer collects what a child process writes (its stdout, a pty)
// while the test reads it. Limit, when positive, caps what is kept: later
// writes are accepted and dropped, so a chatty child never blocks.
type LockedBuffer struct {
	Limit int

	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Limit > 0 && l.b.Len() > l.Limit {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// KillGroup sends SIGKILL to the process group led by pid; a group that is
// already gone is what the kill wanted.
func KillGroup(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill process group %d: %v", pid, err)
	}
}

// FreePorts reserves n distinct loopback ports by binding them at once and
// releasing them just before the caller's server binds them; another
// process could take one in between, which that server's start then
// reports.
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve a loopback port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
