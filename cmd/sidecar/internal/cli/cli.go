// Package cli is the gaptrace command: subcommands, configuration, the
// lifecycle of a tracing session, the live view and the final summary.
//
// The tracing machinery itself (probes, GPU sampling, correlation, export)
// sits behind the Pipeline interface and is supplied by package main, so
// everything here is testable with a fake pipeline and real child
// processes, without privileges.
//
// Session lifecycle, the same for run, attach and demo:
//
//	load config (all problems at once, exit 2) → privilege check → open
//	outputs → NewPipeline → Trace(target) → Run until the target exits,
//	--duration elapses or a signal arrives → Close (drain, detach, flush)
//	→ summary JSON + printed summary.
//
// Invariant: a session that created a Pipeline always Closes it, on every
// path, so no probe of ours outlives the process: Close detaches every
// probe, and what it has not detached by DetachTimeout after tracing
// stopped the kernel removes when gaptrace exits and its file descriptors
// close.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/regress"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/safefile"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/perfetto"
	"github.com/gaptrace/gaptrace/whatif"
)

// FlushTimeout bounds how long exporting what is left may take once the
// traced job is done: with the GPU drain (1 s) and the detach beside it,
// gaptrace exits within 5 s of the job even when the collector never
// answers.
const FlushTimeout = 2 * time.Second

// DetachTimeout bounds how long gaptrace waits for its probes to detach,
// counted from when tracing stopped (the job exited): closing hundreds of
// per-process uprobe links can take seconds on a busy or nested kernel.
// Waiting longer buys nothing: every probe is a file descriptor of
// gaptrace's, which the kernel closes, detaching the probe, when gaptrace
// exits. So past it gaptrace stops waiting, writes its summary and exits,
// and the kernel finishes the detach then.
const DetachTimeout = 3 * time.Second

// Exit codes of gaptrace itself (run passes the command's through).
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// Pipeline is one tracing session's machinery.
type Pipeline interface {
	// Trace starts tracing pid and, from now on, its descendants.
	Trace(pid int) error
	// Run feeds results to the session's sink until ctx is done; it
	// returns nil on a clean stop.
	Run(ctx context.Context) error
	// Stats reports attach state and counters for the live view.
	Stats() live.Stats
	// Close drains what is buffered, detaches every probe, flushes
	// exporters and returns the final summary. ctx bounds the flush;
	// Close waits for the detach until detachBy (zero: for as long as it
	// takes) and then leaves it to go on in the background, the kernel
	// finishing it when gaptrace exits (DetachTimeout). It is called
	// exactly once, after Run returned.
	Close(ctx context.Context, detachBy time.Time) (correlate.Summary, error)
}

// PipelineConfig is what a Pipeline is built from.
type PipelineConfig struct {
	Config *config.Config
	// Sink receives every gap and step (the live view and --gaps-out);
	// the pipeline tees its own exporter next to it.
	Sink correlate.Sink
	// Snapshot receives the engine's running totals about once a second.
	Snapshot func(correlate.Summary)
	// Spans is the spans file in file mode ("" when exporting over OTLP).
	Spans         string
	TargetPID     int
	TargetCmdline []string
	Logger        *slog.Logger
	// Named, when set, is told each traced process's name (comm) while
	// the process lives: at the start of tracing, at fork and at exec.
	Named func(pid uint32, comm string)
	// Hang, when set, is told each hang as it begins, while it lasts and
	// when it ends, from the pipeline's hang watcher.
	Hang func(*hang.Report)
}

// Deps is what the command needs from its environment; tests replace it.
type Deps struct {
	Version     string
	NewPipeline func(ctx context.Context, pc PipelineConfig) (Pipeline, error)
	// GPU inspects NVML for check; nil means no NVML support built in.
	GPU GPUInspector
	// Privileged returns an error explaining what is missing when gaptrace
	// cannot load BPF programs; nil when it can.
	Privileged func() error
	Stdout     io.Writer
	Stderr     io.Writer
	// LookupEnv reads the environment (os.LookupEnv); Getenv, when nil,
	// is made from it.
	LookupEnv func(string) (string, bool)
	Getenv    func(string) string
	Environ   func() []string
	// Executable is gaptrace's own path, for the exec helper.
	Executable func() (string, error)
	// IsTerminal reports whether stdout is a terminal and its width.
	IsTerminal func() (bool, int)
	// TerminalRows reports the height of the terminal on stdout (nil or 0:
	// unknown, and the live view draws nothing).
	TerminalRows func() int
}

