// Package proc is what gaptrace knows about processes: starting a command
// held at its first instruction until the tracer is attached, waiting for a
// process to exit, finding processes by command line, the libraries a
// process has mapped, and the capabilities of gaptrace itself. It reads
// /proc directly and keeps no state between calls.
package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/internal/hostproc"
)

// ExecHelperArg is the hidden argument under which gaptrace re-executes
// itself to start a traced command. The helper blocks on a pipe until the
// parent has registered its PID with the tracer, then execve's the command,
// so the command runs under tracing from its first instruction with the
// same PID.
const ExecHelperArg = "__exec"

// releaseFD is the pipe's read end in the helper (ExtraFiles[0]).
const releaseFD = 3

// The helper must execve from its main thread. Probes attached with a PID
// filter are bound to the thread-group leader the kernel found for that PID
// when they were attached; an execve from any other thread makes that
// thread the new leader and retires the old one (de_thread), and the
// probes, still bound to the retired task, never fire in the new program.
// A Go goroutine that blocks (here, on the release pipe) may resume on any
// thread, so the helper locks its main goroutine to the main thread before
// main runs: LockOSThread in an init function does that.
func init() {
	if len(os.Args) > 1 && os.Args[1] == ExecHelperArg {
		runtime.LockOSThread()
	}
}

// errNotLeader: the helper is about to execve from a thread other than its
// process's main one.
var errNotLeader = errors.New("exec helper is not on its main thread: the command would run unseen by the probes")

// ExecHelper is the body of "gaptrace __exec -- CMD ARGS...". It never
// returns on success. If the parent dies before releasing the helper, the
// pipe reads EOF and the helper exits 125 without running the command:
// a command that would run untraced is not what the user asked for. For
// the same reason it refuses to execve from any thread but the main one
// (see init).
func ExecHelper(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "gaptrace: internal exec helper started without a command")
		return 125
	}
	f := os.NewFile(releaseFD, "release")
	var b [1]byte
	n, _ := f.Read(b[:])
	f.Close()
	if n != 1 {
		return 125
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "gaptrace: %v\n", err)
		return 127
	}
	if unix.Gettid() != unix.Getpid() {
		fmt.Fprintf(os.Stderr, "gaptrace: %v\n", errNotLeader)
		return 125
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "gaptrace: exec %s: %v\n", path, err)
	return 126
}

// Child is a command started by StartHeld.
type Child struct {
	Cmd     *exec.Cmd
	release *os.File
}

// PID returns the child's process ID (also the command's after release).
func (c *Child) PID() int { return c.Cmd.Process.Pid }

// StartHeld starts argv through the exec helper of the binary self and
// returns once the helper runs and waits to be released. The child shares
// gaptrace's stdio and process group, so a terminal's Ctrl-C reaches it
// directly, exactly as if gaptrace were not there.
// Nothing of gaptrace sits between the child and the terminal, so the child
// outlives gaptrace with its output intact.
func StartHeld(self string, argv []string, env []string) (*Child, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command")
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, fmt.Errorf("command %q: %w", argv[0], err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("release pipe: %w", err)
	}
	cmd := exec.Command(self, append([]string{ExecHelperArg, "--"}, argv...)...)
	cmd.Args[0] = argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{r}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	r.Close()
	return &Child{Cmd: cmd, release: w}, nil
}

// Release lets the held command exec.
func (c *Child) Release() error {
	defer c.release.Close()
	if _, err := c.release.Write([]byte{1}); err != nil {
		return fmt.Errorf("release command: %w", err)
	}
	return nil
}

// Abort closes the pipe without releasing: the helper exits 125 without
// running the command.
func (c *Child) Abort() {
	c.release.Close()
	c.Cmd.Wait() //nolint:errcheck // exit status of an aborted helper is meaningless
}

// Wait waits for the command and returns its exit code the way a shell
// reports it: the exit status, or 128+signal when it was killed.
func (c *Child) Wait() (int, error) {
	err := c.Cmd.Wait()
	return ExitCode(c.Cmd.ProcessState, err)
}

