package cli

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
)

// attachMatch traces every process whose command line matches (and, with
// --gpu-procs, that mapped libcuda), as it appears, until a signal or
// --duration. A process that restarts is picked up again: the follow-up is
// the same scan. Descendants of a traced process are traced with it.
func attachMatch(ctx context.Context, cfg *config.Config, deps Deps, out output) int {
	log := out.log.With("component", "cli")
	cmd := cfg.Command
	re := regexp.MustCompile(cfg.Match) // validated by config; "" matches all
	s, err := openSession(ctx, cfg, deps, out, 0, nil)
	if err != nil {
		return fail(deps, cmd, "%v", err)
	}
	s.title = matchTitle(cfg)
	s.start(ctx)
	log.Info("waiting for processes", "match", cfg.Match, "gpu_procs", cfg.GPUProcs)
	candidates := func() []int { return matchCandidates(re, cfg.GPUProcs) }

	// The per-process watchers end with mctx, also when the scan stops
	// on an error rather than on a signal.
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	var mu sync.Mutex
	traced := map[int]*proc.Watch{}
	var wg sync.WaitGroup
	// Reading every process's maps costs far more than reading command
	// lines; on a node with hundreds of processes scan less often.
	every := matchPoll
	if cfg.GPUProcs {
		every = gpuProcsPoll
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	tracers := newTracerSkip(log)
	defer tracers.close()
	code := ExitOK
scan:
	for {
		tracers.scan()
		for _, pid := range candidates() {
			mu.Lock()
			_, known := traced[pid]
			mu.Unlock()
			// Descendants of a traced process are followed already.
			if known || slices.ContainsFunc(proc.Ancestors(pid), func(a int) bool {
				mu.Lock()
				defer mu.Unlock()
				return traced[a] != nil
			}) {
				continue
			}
			if tracers.skip(pid) {
				continue
			}
			w, err := proc.Open(pid)
			if err != nil {
				continue // gone between the scan and now
			}
			if err := s.pipe.Trace(pid); err != nil {
				exited := w.Exited()
				w.Close()
				if exited {
					log.Warn("matching process exited while attaching", "pid", pid)
					continue
				}
				log.Error("trace matching process", "pid", pid, "err", err)
				code = ExitFailure
				break scan
			}
			log.Info("tracing matching process", "pid", pid, "cmdline", shortCmd(targetCmdline(cfg, pid)))
			if !cfg.GPUProcs && len(cudaLibs(pid)) == 0 {
				log.Warn("matching process has no libcuda.so mapped yet; GPU calls are traced once it loads one", "pid", pid)
			}
			mu.Lock()
			traced[pid] = w
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				if w.Wait(mctx) {
					log.Info("matching process exited; waiting for the next one", "pid", pid)
				}
				mu.Lock()
				// Keep the key so the PID is not traced twice if the scan
				// races the exit; a nil watch marks it finished.
				traced[pid] = nil
				mu.Unlock()
				w.Close()
			}()
		}
		select {
		case <-ctx.Done():
			break scan
		case <-tick.C:
		}
		mu.Lock()
		forgetReused(traced, re)
		mu.Unlock()
	}
	if err := s.finish(); err != nil {
		log.Error("tracing did not stop cleanly", "err", err)
		code = ExitFailure
	}
	mcancel()
	wg.Wait()
	return code
}

// matchTitle names what attach --match traces, for the live view.
func matchTitle(cfg *config.Config) string {
	switch {
	case cfg.GPUProcs && cfg.Match != "":
		return fmt.Sprintf("GPU processes matching /%s/", cfg.Match)
	case cfg.GPUProcs:
		return "GPU processes"
	default:
		return fmt.Sprintf("processes matching /%s/", cfg.Match)
	}
}

// matchCandidates lists the processes whose command line matches re;
// with gpuProcs, only those among them that mapped libcuda.
func matchCandidates(re *regexp.Regexp, gpuProcs bool) []int {
	pids := proc.FindMatching(re)
	if !gpuProcs {
		return pids
	}
	// Only processes that loaded the CUDA driver: a GPU process is
	// one that can launch work, whatever its command line says.
	var gpuPIDs []int
	for _, p := range pids {
		if libs, err := proc.Libraries(p, "libcuda.so"); err == nil && len(libs["libcuda.so"]) > 0 {
			gpuPIDs = append(gpuPIDs, p)
		}
	}
	return gpuPIDs
}

// forgetReused forgets finished PIDs (nil watch) whose number was reused
// by a new process that matches re, so the new one is traced. Called with
// the traced map's lock held.
func forgetReused(traced map[int]*proc.Watch, re *regexp.Regexp) {
	for pid, w := range traced {
		if w == nil && proc.Exists(pid) {
			if cl, err := proc.Cmdline(pid); err == nil && re.MatchString(cl) {
				delete(traced, pid)
			}
		}
	}
}