func (d *Deps) fill() {
	if d.Stdout == nil {
		d.Stdout = os.Stdout
	}
	if d.Stderr == nil {
		d.Stderr = os.Stderr
	}
	if d.LookupEnv == nil {
		d.LookupEnv = os.LookupEnv
	}
	if d.Getenv == nil {
		lookup := d.LookupEnv
		d.Getenv = func(k string) string { v, _ := lookup(k); return v }
	}
	if d.Environ == nil {
		d.Environ = os.Environ
	}
	if d.Executable == nil {
		d.Executable = os.Executable
	}
	if d.IsTerminal == nil {
		d.IsTerminal = func() (bool, int) { return false, 100 }
	}
	if d.Privileged == nil {
		d.Privileged = CheckPrivileges
	}
}

// CheckPrivileges explains what gaptrace lacks to trace, or returns nil.
func CheckPrivileges() error {
	caps, err := proc.EffectiveCaps()
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	if missing := proc.MissingTracingCaps(caps); len(missing) > 0 {
		return fmt.Errorf("missing capabilities %s: run as root, or grant them "+
			"(docker: --cap-add BPF --cap-add PERFMON --cap-add SYS_PTRACE --cap-add SYS_RESOURCE; "+
			"binary: setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_sys_resource+ep bin/gaptrace)",
			strings.Join(missing, ", "))
	}
	return nil
}

const usage = `gaptrace — why was the GPU idle?

Usage:
  gaptrace run [flags] -- CMD ARGS...   start CMD and trace it until it exits (its exit code is passed through)
  gaptrace attach --pid PID [flags]     trace a running process and its descendants
  gaptrace attach --match REGEX [flags] trace the process whose command line matches, and the next one after it exits
  gaptrace check [--pid PID]            say whether tracing can work here, and how to fix what cannot
  gaptrace demo [--out DIR]             trace the simulated trainer (no GPU needed) and show what gaptrace reports
  gaptrace convert --from FILE --perfetto-out FILE
                                        turn a saved gaps or spans file into a trace for ui.perfetto.dev
  gaptrace replay FILE                  correlate a run recorded with --record again, offline
  gaptrace diff BASE NEW                compare two runs' idle per step by cause, with confidence intervals
  gaptrace dump [--pid PID]             print every traced thread's in-flight call and stacks of a running gaptrace
  gaptrace version

Run 'gaptrace COMMAND -h' for the flags of a command. Every flag is also an
environment variable (--min-gap → GAPTRACE_MIN_GAP) and a key of the YAML
file named by --config or GAPTRACE_CONFIG. Precedence: flags, environment,
file, defaults.
`

// Main runs the gaptrace command line (without the program name) and
// returns the process exit code.
func Main(ctx context.Context, args []string, deps Deps) int {
	deps.fill()
	if len(args) == 0 {
		fmt.Fprint(deps.Stderr, usage)
		return ExitUsage
	}
	switch args[0] {
	case proc.ExecHelperArg:
		return proc.ExecHelper(args[1:])
	case "version", "--version", "-version":
		fmt.Fprintf(deps.Stdout, "gaptrace %s\n", deps.Version)
		return ExitOK
	case "help", "-h", "--help", "-help":
		fmt.Fprint(deps.Stdout, usage)
		return ExitOK
	case "run":
		return runCmd(ctx, args[1:], deps)
	case "attach":
		return attachCmd(ctx, args[1:], deps)
	case "check":
		return checkCmd(ctx, args[1:], deps)
	case "demo":
		return demoCmd(ctx, args[1:], deps)
	case "convert":
		return convertCmd(args[1:], deps)
	case "replay":
		return replayCmd(args[1:], deps)
	case "diff":
		return diffCmd(args[1:], deps)
	case "dump":
		return dumpCmd(ctx, args[1:], deps)
	}
	unknownCommand(deps.Stderr, args[0])
	return ExitUsage
}