// ExitCode maps a finished process to a shell-style exit code.
func ExitCode(ps *os.ProcessState, err error) (int, error) {
	if ps == nil {
		return 1, err
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ps.ExitCode(), nil
}

// ErrNoProcess says a PID names no process.
var ErrNoProcess = errors.New("no such process")

// Exists reports whether pid names a live (non-zombie) process.
func Exists(pid int) bool {
	st, err := State(pid)
	return err == nil && st != 'Z' && st != 'X'
}

// State returns the one-letter state of pid from /proc/PID/stat.
func State(pid int) (byte, error) {
	st, err := stat(pid)
	if err != nil {
		return 0, err
	}
	if st.State == "" {
		return 0, fmt.Errorf("pid %d: malformed stat", pid)
	}
	return st.State[0], nil
}

// PPID returns the parent of pid.
func PPID(pid int) (int, error) {
	st, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return st.PPID, nil
}

func stat(pid int) (procfs.ProcStat, error) {
	p, err := procfs.NewProc(pid)
	if err == nil {
		var st procfs.ProcStat
		if st, err = p.Stat(); err == nil {
			return st, nil
		}
	}
	if errors.Is(err, os.ErrNotExist) {
		return procfs.ProcStat{}, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	return procfs.ProcStat{}, err
}

// Comm returns the name of pid's thread tid (/proc/PID/task/TID/comm; the
// process's own name when tid is pid), "" once it is gone.
func Comm(pid, tid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(tid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Cmdline returns the command line of pid, arguments joined by spaces:
// for matching only. What is shown of it starts from Argv, since joining
// loses where one argument ends ("Authorization: Bearer x" is one).
func Cmdline(pid int) (string, error) {
	args, err := Argv(pid)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(strings.Join(args, " ")), nil
}

// Argv returns the arguments of pid as /proc/PID/cmdline separates them.
func Argv(pid int) ([]string, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil, err
	}
	return p.CmdLine()
}

// PIDs lists every process ID in /proc.
func PIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// Descendants returns pid's descendants (not pid itself); the tracer finds
// the processes it traces with the same walk.
func Descendants(pids ...int) []int { return hostproc.Descendants(pids...) }

// Ancestors returns pid's ancestors up to init.
func Ancestors(pid int) []int {
	var out []int
	for p := pid; p > 1; {
		pp, err := PPID(p)
		if err != nil || pp <= 0 {
			break
		}
		out = append(out, pp)
		p = pp
	}
	return out
}

// FindMatching returns the processes whose command line matches re, oldest
// PID order, leaving out gaptrace itself, its ancestors (a shell whose
// command line holds the regex) and kernel threads (empty cmdline).
func FindMatching(re *regexp.Regexp) []int {
	self := os.Getpid()
	skip := append(Ancestors(self), self)
	var out []int
	for _, p := range PIDs() {
		if slices.Contains(skip, p) {
			continue
		}
		cl, err := Cmdline(p)
		if err != nil || cl == "" || !re.MatchString(cl) {
			continue
		}
		if !Exists(p) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// Watch is a handle on one process that survives PID reuse: it is backed
// by a pidfd, so Exited never confuses a new process with the old one.
type Watch struct {
	pid int
	fd  int
}

// Open returns a Watch on pid, or an error wrapping ErrNoProcess.
func Open(pid int) (*Watch, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	if !Exists(pid) {
		unix.Close(fd)
		return nil, fmt.Errorf("pid %d: %w (zombie)", pid, ErrNoProcess)
	}
	return &Watch{pid: pid, fd: fd}, nil
}

// PID returns the watched process ID.
func (w *Watch) PID() int { return w.pid }

// Exited reports whether the process has exited (a pidfd becomes readable
// on exit). A zombie counts as exited.
func (w *Watch) Exited() bool {
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// Wait blocks until the process exits or ctx ends; it reports whether the
// process exited.
func (w *Watch) Wait(ctx context.Context) bool {
	for {
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 200)
		if err == nil && n > 0 {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			// A pidfd that cannot be polled is a bug elsewhere; fall back
			// to /proc so the caller still learns about the exit.
			if !Exists(w.pid) {
				return true
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// Close releases the pidfd.
func (w *Watch) Close() error { return unix.Close(w.fd) }

// Libraries returns the paths of mapped files of pid whose base name
// starts with one of prefixes (e.g. "libcuda.so", "libnccl.so").
func Libraries(pid int, prefixes ...string) (map[string][]string, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, err
	}
	maps, err := p.ProcMaps()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, err
	}
	found := map[string][]string{}
	for _, m := range maps {
		if m.Pathname == "" {
			continue
		}
		base := filepath.Base(m.Pathname)
		for _, pre := range prefixes {
			if strings.HasPrefix(base, pre) && !slices.Contains(found[pre], m.Pathname) {
				found[pre] = append(found[pre], m.Pathname)
			}
		}
	}
	return found, nil
}

// Capabilities: one check, shared with the tracer (internal/hostproc).
const (
	CapSysAdmin    = hostproc.CapSysAdmin
	CapSysPtrace   = hostproc.CapSysPtrace
	CapSysResource = hostproc.CapSysResource
	CapPerfmon     = hostproc.CapPerfmon
	CapBPF         = hostproc.CapBPF
)

// CapNames names the capabilities above for messages.
var CapNames = hostproc.CapNames

// Caps is a capability set.
type Caps = hostproc.Caps

// EffectiveCaps reads the effective capability set of this process.
func EffectiveCaps() (Caps, error) { return hostproc.EffectiveCaps() }

// MissingTracingCaps returns the capabilities gaptrace lacks to load BPF
// programs and attach probes, plus CAP_SYS_PTRACE (see hostproc).
func MissingTracingCaps(c Caps) []string { return hostproc.MissingTracingCaps(c) }

// OpenPTY opens a pseudo-terminal pair whose size is that of the terminal
// on fd sizeFrom (when it is one). Tests use it to run gaptrace on a
// terminal, as a user does.
func OpenPTY(sizeFrom int) (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	fail := func(what string, err error) (*os.File, *os.File, error) {
		m.Close()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock pty", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		return fail("pty number", err)
	}
	sl, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return fail("open pty slave", err)
	}
	if ws, err := unix.IoctlGetWinsize(sizeFrom, unix.TIOCGWINSZ); err == nil {
		unix.IoctlSetWinsize(int(sl.Fd()), unix.TIOCSWINSZ, ws) //nolint:errcheck // a default size is fine
	}
	return m, sl, nil
}

// ForegroundOfTTY reports whether this process's group is the foreground
// group of the terminal on stdin — then a Ctrl-C typed there reaches every
// member of the group, the traced command included.
func ForegroundOfTTY() bool {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	if err != nil {
		return false
	}
	return pgrp == unix.Getpgrp()
}
