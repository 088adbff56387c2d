package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
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

// followed pins the descendants of a traced process with pidfds, so that
// once it exits gaptrace still knows which processes were its own.
//
// New descendants come from the tracer's own set (it sees every fork of a
// traced process) when the pipeline has one, and from a walk of all of
// /proc at the first look and then every walkEvery looks, in case a fork
// was lost: the walk reads every process's stat on the node, which on a
// GPU host cost 5–18% of the sidecar's CPU at one walk every 500 ms.
type followed struct {
	root    int
	traced  func(after time.Time, wait time.Duration) []int // nil: every look walks /proc
	looks   int
	watches map[int]*proc.Watch
}

// walkEvery is how many looks for new descendants share one walk of /proc
// when the tracer's set is at hand (every 10 s at matchPoll).
const walkEvery = 20

func newFollowed(root int, traced func(time.Time, time.Duration) []int) *followed {
	f := &followed{root: root, traced: traced, watches: map[int]*proc.Watch{}}
	f.refresh(false)
	return f
}

// tracedSet is the pipeline's set of traced processes, when it keeps one.
func tracedSet(p Pipeline) func(time.Time, time.Duration) []int {
	if l, ok := p.(interface {
		ProcessesAfter(time.Time, time.Duration) []int
	}); ok {
		return l.ProcessesAfter
	}
	return nil
}

// settleWait bounds how long a look that follows an exit waits for the
// tracer to read the forks recorded before it.
const settleWait = time.Second

// candidates returns processes that may have joined the followed ones
// (roots): the tracer's set, or their descendants from /proc. settle (after
// a followed process exited) waits until the tracer has read every fork
// recorded before now: a process that forks and exits at once (a launcher)
// is gone before its child's fork is read, and its child is reparented
// away, where no walk of /proc finds it.
func (f *followed) candidates(settle bool, roots ...int) []int {
	f.looks++
	if f.traced == nil {
		return proc.Descendants(roots...)
	}
	var out []int
	if f.looks%walkEvery == 1 {
		out = proc.Descendants(roots...)
	}
	if settle {
		return append(out, f.traced(time.Now(), settleWait)...)
	}
	return append(out, f.traced(time.Time{}, 0)...)
}

// refresh adds the root's current descendants and drops those that exited;
// settle after the root exited.
func (f *followed) refresh(settle bool) {
	for _, p := range f.candidates(settle, f.root) {
		if _, ok := f.watches[p]; ok || p == f.root {
			continue
		}
		if w, err := proc.Open(p); err == nil {
			f.watches[p] = w
		}
	}
	for p, w := range f.watches {
		if w.Exited() {
			w.Close()
			delete(f.watches, p)
		}
	}
}

func (f *followed) alive() int {
	n := 0
	for _, w := range f.watches {
		if !w.Exited() {
			n++
		}
	}
	return n
}