// load parses the configuration of a command and prints every problem.
func load(cmd config.Command, args []string, deps Deps) (config.Config, int, bool) {
	// The flag package prints an error with every option's usage; that
	// is kept for --help, an error gets a line or two (usageError).
	var flagOut bytes.Buffer
	cfg, _, err := config.Load(cmd, args, deps.LookupEnv, &flagOut)
	var ue *config.UsageError
	if errors.As(err, &ue) {
		if errors.Is(ue.Err, flagErrHelp) {
			deps.Stderr.Write(flagOut.Bytes()) //nolint:errcheck // the help itself
			return cfg, ExitOK, false
		}
		usageError(deps.Stderr, cmd, ue.Err)
		return cfg, ExitUsage, false
	}
	var p config.Problems
	if err != nil && !errors.As(err, &p) {
		fmt.Fprintf(deps.Stderr, "gaptrace %s: %v\n", cmd, err)
		return cfg, ExitUsage, false
	}
	// Beside the configuration's own problems, so that every one is said
	// in one round.
	p = append(p, checkOutputs(&cfg, deps)...)
	if len(p) == 0 {
		return cfg, 0, true
	}
	fmt.Fprintf(deps.Stderr, "gaptrace %s: invalid configuration:\n", cmd)
	for _, msg := range p {
		fmt.Fprintf(deps.Stderr, "  - %s\n", msg)
	}
	return cfg, ExitUsage, false
}

// checkOutputs finds what config cannot: problems of the spans file that
// is written by default in the current directory, and of the exporter's
// settings (flags and the OTEL_* environment).
func checkOutputs(cfg *config.Config, deps Deps) config.Problems {
	if cfg.Command == config.CmdCheck {
		return nil
	}
	var p config.Problems
	tracesHere := cfg.Command == config.CmdRun || cfg.Command == config.CmdAttach // demo writes under --out
	if tracesHere && cfg.SpansOut == "" && cfg.SpansFile(deps.Getenv) == config.DefaultSpansFile {
		if err := safefile.Check(config.DefaultSpansFile); err != nil {
			p = append(p, fmt.Sprintf("default spans file ./%s: %v (or set --spans-out)", config.DefaultSpansFile, err))
		}
	}
	// The exporter's settings, checked now rather than after the probes
	// loaded and the job started.
	if err := otel.Validate(otel.Config{Endpoint: cfg.OTLPEndpoint, Protocol: cfg.OTLPProtocol,
		PrometheusAddr: cfg.Prometheus, JobID: cfg.JobID, Rank: cfg.Rank}); err != nil {
		for _, line := range strings.Split(strings.TrimPrefix(err.Error(), "otel config: "), "\n") {
			p = append(p, line)
		}
	}
	return p
}

// output is where a tracing command writes: the live view's terminal (nil
// unless the view is redrawn in place) and the base logger. Each
// component adds its own "component" attribute to the logger.
type output struct {
	mode string         // "on" (redrawn frame), "log" (periodic lines), "off"
	term *live.Terminal // when mode is "on"
	log  *slog.Logger
}

// newOutput resolves --live and builds the logger. When the view is
// redrawn on the terminal that stderr also goes to, log lines are written
// through it, above the frame, instead of across it.
func newOutput(cfg *config.Config, deps Deps) output {
	isTTY, _ := deps.IsTerminal()
	o := output{mode: cfg.Live}
	if o.mode == "auto" {
		o.mode = map[bool]string{true: "on", false: "log"}[isTTY]
	}
	// Log lines go straight to stderr: on the terminal they scroll in the
	// region above the view, like the traced command's output.
	w := deps.Stderr
	sizeUnknown := false
	if o.mode == "on" {
		o.term = &live.Terminal{W: deps.Stdout, Rows: deps.TerminalRows}
		if !o.term.SizeKnown() {
			// Nothing could be drawn until the summary: the periodic
			// line says at least how it goes.
			o.mode, o.term, sizeUnknown = "log", nil, true
		}
	}
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.LogLevel)) //nolint:errcheck // validated by config
	o.log = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
	if sizeUnknown {
		o.log.Warn("the terminal reports no size (0 rows), so the live view cannot be drawn: a status line every 5 s instead; "+
			"give it a size (stty rows 40 cols 120) for the view", "component", "cli")
	}
	return o
}

