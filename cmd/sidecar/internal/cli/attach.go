package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
)

// How often /proc is scanned for new processes to trace: by command line,
// and by mapped libcuda (--gpu-procs).
const (
	matchPoll    = 500 * time.Millisecond
	gpuProcsPoll = 2 * time.Second
)

func attachCmd(ctx context.Context, args []string, deps Deps) int {
	cfg, code, ok := load(config.CmdAttach, args, deps)
	if !ok {
		return code
	}
	if cfg.PID != 0 && !cfg.Force {
		if err := wholeHost(cfg.PID); err != nil {
			fmt.Fprintf(deps.Stderr, "gaptrace attach: %v (add --force to trace it anyway)\n", err)
			return ExitUsage
		}
	}
	out := newOutput(&cfg, deps)
	if err := deps.Privileged(); err != nil {
		return fail(deps, config.CmdAttach, "cannot trace: %v", err)
	}
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	if cfg.PID != 0 {
		return attachPID(ctx, &cfg, deps, out)
	}
	return attachMatch(ctx, &cfg, deps, out)
}

// attachPID traces one process until it exits, a signal arrives or
// --duration elapses.
func attachPID(ctx context.Context, cfg *config.Config, deps Deps, out output) int {
	log := out.log.With("component", "cli")
	cmd, pid := cfg.Command, cfg.PID
	// A pidfd pins the process: if it exits while probes load, we learn it
	// instead of tracing whatever reuses the PID.
	w, err := proc.Open(pid)
	if err != nil {
		if errors.Is(err, proc.ErrNoProcess) {
			return fail(deps, cmd, "no such process: pid %d", pid)
		}
		return fail(deps, cmd, "%v", err)
	}
	defer w.Close()
	argv, _ := proc.Argv(pid)

	s, err := openSession(ctx, cfg, deps, out, pid, argv)
	if err != nil {
		return fail(deps, cmd, "%v", err)
	}
	if w.Exited() {
		s.abort()
		return fail(deps, cmd, "process %d %v", pid, errExitedWhileAttaching)
	}
	if err := s.pipe.Trace(pid); err != nil {
		s.abort()
		if w.Exited() {
			return fail(deps, cmd, "process %d %v", pid, errExitedWhileAttaching)
		}
		return fail(deps, cmd, "trace pid %d: %v", pid, err)
	}
	if w.Exited() {
		s.abort()
		return fail(deps, cmd, "process %d %v", pid, errExitedWhileAttaching)
	}
	s.title = fmt.Sprintf("pid %d %s", pid, shortCmd(s.cmdline))
	log.Info("tracing", "pid", pid, "cmdline", shortCmd(s.cmdline))
	s.start(ctx)

	exited := make(chan struct{})
	go func() {
		if w.Wait(ctx) {
			close(exited)
		}
	}()
	noCUDA := make(chan error, 1)
	cudaCtx, cancelCUDA := context.WithCancel(ctx)
	defer cancelCUDA()
	go func() { noCUDA <- waitForCUDA(cudaCtx, pid, cfg.CUDAWait, log) }()

	// The target's descendants (DDP workers, data loaders, a launcher's
	// trainer) are traced with it. They are reparented when it exits, so
	// they are pinned while it lives and followed to their own end.
	kids := newFollowed(pid, tracedSet(s.pipe))
	defer kids.close()
	tick := time.NewTicker(matchPoll)
	defer tick.Stop()
	var allGone <-chan struct{}

	code := ExitOK
wait:
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				log.Info("tracing stopped after --duration", "duration", cfg.Duration)
			} else {
				log.Info("detaching", "pid", pid)
			}
			break wait
		case <-exited:
			exited = nil
			kids.refresh(true)
			if n := kids.alive(); n > 0 {
				log.Info("traced process exited; following its descendants", "pid", pid, "descendants", n)
				allGone = kids.waitAll(ctx, matchPoll)
				continue
			}
			log.Info("traced process exited", "pid", pid)
			break wait
		case <-allGone:
			log.Info("traced process and its descendants exited", "pid", pid)
			break wait
		case err := <-noCUDA:
			// nil: libcuda is mapped (or waiting was not asked for);
			// tracing goes on until one of the other ends.
			noCUDA = nil
			if err != nil {
				fmt.Fprintf(deps.Stderr, "gaptrace %s: %v\n", cmd, err)
				code = ExitFailure
				break wait
			}
		case <-tick.C:
			if exited != nil {
				kids.refresh(false)
			}
		}
	}
	if err := s.finish(); err != nil {
		log.Error("tracing did not stop cleanly", "err", err)
		code = ExitFailure
	}
	return code
}

// cudaLibs reports the libcuda mappings of pid and its descendants.
func cudaLibs(pid int) []string {
	var out []string
	for _, p := range append([]int{pid}, proc.Descendants(pid)...) {
		libs, err := proc.Libraries(p, "libcuda.so")
		if err != nil {
			continue
		}
		for _, l := range libs["libcuda.so"] {
			if !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	return out
}

// waitForCUDA returns nil once pid (or a descendant) maps libcuda, and an
// error explaining the situation if none did within wait. PyTorch loads
// libcuda at the first CUDA call, not at import, so a process may start
// without it; a process that still has none after a while is most likely
// not the one the user meant. wait == 0 only warns.
func waitForCUDA(ctx context.Context, pid int, wait time.Duration, log *slog.Logger) error {
	if libs := cudaLibs(pid); len(libs) > 0 {
		log.Info("CUDA driver library mapped by the target", "pid", pid, "lib", libs[0])
		return nil
	}
	if wait <= 0 {
		log.Warn("no CUDA driver library (libcuda.so) is mapped by the target or its children: GPU calls cannot be traced until it loads one", "pid", pid)
		<-ctx.Done()
		return nil
	}
	log.Warn("no CUDA driver library (libcuda.so) is mapped by the target yet; waiting for it", "pid", pid, "cuda_wait", wait)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(matchPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return fmt.Errorf("no CUDA library in the target: pid %d and its children have not loaded libcuda.so after %v, so there is no GPU activity to trace "+
				"(is it the training process? a CUDA library under another name needs --cuda-lib; --cuda-wait 0 keeps tracing anyway)", pid, wait)
		case <-tick.C:
			if libs := cudaLibs(pid); len(libs) > 0 {
				log.Info("CUDA driver library loaded by the target", "pid", pid, "lib", libs[0])
				return nil
			}
		}
	}
}
