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
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/safefile"
	"github.com/gaptrace/gaptrace/otel"
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