// fail prints one clear message and returns ExitFailure.
func fail(deps Deps, cmd config.Command, format string, a ...any) int {
	fmt.Fprintf(deps.Stderr, "gaptrace %s: %s\n", cmd, fmt.Sprintf(format, a...))
	return ExitFailure
}

// gapsWriter is the --gaps-out sink: correlate's JSON-lines encoding, in
// start order (gaps leave a short reorder window), buffered and written in
// whole lines, so a crash loses at most the window and the buffer and a
// full disk never leaves half a line.
type gapsWriter struct {
	mu   sync.Mutex
	log  *slog.Logger
	f    *safefile.Writer
	buf  bytes.Buffer
	gaps *correlate.GapsJSONL
	// order holds gaps briefly so the file is in start order.
	order startOrder
}

const gapsFlushAt = 64 << 10

func newGapsWriter(path string, log *slog.Logger) (*gapsWriter, error) {
	f, err := safefile.NewWriter(path)
	if err != nil {
		return nil, fmt.Errorf("create gaps file: %w", err)
	}
	g := &gapsWriter{f: f, log: log}
	g.gaps = correlate.WriteGapsJSONL(&g.buf)
	g.order.out = func(gap correlate.Gap) {
		g.gaps.Gap(gap)
		if g.buf.Len() >= gapsFlushAt {
			g.flushLocked()
		}
	}
	return g, nil
}

func (g *gapsWriter) Gap(gap correlate.Gap) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.order.add(gap)
}

// flushLocked writes the buffered whole lines; a failed write is kept in
// the writer and reported at Close.
func (g *gapsWriter) flushLocked() {
	if g.buf.Len() > 0 {
		failed := g.f.Err() != nil
		if err := g.f.WriteRecords(g.buf.Bytes()); err != nil && !failed {
			// Said when it happens, not only in the summary.
			g.log.Error("gaps file write failed; no more gaps are written to it", "err", err)
		}
		g.buf.Reset()
	}
}

func (g *gapsWriter) Step(correlate.StepResult) {}

func (g *gapsWriter) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.order.flush()
	g.flushLocked()
	err := errors.Join(g.gaps.Err(), g.f.Close())
	if err != nil {
		return fmt.Errorf("gaps file %s: %w", g.f.Name(), err)
	}
	return nil
}

// maxSummaryCallSites: the summary names the call sites that matter, not
// every one the job blocked at.
const maxSummaryCallSites = 10

func writeSummaryJSON(path string, s correlate.Summary, wi []whatif.Estimate, steps *regress.StepIdle, hangs ...live.Hang) error {
	if s.ByCause == nil {
		s.ByCause = map[correlate.Cause]int64{}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		c := correlate.SidecarCost{}
		if s.Sidecar != nil {
			c = *s.Sidecar // the events it handled, from the pipeline
		}
		c.CPUNS = ru.Utime.Nano() + ru.Stime.Nano()
		c.MaxRSSBytes = ru.Maxrss << 10 // Linux reports KiB
		s.Sidecar = &c
	}
	b, err := json.MarshalIndent(struct {
		correlate.Summary
		// The engine's losses, zeros included: a summary that names
		// none says nothing was lost.
		correlate.Losses
		WhatIf map[correlate.Cause]whatif.JSON `json:"what_if,omitempty"`
		// Each cause's per-step idle moments, for gaptrace diff.
		StepIdle map[string]regress.Moments `json:"step_idle,omitempty"`
		Hangs    *hangTotals                `json:"hangs,omitempty"`
	}{s, s.Losses, whatif.JSONMap(wi), steps.Summary(), totalHangs(hangs)}, "", "  ")
	if err != nil {
		return err
	}
	if err := safefile.WriteAtomic(path, append(b, '\n')); err != nil {
		return fmt.Errorf("write summary %s: %w", path, err)
	}
	return nil
}

