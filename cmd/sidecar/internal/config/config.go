// Package config holds the one Config of the gaptrace command and the way
// it is assembled: defaults, then an optional YAML file, then GAPTRACE_*
// environment variables, then flags. Every source goes through the same
// option table and the same parsers, so a value means the same thing
// wherever it is written. Parsing never stops at the first bad value:
// every problem is collected and Validate adds the cross-field ones, so a
// user fixes all of them in one round.
//
// Files: config.go the Config and its defaults (the packages' own where
// they have one: tracer, correlate, hang and otel export them), options.go
// the option table and its parsers, load.go precedence and the YAML file,
// validate.go the cross-field and output checks.
package config

import (
	"path/filepath"
	"strings"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/tracer"
)

// Command names the subcommand a Config is for; some options only exist
// for some commands.
type Command string

const (
	CmdRun    Command = "run"
	CmdAttach Command = "attach"
	CmdCheck  Command = "check"
	CmdDemo   Command = "demo"
)

// EnvPrefix prefixes the environment variable of every option:
// --min-gap is GAPTRACE_MIN_GAP.
const EnvPrefix = "GAPTRACE_"

// DefaultSpansFile is where spans go when no OTLP endpoint is configured.
const DefaultSpansFile = "gaptrace-spans.jsonl"

// DefaultSpansMaxSize caps the spans file: a busy job writes gigabytes of
// spans an hour, and the default file is in the current directory. With
// one rotated file kept, the spans take at most twice this.
const DefaultSpansMaxSize = 256 << 20

// The auto probe set's schedule by default: a window of about a second (and
// at least three steps) a minute keeps the per-launch probes' cost to a
// few per cent of full's.
const (
	DefaultAutoWindow = 500 * time.Millisecond
	DefaultAutoEvery  = time.Minute
)

// DefaultCUDAWait is how long attach --pid waits for libcuda to appear in
// its target. The other defaults are the owning packages' (tracer,
// correlate, hang, otel): Defaults names them rather than retyping them.
const DefaultCUDAWait = 30 * time.Second

// The auto warm-up window: the per-launch probes stay attached from the
// start until AutoWarmupSteps steps were measured and a --auto-window
// passed, or AutoWarmupWindows --auto-window after the first step. The
// sidecar schedules it; replay --probes auto reproduces it.
const (
	AutoWarmupSteps   = 5
	AutoWarmupWindows = 20
)

// Config is everything a gaptrace command needs to know. Zero values are
// not meaningful; start from Defaults.
type Config struct {
	Command Command

	// Tracing.
	Probes           string        // "auto", "full", "lite" or "null"
	AutoWindow       time.Duration // auto: how long each window of per-launch probes lasts (at least)
	AutoEvery        time.Duration // auto: a window this often
	SyscallThreshold time.Duration // syscalls shorter than this are counted, not emitted
	MinGap           time.Duration // gaps shorter than this are accounted per step, not emitted
	Duration         time.Duration // stop tracing after this long (0: until the target exits)
	CUDALib          string        // libcuda path override
	NCCLLib          string        // libnccl path override
	NVMLLib          string        // libnvidia-ml path override
	CUDAWait         time.Duration // attach --pid: fail when no libcuda appears in the target within this (0: never fail)
	RingPoll         time.Duration // how often the event reader looks at the ring buffer on its own
	CPUSampleHz      int           // CPU samples per second per CPU; 0: off
	HangAfter        time.Duration // a call in flight this long without progress is a hang
	StepAt           string        // declared step site: FILE:LINE or a function name ("": found)

	// Outputs.
	GapsOut        string
	SummaryJSON    string
	SpansOut       string
	SpansMaxSize   int64 // bytes; 0: no cap
	SpansKeep      int   // rotated spans files kept
	WindowsOut     string
	Record         string
	PerfettoOut    string
	OTLPEndpoint   string
	OTLPProtocol   string // "grpc" or "http/protobuf"; "" = OTEL_EXPORTER_OTLP_PROTOCOL, else by port
	OTLPInsecure   bool
	OTLPInsecureOK bool // OTLPInsecure was set explicitly
	ServiceName    string
	JobID          string
	Rank           int    // -1: unknown
	Peers          string // HOST:PORT of the job's peer exchange ("": none)
	PeersSecret    string // file holding the exchange's shared secret
	Prometheus     string

	// Presentation.
	CommandLine string // target command line in telemetry: "redacted", "none", "name", "full"
	Redact      string // extra regex whose matches are hidden in the command line

	Live     string // "auto", "on", "off"
	LogLevel string // "debug", "info", "warn", "error"

	// Targets.
	PID      int      // attach --pid, check --pid
	Match    string   // attach --match
	GPUProcs bool     // attach --gpu-procs: every process with libcuda mapped
	Force    bool     // attach --pid: also init, gaptrace or its ancestors
	Argv     []string // run: the command
	OutDir   string   // demo: where files go
	DemoFor  time.Duration

	ConfigFile string
}

// Defaults returns the configuration before any file, environment or flag.
func Defaults(cmd Command) Config {
	c := Config{
		Command:          cmd,
		Probes:           string(tracer.ProbesAuto),
		AutoWindow:       DefaultAutoWindow,
		AutoEvery:        DefaultAutoEvery,
		SyscallThreshold: tracer.DefaultSyscallThreshold,
		MinGap:           correlate.DefaultMinGap,
		CUDAWait:         DefaultCUDAWait,
		RingPoll:         tracer.DefaultRingPoll,
		CPUSampleHz:      tracer.DefaultCPUSampleHz,
		HangAfter:        hang.DefaultAfter,
		ServiceName:      otel.DefaultServiceName,
		Rank:             -1,
		Live:             "auto",
		LogLevel:         "info",
		CommandLine:      "redacted",
		SpansMaxSize:     DefaultSpansMaxSize,
		SpansKeep:        1,
	}
	if cmd == CmdDemo {
		c.OutDir = filepath.Join("out", "demo")
		c.DemoFor = 15 * time.Second
	}
	return c
}

// SpansNone as --spans-out writes no spans file.
const SpansNone = "none"

// SpansFile is the spans file a tracing command writes, "" for none:
// --spans-out as given; none with --spans-out none, or when spans go to
// OTLP, or OTEL_TRACES_EXPORTER=none; else DefaultSpansFile.
func (c *Config) SpansFile(getenv func(string) string) string {
	switch {
	case c.SpansOut == SpansNone:
		return ""
	case c.SpansOut != "":
		return c.SpansOut
	case c.OTLPConfigured(getenv):
		return ""
	case strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none"):
		return ""
	}
	return DefaultSpansFile
}

// OTLPConfigured reports whether spans go to an OTLP endpoint (flag, file,
// GAPTRACE_OTLP_ENDPOINT or the standard OTEL_EXPORTER_OTLP_* variables).
func (c *Config) OTLPConfigured(getenv func(string) string) bool {
	return c.OTLPEndpoint != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}
