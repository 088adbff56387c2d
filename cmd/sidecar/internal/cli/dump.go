package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/internal/safefile"
)

// On-demand dumps. A tracing session listens on a unix socket in its run
// directory, gaptrace-PID.sock: a connection from the same user (or root),
// checked by the kernel's peer credentials, gets a JSON document of every
// traced thread's in-flight call and its native and Python stacks, and
// the socket is closed. The directory is 0700 and the socket 0600, so the
// file permissions keep other users out before the credentials are even
// read. SIGUSR1 to the session writes the same document into the run
// directory and logs its path.

// RunDirEnv overrides where sessions put their dump sockets.
const RunDirEnv = "GAPTRACE_RUN_DIR"

// dumpTimeout bounds one dump (stacks of every thread of every process).
const dumpTimeout = 30 * time.Second

// runDir is where sessions put their sockets: $GAPTRACE_RUN_DIR, else
// /run/gaptrace for root, else $XDG_RUNTIME_DIR/gaptrace, else
// $TMPDIR/gaptrace-UID.
func runDir(getenv func(string) string) string {
	if d := getenv(RunDirEnv); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/run/gaptrace"
	}
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "gaptrace")
	}
	return filepath.Join(os.TempDir(), "gaptrace-"+strconv.Itoa(os.Geteuid()))
}

// privateDir makes dir (0700) or checks that the existing one is ours and
// closed to others.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("%s must be a directory of uid %d with mode 0700 (it is uid %d, mode %o)", dir, os.Geteuid(), st.Uid, st.Mode&0o777)
	}
	return nil
}

type dumpServer struct {
	d    Dumper
	dir  string
	path string
	ln   *net.UnixListener
	log  *slog.Logger
	sig  chan os.Signal
	done chan struct{}
	once sync.Once
}

// startDump serves dumps for the session until stop. A failure is said
// and tracing goes on without it.
func startDump(d Dumper, getenv func(string) string, log *slog.Logger) *dumpServer {
	dir := runDir(getenv)
	if err := privateDir(dir); err != nil {
		log.Warn("gaptrace dump unavailable: run directory", "dir", dir, "err", err)
		return nil
	}
	path := filepath.Join(dir, fmt.Sprintf("gaptrace-%d.sock", os.Getpid()))
	_ = os.Remove(path) // a previous session of the same pid left it
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		log.Warn("gaptrace dump unavailable: socket", "path", path, "err", err)
		return nil
	}
	ln.SetUnlinkOnClose(true)
	s := &dumpServer{d: d, dir: dir, path: path, ln: ln, log: log, sig: make(chan os.Signal, 1), done: make(chan struct{})}
	signal.Notify(s.sig, syscall.SIGUSR1)
	go s.serve()
	go s.signals()
	log.Debug("dump socket", "path", path)
	return s
}

func (s *dumpServer) serve() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.answer(c)
	}
}

// answer sends one dump to a client of the same user or root.
func (s *dumpServer) answer(c *net.UnixConn) {
	defer func() { _ = c.Close() }() // the client reads to EOF
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		s.log.Warn("dump refused: another user", "uid", cred.Uid, "pid", cred.Pid)
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(dumpTimeout))
	b, err := s.d.Dump()
	if err != nil {
		b = []byte(fmt.Sprintf("{\"error\":%q}\n", err.Error()))
	}
	if _, err := c.Write(b); err != nil {
		s.log.Warn("dump not sent", "err", err)
	}
}

// signals writes a dump file on each SIGUSR1.
func (s *dumpServer) signals() {
	for {
		select {
		case <-s.done:
			return
		case <-s.sig:
			b, err := s.d.Dump()
			if err != nil {
				s.log.Error("dump failed", "err", err)
				continue
			}
			path := filepath.Join(s.dir, fmt.Sprintf("dump-%d-%s.json", os.Getpid(), time.Now().UTC().Format("20060102T150405.000")))
			if err := safefile.WriteAtomic(path, b); err != nil {
				s.log.Error("dump not written", "path", path, "err", err)
				continue
			}
			s.log.Warn("dump written (SIGUSR1)", "path", path, "bytes", len(b))
		}
	}
}

func (s *dumpServer) stop() {
	if s == nil {
		return
	}
	s.once.Do(func() {
		signal.Stop(s.sig)
		close(s.done)
		_ = s.ln.Close() // unlinks the socket
	})
}

// dumpCmd is `gaptrace dump`: ask a running session for its dump.
func dumpCmd(ctx context.Context, args []string, deps Deps) int {
	fs := flag.NewFlagSet("gaptrace dump", flag.ContinueOnError)
	fs.SetOutput(deps.Stderr)
	pid := fs.Int("pid", 0, "the gaptrace `PID` to ask (needed when several run)")
	out := fs.String("out", "", "write the dump to `FILE` instead of stdout")
	dir := fs.String("run-dir", "", "where sessions put their sockets (default $"+RunDirEnv+", /run/gaptrace for root)")
	fs.Usage = func() {
		fmt.Fprint(deps.Stderr, "Usage: gaptrace dump [--pid PID] [--out FILE]\n\n"+
			"Ask a running gaptrace for every traced thread's in-flight call and its native and\n"+
			"Python stacks, now (a job that looks stuck below --hang-after). SIGUSR1 to gaptrace\n"+
			"writes the same into its run directory.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if fs.NArg() > 0 {
		return fail(deps, "dump", "unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *pid < 0 {
		return fail(deps, "dump", "--pid %d: want a process id", *pid)
	}
	d := *dir
	if d == "" {
		d = runDir(deps.Getenv)
	}
	sock, err := pickSocket(d, *pid)
	if err != nil {
		return fail(deps, "dump", "%v", err)
	}
	b, err := fetchDump(ctx, sock)
	if err != nil {
		return fail(deps, "dump", "%s: %v", sock, err)
	}
	if *out == "" {
		_, _ = deps.Stdout.Write(b)
		return ExitOK
	}
	if err := safefile.WriteAtomic(*out, b); err != nil {
		return fail(deps, "dump", "%v", err)
	}
	fmt.Fprintf(deps.Stderr, "dump written to %s (%d bytes)\n", *out, len(b))
	return ExitOK
}

// pickSocket finds the session to ask: the one of pid, or the only one.
func pickSocket(dir string, pid int) (string, error) {
	if pid > 0 {
		p := filepath.Join(dir, fmt.Sprintf("gaptrace-%d.sock", pid))
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("no gaptrace session of pid %d here: %w", pid, err)
		}
		return p, nil
	}
	socks, _ := filepath.Glob(filepath.Join(dir, "gaptrace-*.sock"))
	var live []string
	for _, s := range socks {
		n := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(s), "gaptrace-"), ".sock")
		if p, err := strconv.Atoi(n); err == nil && unix.Kill(p, 0) == nil {
			live = append(live, s)
		}
	}
	slices.Sort(live)
	switch len(live) {
	case 0:
		return "", fmt.Errorf("no running gaptrace session found in %s (run this as the user that runs gaptrace, or pass --run-dir)", dir)
	case 1:
		return live[0], nil
	}
	return "", fmt.Errorf("%d gaptrace sessions run (%s): pick one with --pid", len(live), strings.Join(live, ", "))
}

func fetchDump(ctx context.Context, sock string) ([]byte, error) {
	var dl net.Dialer
	ctx, cancel := context.WithTimeout(ctx, dumpTimeout+5*time.Second)
	defer cancel()
	c, err := dl.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }() // read-only
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("the session sent nothing (refused: another user?)")
	}
	return b, nil
}