// session is one tracing session: outputs, pipeline, live view.
type session struct {
	cmd   config.Command
	cfg   *config.Config
	deps  Deps
	log   *slog.Logger
	agg   *live.Aggregator
	gaps  *gapsWriter
	hangs hangRecords
	dump  *dumpServer      // gaptrace dump, SIGUSR1; nil when the pipeline cannot dump
	trace *perfetto.Writer // --perfetto-out, nil when off
	procs processes
	names procNames
	wi    *whatif.Accumulator
	steps regress.StepIdle // per-step idle moments for the summary
	pipe  Pipeline
	spans string
	// cmdline is the target's command line as --command-line and
	// --redact allow it to be shown.
	cmdline []string
	title   string
	closed  bool
	sum     correlate.Summary // set by finish

	mode string         // live view: "on" (redrawn frame), "log" (periodic lines), "off"
	term *live.Terminal // when mode is "on"

	runCancel context.CancelFunc
	runDone   chan error
	viewStop  chan struct{}
	viewDone  chan struct{}
}

// open prepares outputs and builds the pipeline. On error nothing is left
// open.
func openSession(ctx context.Context, cfg *config.Config, deps Deps, out output, targetPID int, argv []string) (*session, error) {
	base := out.log
	s := &session{cmd: cfg.Command, cfg: cfg, deps: deps, log: base.With("component", "cli"), agg: live.NewAggregator(nil),
		mode: out.mode, term: out.term, cmdline: redactCmdline(cfg, argv)}
	// An OTLP endpoint with --spans-out: both, OTLP and a local copy.
	s.spans = cfg.SpansFile(deps.Getenv)
	s.wi = whatif.New()
	s.agg.SetWhatIf(s.wi.Estimates)
	sinks := correlate.Tee{s.agg, &s.procs, s.wi, &s.steps}
	if cfg.GapsOut != "" {
		g, err := newGapsWriter(cfg.GapsOut, s.log)
		if err != nil {
			return nil, err
		}
		s.gaps = g
		sinks = append(sinks, g)
	}
	if cfg.PerfettoOut != "" {
		log := s.log
		t, err := perfetto.Create(cfg.PerfettoOut, perfetto.Options{ProcessName: s.names.name, ThreadName: threadComm,
			OnError: func(err error) {
				log.Error("trace file write failed; the trace is not written (nothing of it is under its name)", "err", err)
			}})
		if err != nil {
			if s.gaps != nil {
				_ = s.gaps.Close() // reporting the trace file error instead
			}
			return nil, err
		}
		s.trace = t
		sinks = append(sinks, t)
	}
	pipe, err := deps.NewPipeline(ctx, PipelineConfig{
		Config: cfg, Sink: sinks, Snapshot: s.agg.SetSummary, Spans: s.spans,
		TargetPID: targetPID, TargetCmdline: s.cmdline, Logger: base, Named: s.names.Named, Hang: s.hangSink,
	})
	if err != nil {
		if s.gaps != nil {
			_ = s.gaps.Close() // reporting the pipeline error instead
		}
		if s.trace != nil {
			s.trace.Abort() // nothing was traced
		}
		return nil, err
	}
	s.pipe = pipe
	return s, nil
}

// start runs the pipeline and the live view in the background.
func (s *session) start(ctx context.Context) {
	rctx, cancel := context.WithCancel(ctx)
	s.runCancel = cancel
	s.runDone = make(chan error, 1)
	go func() { s.runDone <- s.pipe.Run(rctx) }()
	if d, ok := s.pipe.(Dumper); ok {
		s.dump = startDump(d, s.deps.Getenv, s.log)
	}
	s.viewStop = make(chan struct{})
	s.viewDone = make(chan struct{})
	go s.render()
}

