package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/correlate"
)

var flagErrHelp = flag.ErrHelp

func runCmd(ctx context.Context, args []string, deps Deps) int {
	cfg, code, ok := load(config.CmdRun, args, deps)
	if !ok {
		return code
	}
	if code, err := findCommand(cfg.Argv[0]); err != nil {
		// Before anything loads: probes for a command that cannot start
		// are seconds wasted.
		fmt.Fprintf(deps.Stderr, "gaptrace run: %v\n", err)
		return code
	}
	out := newOutput(&cfg, deps)
	if err := deps.Privileged(); err != nil {
		return fail(deps, config.CmdRun, "cannot trace: %v", err)
	}
	return runSession(ctx, &cfg, deps, out, cfg.Argv, childEnv(deps.Environ()), nil)
}

type exitResult struct {
	code int
	err  error
}

// runSession starts argv held at its first instruction, traces it, lets it
// run and returns its exit code. When sum is not nil it receives the
// session's summary once tracing stopped.
//
// Signals: the command shares gaptrace's process group, so a Ctrl-C typed
// on the terminal already reaches it; forwarding SIGINT as well would
// deliver it twice (a second KeyboardInterrupt inside PyTorch's cleanup).
// So SIGINT is forwarded only when gaptrace is not the terminal's
// foreground group (someone ran kill -INT on gaptrace); SIGTERM is always
// forwarded, since nothing else delivers it to the command. Either way
// tracing continues until the command exits, so its shutdown is traced
// too; a second signal stops tracing at once and leaves without waiting.
func runSession(ctx context.Context, cfg *config.Config, deps Deps, out output, argv, env []string, sum *correlate.Summary) int {
	cmd := cfg.Command
	log := out.log.With("component", "cli")
	self, err := deps.Executable()
	if err != nil {
		return fail(deps, cmd, "find own executable: %v", err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	// The pipeline comes first: loading probes takes time and may fail,
	// and a command must never run untraced because of it.
	s, err := openSession(ctx, cfg, deps, out, 0, argv)
	if err != nil {
		return fail(deps, cmd, "%v", err)
	}
	// The command writes to gaptrace's own stdout and stderr, the
	// terminal itself when there is one: nothing of gaptrace sits between
	// them, so the command's output survives gaptrace's death. The live
	// view keeps to the rows it fenced off (live.Terminal).
	child, err := proc.StartHeld(self, argv, env)
	if err != nil {
		s.abort()
		return fail(deps, cmd, "%v", err)
	}
	pid := child.PID()
	if err := s.pipe.Trace(pid); err != nil {
		child.Abort()
		s.abort()
		return fail(deps, cmd, "trace pid %d: %v", pid, err)
	}
	s.title = fmt.Sprintf("pid %d %s", pid, shortCmd(s.cmdline))
	s.start(ctx)
	if err := child.Release(); err != nil {
		child.Abort()
		s.finish() //nolint:errcheck // the release error is the one to report
		return fail(deps, cmd, "%v", err)
	}
	log.Debug("command started under tracing", "pid", pid, "argv", s.cmdline)

	exited := make(chan exitResult, 1)
	go func() {
		code, err := child.Wait()
		exited <- exitResult{code, err}
	}()
	var durC <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		durC = t.C
	}
	tracing, signals := true, 0
	var finishErr error
	stop := func() {
		if tracing {
			tracing = false
			if err := s.finish(); err != nil {
				log.Warn("tracing did not stop cleanly", "err", err)
				finishErr = err
			}
			if sum != nil {
				*sum = s.sum
			}
		}
	}
	for {
		select {
		case r := <-exited:
			stop()
			if r.err != nil {
				log.Warn("wait for command", "err", r.err)
			}
			return runExitCode(r.code, finishErr)
		case <-durC:
			log.Info("tracing stopped after --duration; the command keeps running", "duration", cfg.Duration, "pid", pid)
			stop()
		case sig := <-sigs:
			signals++
			forward := sig != syscall.SIGINT || !proc.ForegroundOfTTY()
			if forward {
				child.Cmd.Process.Signal(sig) //nolint:errcheck // it may have exited already
			}
			if signals == 1 && tracing {
				log.Info("waiting for the command to exit (signal again to stop tracing now)", "signal", sig, "forwarded", forward, "pid", pid)
				continue
			}
			stop()
			return 128 + int(sig.(syscall.Signal))
		}
	}
}

// abort closes a session that never started tracing, without a summary.
func (s *session) abort() {
	if s.closed {
		return
	}
	s.closed = true
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.pipe.Close(cctx, time.Time{}); err != nil { // no job ran: nothing waits for gaptrace's exit
		s.log.Warn("close pipeline", "err", err)
	}
	if s.gaps != nil {
		_ = s.gaps.Close() // nothing was traced
	}
	if s.trace != nil {
		s.trace.Abort() // nothing was traced
	}
}

// shortCmd is a command line for titles and log lines: the program's base
// name and as many arguments as fit. argv is already redacted.
func shortCmd(argv []string) string { return cmdText(argv, 60) }

// checkCmdWidth bounds the command line check prints.
const checkCmdWidth = 400

// cmdText joins a redacted argv, the program by its base name, cut to
// width runes.
func cmdText(argv []string, width int) string {
	if len(argv) > 0 {
		argv = append([]string{filepath.Base(argv[0])}, argv[1:]...)
	}
	s := strings.Join(argv, " ")
	if r := []rune(s); len(r) > width {
		s = string(r[:width-1]) + "…"
	}
	return s
}

var errExitedWhileAttaching = errors.New("exited while attaching")