// waitAll returns a channel closed once every followed process exited.
// Processes they start meanwhile are followed too (the kernel side traces
// them already). The watches move to the waiting goroutine.
func (f *followed) waitAll(ctx context.Context, every time.Duration) <-chan struct{} {
	done := make(chan struct{})
	watches := f.watches
	f.watches = map[int]*proc.Watch{}
	go func() {
		defer close(done)
		defer func() {
			for _, w := range watches {
				w.Close()
			}
		}()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			// One walk of /proc for all of them when walking: a PyTorch
			// job has dozens of workers, and a walk per process cost a
			// core's 14%.
			add := func(settle bool) {
				for _, d := range f.candidates(settle, slices.Collect(maps.Keys(watches))...) {
					if _, ok := watches[d]; !ok && d != f.root {
						if dw, err := proc.Open(d); err == nil {
							watches[d] = dw
						}
					}
				}
			}
			add(false)
			exited := false
			for p, w := range watches {
				if w.Exited() {
					w.Close()
					delete(watches, p)
					exited = true
				}
			}
			if exited && f.traced != nil {
				// What the exited ones forked last may not be read yet.
				add(true)
			}
			if len(watches) == 0 {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return done
}

func (f *followed) close() {
	for _, w := range f.watches {
		w.Close()
	}
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
	switch {
	case cfg.GPUProcs && cfg.Match != "":
		s.title = fmt.Sprintf("GPU processes matching /%s/", cfg.Match)
	case cfg.GPUProcs:
		s.title = "GPU processes"
	default:
		s.title = fmt.Sprintf("processes matching /%s/", cfg.Match)
	}
	s.start(ctx)
	log.Info("waiting for processes", "match", cfg.Match, "gpu_procs", cfg.GPUProcs)
	candidates := func() []int {
		pids := proc.FindMatching(re)
		if !cfg.GPUProcs {
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
		// Forget finished PIDs whose number was reused by a new process.
		mu.Lock()
		for pid, w := range traced {
			if w == nil && proc.Exists(pid) {
				if cl, err := proc.Cmdline(pid); err == nil && re.MatchString(cl) {
					delete(traced, pid)
				}
			}
		}
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

// wholeHost explains why tracing pid and its descendants would trace far
// more than a job: the host's init (every process of the machine), or
// gaptrace itself or one of its ancestors (gaptrace would trace itself).
// Pid 1 of a container's namespace is usually the job itself (compose's
// pid: service:trainer, docker run --pid container:trainer) and is traced
// unless gaptrace runs under it.
func wholeHost(pid int) error {
	self := os.Getpid()
	switch {
	case pid == 1 && hostInit():
		return errors.New("pid 1 is the host's init: its descendants are every process of the machine, not a training job")
	case pid == self:
		return errors.New("that is gaptrace itself")
	case slices.Contains(proc.Ancestors(self), pid):
		return fmt.Errorf("pid %d is an ancestor of gaptrace: tracing it traces gaptrace and everything beside it", pid)
	}
	return nil
}

// hostInit reports whether /proc/1 is the host's init: its PID namespace is
// the initial one, whose inode the kernel fixes (PROC_PID_INIT_INO).
func hostInit() bool {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/1/ns/pid", &st); err != nil {
		return true // cannot tell: be careful
	}
	return st.Ino == 0xEFFFFFFC
}

// tracerSkip keeps attach --match off gaptrace processes and their
// wrappers. Another gaptrace's command line holds the same pattern, and so
// does that of a process that started it (timeout 20 gaptrace attach
// --match P, sh -c "gaptrace run ..."); tracing one traces the other
// gaptrace and everything it does, which is never what was asked.
// gaptrace's own ancestors are left out by proc.FindMatching already.
//
// A verdict stands while the process lives, looked at again every
// walkEvery scans (a gaptrace under it may have exited): finding a
// gaptrace among a process's descendants walks all of /proc.
type tracerSkip struct {
	log     *slog.Logger
	scans   int
	skipped map[int]skippedTracer
}

type skippedTracer struct {
	w    *proc.Watch
	scan int
}

func newTracerSkip(log *slog.Logger) *tracerSkip {
	return &tracerSkip{log: log, skipped: map[int]skippedTracer{}}
}

// scan starts a scan: processes that exited, or whose verdict is old, are
// forgotten.
func (t *tracerSkip) scan() {
	t.scans++
	for pid, s := range t.skipped {
		if s.w.Exited() || t.scans-s.scan >= walkEvery {
			s.w.Close()
			delete(t.skipped, pid)
		}
	}
}

// skip reports whether pid must not be traced; the first time it says so
// for a process, it logs why.
func (t *tracerSkip) skip(pid int) bool {
	if _, ok := t.skipped[pid]; ok {
		return true
	}
	if !isGaptrace(pid) && !startsGaptrace(pid) && !slices.ContainsFunc(proc.Descendants(pid), isGaptrace) {
		return false
	}
	w, err := proc.Open(pid)
	if err != nil {
		return true // gone
	}
	t.skipped[pid] = skippedTracer{w: w, scan: t.scans}
	t.log.Info("not tracing a matching process: gaptrace runs it, or under it", "pid", pid)
	return true
}

func (t *tracerSkip) close() {
	for _, s := range t.skipped {
		s.w.Close()
	}
}

// gaptraceCommands are the commands of gaptrace that trace.
var gaptraceCommands = []string{string(config.CmdRun), string(config.CmdAttach), string(config.CmdDemo)}

// startsGaptrace reports whether pid's command line starts a gaptrace
// that traces: an argument, or a word of one (a shell script), naming a
// gaptrace binary (base name gaptrace, or this binary's path) followed by
// one of its tracing commands. This holds for timeout's child between its
// fork and exec too, whose command line is still timeout's.
func startsGaptrace(pid int) bool {
	argv, err := proc.Argv(pid)
	if err != nil {
		return false
	}
	self, _ := os.Executable()
	var ws []string
	for _, a := range argv {
		ws = append(ws, strings.Fields(a)...)
	}
	for i := 0; i+1 < len(ws); i++ {
		w := strings.Trim(ws[i], `"'`)
		if filepath.Base(w) != "gaptrace" && (self == "" || w != self) {
			continue
		}
		if slices.Contains(gaptraceCommands, strings.Trim(ws[i+1], `"'`)) {
			return true
		}
	}
	return false
}

// isGaptrace reports whether pid runs gaptrace (this binary, or one named
// gaptrace).
func isGaptrace(pid int) bool {
	self, err1 := os.Stat("/proc/self/exe")
	other, err2 := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	if err1 == nil && err2 == nil && os.SameFile(self, other) {
		return true
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(comm)) == "gaptrace"
}