// render draws the live view until stopped. It never writes after
// viewDone is closed, so the summary is printed on a clean screen.
func (s *session) render() {
	defer close(s.viewDone)
	_, width := s.deps.IsTerminal()
	if s.mode == "off" {
		<-s.viewStop
		return
	}
	every := time.Second
	if s.mode == "log" {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.viewStop:
			if s.term != nil {
				s.term.Clear()
			}
			return
		case <-t.C:
			s.agg.SetStats(s.pipe.Stats())
			v := s.agg.View(s.title)
			if s.term != nil {
				s.term.Draw(live.Frame(v, width))
			} else {
				fmt.Fprintln(s.deps.Stdout, live.LogLine(v))
			}
		}
	}
}

// finish stops tracing, closes the pipeline, writes and prints the
// summary. It is idempotent.
func (s *session) finish() error {
	if s.closed {
		return nil
	}
	s.closed = true
	// The job exited (or --duration or a signal stopped tracing) just now.
	detachBy := time.Now().Add(DetachTimeout)
	var errs []error
	s.dump.stop()
	if s.runCancel != nil {
		s.runCancel()
		if err := <-s.runDone; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("tracing: %w", err))
		}
		close(s.viewStop)
		<-s.viewDone
	}
	s.agg.Stop()
	stats := s.pipe.Stats()
	cctx, cancel := context.WithTimeout(context.Background(), FlushTimeout)
	sum, err := s.pipe.Close(cctx, detachBy)
	cancel()
	if err != nil {
		errs = append(errs, fmt.Errorf("close pipeline: %w", err))
	}
	sum.DroppedEvents = max(sum.DroppedEvents, stats.Drops)
	sum.Sidecar = &correlate.SidecarCost{Events: stats.EventsRead, EventsByKind: stats.EventsByKind}
	stats.Drops = sum.DroppedEvents
	s.agg.SetStats(stats)
	s.agg.SetSummary(sum)
	if s.gaps != nil {
		if err := s.gaps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.trace != nil {
		if err := s.trace.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	sum.Processes = s.procs.list()
	sum.CallSites = s.agg.CallSites(maxSummaryCallSites)
	s.sum = sum
	title := s.title
	if w := where(sum.Processes); w != "" {
		title += " · " + w
	}
	if s.cfg.SummaryJSON != "" {
		if err := writeSummaryJSON(s.cfg.SummaryJSON, sum, s.wi.Estimates(), &s.steps, s.agg.View("").Hangs...); err != nil {
			errs = append(errs, err)
		}
	}
	_, width := s.deps.IsTerminal()
	out := live.Outputs{Gaps: s.cfg.GapsOut, Spans: s.spans, Summary: s.cfg.SummaryJSON, Prometheus: s.cfg.Prometheus,
		Trace: s.cfg.PerfettoOut, Windows: s.cfg.WindowsOut, Record: s.cfg.Record}
	// An output that could not be written whole is not listed as written:
	// the summary and the trace appear whole or not at all, the streamed
	// files keep what was written before the failure.
	failed := safefile.FailedPaths(errors.Join(errs...))
	for _, p := range []*string{&out.Gaps, &out.Spans, &out.Summary, &out.Trace, &out.Windows, &out.Record} {
		if *p != "" && slices.Contains(failed, *p) {
			if p == &out.Summary || p == &out.Trace {
				*p += " (NOT written: see the error above)"
			} else {
				*p += " (INCOMPLETE: a write failed, see the error above)"
			}
		}
	}
	if s.cfg.OTLPConfigured(s.deps.Getenv) {
		out.OTLP = s.cfg.OTLPEndpoint
		if out.OTLP == "" {
			out.OTLP = firstNonEmpty(s.deps.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), s.deps.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
		}
		out.OTLP = otel.RedactURL(out.OTLP) + otlpNote(s.pipe.Stats().Export)
	}
	fmt.Fprint(s.deps.Stdout, live.Summary(s.agg.View(title), out, width))
	return errors.Join(errs...)
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func absOrSame(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
