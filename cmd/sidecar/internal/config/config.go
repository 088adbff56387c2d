// Package config holds the one Config of the gaptrace command and the way
// it is assembled: defaults, then an optional YAML file, then GAPTRACE_*
// environment variables, then flags. Every source goes through the same
// option table and the same parsers, so a value means the same thing
// wherever it is written. Parsing never stops at the first bad value:
// every problem is collected and Validate adds the cross-field ones, so a
// user fixes all of them in one round.
package config

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/safefile"
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
	HangAfter        time.Duration // a call in flight this long without progress is a hang

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

// option is one setting, written the same way as a flag, an environment
// variable and a YAML key.
type option struct {
	name  string // flag name and YAML key
	usage string
	cmds  []Command // nil: every tracing command (run, attach, demo)
	binding
	bool bool
}

// binding reads a value into a Config and shows the current one for --help.
type binding struct {
	set func(c *Config, v string) error
	get func(c *Config) string // "" shows no default; nil: none to show
}

var tracing = []Command{CmdRun, CmdAttach, CmdDemo}

// show renders a value for --help; a zero value shows nothing, since the
// usage text says what happens then.
func show[T comparable](v T) string {
	var zero T
	if v == zero {
		return ""
	}
	return fmt.Sprint(v)
}

func durationVar(dst func(*Config) *time.Duration) binding {
	return binding{
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a duration (e.g. 50us, 1ms, 30s): %q", v)
			}
			if d < 0 {
				return fmt.Errorf("must not be negative: %s", v)
			}
			*dst(c) = d
			return nil
		},
		get: func(c *Config) string { return show(*dst(c)) },
	}
}

func stringVar(dst func(*Config) *string) binding {
	return binding{
		set: func(c *Config, v string) error { *dst(c) = v; return nil },
		get: func(c *Config) string { return *dst(c) },
	}
}

func oneOfVar(dst func(*Config) *string, allowed ...string) binding {
	return binding{
		set: func(c *Config, v string) error {
			v = strings.ToLower(strings.TrimSpace(v))
			if !slices.Contains(allowed, v) {
				return fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
			}
			*dst(c) = v
			return nil
		},
		get: func(c *Config) string { return *dst(c) },
	}
}

var options = []option{
	{name: "probes", usage: "probe set: auto (lite, plus every CUDA launch during short sampled windows: at start, every --auto-every, and when the steps change), full (every CUDA launch, always) or lite (syncs, copies, collectives, syscalls; lowest overhead); null attaches full's probes to programs that do nothing, to measure their raw cost",
		binding: oneOfVar(func(c *Config) *string { return &c.Probes }, "auto", "full", "lite", "null")},
	{name: "auto-window", usage: "probes auto: how long each window of per-launch probes lasts (it also waits for 3 steps, up to 5 times this)",
		binding: durationVar(func(c *Config) *time.Duration { return &c.AutoWindow })},
	{name: "auto-every", usage: "probes auto: how often a window of per-launch probes opens (changes in the steps open one sooner)",
		binding: durationVar(func(c *Config) *time.Duration { return &c.AutoEvery })},
	{name: "syscall-threshold", usage: "syscalls shorter than this are counted, not reported",
		binding: durationVar(func(c *Config) *time.Duration { return &c.SyscallThreshold })},
	{name: "ring-poll", usage: "how often the event reader looks at the kernel's ring buffer on its own (the probes wake it only when a quarter of it is full): each look wakes the sidecar, and events wait up to this long",
		binding: durationVar(func(c *Config) *time.Duration { return &c.RingPoll })},
	{name: "min-gap", usage: "GPU idle gaps shorter than this are accounted per step instead of reported one by one",
		binding: durationVar(func(c *Config) *time.Duration { return &c.MinGap })},
	{name: "hang-after", usage: "report a hang when a traced thread stays this long in one CUDA sync, collective wait or blocking syscall while its process makes no progress on the GPU",
		binding: durationVar(func(c *Config) *time.Duration { return &c.HangAfter })},
	{name: "duration", usage: "stop tracing after this long (the traced command keeps running); 0 = until it exits",
		binding: durationVar(func(c *Config) *time.Duration { return &c.Duration })},
	{name: "gaps-out", usage: "write every gap as a JSON line to `FILE`",
		binding: stringVar(func(c *Config) *string { return &c.GapsOut })},
	{name: "summary-json", usage: "write the summary as JSON to `FILE` at exit",
		binding: stringVar(func(c *Config) *string { return &c.SummaryJSON })},
	{name: "spans-out", usage: "write spans as JSON lines to `FILE` (default " + DefaultSpansFile + " when no OTLP endpoint is set)",
		binding: stringVar(func(c *Config) *string { return &c.SpansOut })},
	{name: "spans-max-size", usage: "rotate the spans file when it would grow past `SIZE` (e.g. 256M, 1G; 0: no cap)",
		binding: binding{get: func(c *Config) string { return formatSize(c.SpansMaxSize) },
			set: func(c *Config, v string) error {
				n, err := parseSize(v)
				if err != nil {
					return err
				}
				c.SpansMaxSize = n
				return nil
			}}},
	{name: "spans-keep", usage: "rotated spans files to keep (FILE.1 … FILE.N); 0 keeps none",
		binding: binding{get: func(c *Config) string { return strconv.Itoa(c.SpansKeep) },
			set: func(c *Config, v string) error {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil || n < 0 || n > 100 {
					return fmt.Errorf("want 0 to 100: %q", v)
				}
				c.SpansKeep = n
				return nil
			}}},
	{name: "windows-out", usage: "write the GPU's own idle windows (NVML/GPM samples) as JSON lines to `FILE`",
		binding: stringVar(func(c *Config) *string { return &c.WindowsOut })},
	{name: "record", usage: "record everything the correlation engine is given to `FILE` (gzip JSON lines, ~1 MB per 10k steps); 'gaptrace replay FILE' reproduces this run's gaps offline, e.g. for a bug report",
		binding: stringVar(func(c *Config) *string { return &c.Record })},
	{name: "perfetto-out", usage: "write a Chrome trace-event JSON `FILE` that ui.perfetto.dev and chrome://tracing open: GPU busy/idle, steps and host threads per rank",
		binding: stringVar(func(c *Config) *string { return &c.PerfettoOut })},
	{name: "otlp-endpoint", usage: "OTLP collector endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT)",
		binding: stringVar(func(c *Config) *string { return &c.OTLPEndpoint })},
	{name: "otlp-protocol", usage: "OTLP protocol: grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc on port 4317, else http/protobuf)",
		binding: oneOfVar(func(c *Config) *string { return &c.OTLPProtocol }, "grpc", "http/protobuf")},
	{name: "otlp-insecure", usage: "use plaintext to the OTLP endpoint", bool: true,
		binding: binding{set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a boolean: %q", v)
			}
			c.OTLPInsecure, c.OTLPInsecureOK = b, true
			return nil
		}}},
	{name: "service-name", usage: "OpenTelemetry service.name",
		binding: stringVar(func(c *Config) *string { return &c.ServiceName })},
	{name: "job-id", usage: "training job ID attached to every span and metric",
		binding: stringVar(func(c *Config) *string { return &c.JobID })},
	{name: "rank", usage: "distributed rank of the traced process (-1: unknown; default RANK from the target when found)",
		binding: binding{get: func(c *Config) string { return strconv.Itoa(c.Rank) },
			set: func(c *Config, v string) error {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					return fmt.Errorf("not an integer: %q", v)
				}
				if n < -1 {
					return fmt.Errorf("must be -1 or more: %d", n)
				}
				c.Rank = n
				return nil
			}}},
	{name: "peers", usage: "share the ranks' collectives with the job's other sidecars at `HOST:PORT` (the first that can bind it serves it, the others connect): a rank waiting on a rank another sidecar traces is then told which rank was late and by how much; needs --job-id",
		cmds:    []Command{CmdRun, CmdAttach},
		binding: stringVar(func(c *Config) *string { return &c.Peers })},
	{name: "peers-secret-file", usage: "`FILE` holding the secret the sidecars of the job share (required with --peers; mode 0600 or 0400, at least 32 bytes): each proves it holds it before the others hear it, and the exchange is encrypted with it; make one with: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE",
		cmds:    []Command{CmdRun, CmdAttach},
		binding: stringVar(func(c *Config) *string { return &c.PeersSecret })},
	{name: "command-line", usage: "the target's command line in spans, metrics, logs, check and the view: redacted (values of secret-named options and variables, secret headers and URL credentials hidden; docs/security.md lists the rules), none, name (program name only), full",
		cmds:    []Command{CmdRun, CmdAttach, CmdDemo, CmdCheck},
		binding: oneOfVar(func(c *Config) *string { return &c.CommandLine }, "redacted", "none", "name", "full")},
	{name: "redact", usage: "also hide what `REGEX` matches in the target's command line", cmds: []Command{CmdRun, CmdAttach, CmdDemo, CmdCheck},
		binding: stringVar(func(c *Config) *string { return &c.Redact })},
	{name: "prometheus", usage: "serve Prometheus metrics on `ADDR` (e.g. :9464)",
		binding: stringVar(func(c *Config) *string { return &c.Prometheus })},
	{name: "nvml-lib", usage: "path of libnvidia-ml.so.1 (default: the dynamic loader's)", cmds: []Command{CmdRun, CmdAttach, CmdDemo, CmdCheck},
		binding: stringVar(func(c *Config) *string { return &c.NVMLLib })},
	{name: "cuda-lib", usage: "path of libcuda.so.1 to probe (default: found in the target)",
		binding: stringVar(func(c *Config) *string { return &c.CUDALib })},
	{name: "nccl-lib", usage: "path of libnccl.so.2 to probe (default: found in the target)",
		binding: stringVar(func(c *Config) *string { return &c.NCCLLib })},
	{name: "live", usage: "live view: auto (when stdout is a terminal), on, off",
		binding: oneOfVar(func(c *Config) *string { return &c.Live }, "auto", "on", "off")},
	{name: "log-level", usage: "debug, info, warn or error",
		cmds:    []Command{CmdRun, CmdAttach, CmdDemo, CmdCheck},
		binding: oneOfVar(func(c *Config) *string { return &c.LogLevel }, "debug", "info", "warn", "error")},
	{name: "pid", usage: "process ID to trace (with its descendants)", cmds: []Command{CmdAttach, CmdCheck},
		binding: binding{set: func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n <= 0 {
				return fmt.Errorf("not a process ID: %q", v)
			}
			c.PID = n
			return nil
		}}},
	{name: "match", usage: "trace the process whose command line matches `REGEX`, and the next one after it exits", cmds: []Command{CmdAttach},
		binding: stringVar(func(c *Config) *string { return &c.Match })},
	{name: "gpu-procs", usage: "trace every process that has the CUDA driver library mapped (with --match: that also matches), as they appear", cmds: []Command{CmdAttach}, bool: true,
		binding: binding{set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a boolean: %q", v)
			}
			c.GPUProcs = b
			return nil
		}}},
	{name: "force", usage: "attach --pid: trace even pid 1 or an ancestor of gaptrace (their descendants are the whole host or gaptrace itself)", cmds: []Command{CmdAttach}, bool: true,
		binding: binding{set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a boolean: %q", v)
			}
			c.Force = b
			return nil
		}}},
	{name: "cuda-wait", usage: "attach --pid: fail when the target has not loaded libcuda within this long (0: only warn)", cmds: []Command{CmdAttach},
		binding: durationVar(func(c *Config) *time.Duration { return &c.CUDAWait })},
	{name: "out", usage: "directory for the demo's gaps, spans and summary files", cmds: []Command{CmdDemo},
		binding: stringVar(func(c *Config) *string { return &c.OutDir })},
	{name: "demo-duration", usage: "how long the demo trainer runs (approximately)", cmds: []Command{CmdDemo},
		binding: durationVar(func(c *Config) *time.Duration { return &c.DemoFor })},
}

// parseSize reads a byte count: a number with an optional K, M, G or T
// suffix (powers of 1024; KiB, MB and the like are read the same way).
func parseSize(v string) (int64, error) {
	s := strings.ToUpper(strings.TrimSpace(v))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	mult := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			s = s[:len(s)-1]
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("not a size (e.g. 256M, 1G, 0 for no cap): %q", v)
	}
	return n * mult, nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (o option) appliesTo(cmd Command) bool {
	if o.cmds == nil {
		return slices.Contains(tracing, cmd)
	}
	return slices.Contains(o.cmds, cmd)
}

// EnvName returns the environment variable of a flag name.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Problems is every problem found while loading and validating a Config.
type Problems []string

func (p Problems) Error() string {
	if len(p) == 1 {
		return p[0]
	}
	return fmt.Sprintf("%d problems:\n  - %s", len(p), strings.Join(p, "\n  - "))
}

// UsageError is returned for a command line that cannot be parsed at all
// (unknown flag); the caller prints usage and exits 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// flagValue routes a flag through the option table and records problems
// instead of failing, so one bad flag does not hide the next one.
type flagValue struct {
	opt      option
	cfg      *Config
	problems *Problems
	isBool   bool
	cur      string
}

func (f *flagValue) String() string { return f.cur }
func (f *flagValue) Set(v string) error {
	f.cur = v
	if err := f.opt.set(f.cfg, v); err != nil {
		*f.problems = append(*f.problems, fmt.Sprintf("--%s: %v", f.opt.name, err))
	}
	return nil
}
func (f *flagValue) IsBoolFlag() bool { return f.isBool }

// FlagSet returns the flag set of a command bound to cfg. Problems with
// values land in problems; the returned set fails only on syntax.
func FlagSet(cmd Command, cfg *Config, problems *Problems, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gaptrace "+string(cmd), flag.ContinueOnError)
	fs.SetOutput(out)
	for _, o := range options {
		if !o.appliesTo(cmd) {
			continue
		}
		fv := &flagValue{opt: o, cfg: cfg, problems: problems, isBool: o.bool}
		if o.get != nil {
			fv.cur = o.get(cfg)
		}
		fs.Var(fv, o.name, o.usage+" [$"+EnvName(o.name)+"]")
	}
	fs.StringVar(&cfg.ConfigFile, "config", cfg.ConfigFile, "YAML `FILE` with options (keys are flag names) [$GAPTRACE_CONFIG]")
	return fs
}

// Load builds the Config of cmd from defaults, the YAML file named by
// --config or GAPTRACE_CONFIG, the environment (lookupEnv, as
// os.LookupEnv) and args. It returns the positional arguments left after
// the flags. The error is a *UsageError for unparsable command lines and
// Problems for bad values (including what Validate finds).
//
// A variable that is set but empty (GAPTRACE_PROBES=) is a problem, as an
// empty value in the file is: it says something was meant and gives no
// value; an unset variable leaves the default.
func Load(cmd Command, args []string, lookupEnv func(string) (string, bool), usageOut io.Writer) (Config, []string, error) {
	cfg := Defaults(cmd)
	var problems Problems

	// The file comes before the environment and the flags but is named by
	// either, so find its name first with a throwaway pass.
	cfgFile, ok, err := lookup(lookupEnv, EnvPrefix+"CONFIG")
	if err != nil {
		problems = append(problems, fmt.Sprintf("$%s: %v; unset it to read no configuration file", EnvPrefix+"CONFIG", err))
	}
	if !ok {
		cfgFile = ""
	}
	{
		scratch := Defaults(cmd)
		var ignored Problems
		fs := FlagSet(cmd, &scratch, &ignored, io.Discard)
		if err := fs.Parse(args); err != nil {
			// Parse again where the user sees it: flag prints the error
			// (or the help) and the usage.
			again := Defaults(cmd)
			FlagSet(cmd, &again, &ignored, usageOut).Parse(args) //nolint:errcheck // same error as err
			return cfg, nil, &UsageError{Err: err}
		}
		if scratch.ConfigFile != "" {
			cfgFile = scratch.ConfigFile
		}
	}
	if cfgFile != "" {
		problems = append(problems, loadFile(cmd, cfgFile, &cfg)...)
		cfg.ConfigFile = cfgFile
	}

	for _, o := range options {
		if !o.appliesTo(cmd) {
			continue
		}
		name := EnvName(o.name)
		v, ok, err := lookup(lookupEnv, name)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("$%s: %v; unset it for the default", name, err))
		case ok:
			if err := o.set(&cfg, v); err != nil {
				problems = append(problems, fmt.Sprintf("$%s: %v", name, err))
			}
		}
	}

	fs := FlagSet(cmd, &cfg, &problems, usageOut)
	if err := fs.Parse(args); err != nil {
		return cfg, nil, &UsageError{Err: err}
	}
	rest := fs.Args()
	if cmd == CmdRun {
		cfg.Argv = rest
		rest = nil
	}
	problems = append(problems, cfg.validate(rest)...)
	if cfg.Peers != "" && cfg.JobID == "" && !anySet(lookupEnv, jobIDEnv) {
		problems = append(problems, fmt.Sprintf("--peers %s needs --job-id (or $%s): the sidecars of one job share it, and refuse those of another",
			cfg.Peers, strings.Join(jobIDEnv, ", $")))
	}
	if len(problems) > 0 {
		return cfg, rest, problems
	}
	return cfg, rest, nil
}

// jobIDEnv are the variables a job ID defaults from (otel.JobID).
var jobIDEnv = []string{"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "K8S_JOB_NAME"}

// anySet reports whether one of the variables is set to a value.
func anySet(lookupEnv func(string) (string, bool), names []string) bool {
	for _, n := range names {
		if v, ok := lookupEnv(n); ok && v != "" {
			return true
		}
	}
	return false
}

// lookup reads an environment variable: ok when it is set to a value, an
// error when it is set to nothing (or only blanks).
func lookup(lookupEnv func(string) (string, bool), name string) (v string, ok bool, err error) {
	v, set := lookupEnv(name)
	if !set {
		return "", false, nil
	}
	if strings.TrimSpace(v) == "" {
		return "", false, fmt.Errorf("empty value")
	}
	return v, true, nil
}

// MaxConfigFile bounds the configuration file: it is read whole, and a
// path such as /dev/zero must not exhaust memory.
const MaxConfigFile = 1 << 20

func loadFile(cmd Command, path string, cfg *Config) Problems {
	b, err := readConfigFile(path)
	if err != nil {
		return Problems{fmt.Sprintf("config file: %v", err)}
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return Problems{fmt.Sprintf("config file %s: %v", path, err)}
	}
	var problems Problems
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		i := slices.IndexFunc(options, func(o option) bool { return o.name == k })
		if i < 0 {
			problems = append(problems, fmt.Sprintf("config file %s: unknown key %q", path, k))
			continue
		}
		o := options[i]
		if !o.appliesTo(cmd) {
			// A shared file may hold keys for other commands (pid for
			// attach, out for demo); they do not apply here.
			continue
		}
		var s string
		switch v := m[k].(type) {
		case nil:
			// "probes: null" reads as YAML's null, not the probe set.
			problems = append(problems, fmt.Sprintf("config file %s: %s: no value (YAML null); quote it (%s: \"null\") or remove the key for the default", path, k, k))
			continue
		case string:
			if strings.TrimSpace(v) == "" {
				problems = append(problems, fmt.Sprintf("config file %s: %s: empty value; remove the key for the default", path, k))
				continue
			}
			s = v
		case bool, int, int64, uint64, float64:
			s = fmt.Sprint(v)
		default:
			problems = append(problems, fmt.Sprintf("config file %s: %s: want a scalar, got %T", path, k, v))
			continue
		}
		if err := o.set(cfg, s); err != nil {
			problems = append(problems, fmt.Sprintf("config file %s: %s: %v", path, k, err))
		}
	}
	return problems
}

// readConfigFile reads a regular file of at most MaxConfigFile bytes. It
// opens without blocking, so a FIFO with no writer cannot hang the start,
// and checks what it opened (not an earlier stat) before reading.
func readConfigFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxConfigFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxConfigFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxConfigFile)
	}
	return b, nil
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

// validate checks what no single value can: combinations, files that
// cannot be written, a regex that does not compile.
func (c *Config) validate(rest []string) Problems {
	var p Problems
	switch c.Command {
	case CmdRun:
		if len(c.Argv) == 0 {
			p = append(p, "run: no command given (usage: gaptrace run [flags] -- CMD ARGS...)")
		}
	case CmdAttach:
		switch {
		case c.PID != 0 && (c.Match != "" || c.GPUProcs):
			p = append(p, "attach: --pid excludes --match and --gpu-procs")
		case c.PID == 0 && c.Match == "" && !c.GPUProcs:
			p = append(p, "attach: one of --pid PID, --match REGEX or --gpu-procs is required")
		}
		if c.Match != "" {
			if _, err := regexp.Compile(c.Match); err != nil {
				p = append(p, fmt.Sprintf("--match: bad regular expression: %v", err))
			}
		}
	}
	if c.Redact != "" {
		if _, err := regexp.Compile(c.Redact); err != nil {
			p = append(p, fmt.Sprintf("--redact: bad regular expression: %v", err))
		}
	}
	if c.Command != CmdRun && len(rest) > 0 {
		p = append(p, fmt.Sprintf("%s: unexpected arguments: %s", c.Command, strings.Join(rest, " ")))
	}
	if c.Command == CmdCheck {
		if c.NVMLLib != "" {
			if _, err := os.Stat(c.NVMLLib); err != nil {
				p = append(p, fmt.Sprintf("--nvml-lib: %v", err))
			}
		}
		return p
	}
	if c.MinGap <= 0 {
		p = append(p, "--min-gap: must be positive")
	}
	if c.HangAfter < time.Second || c.HangAfter > 24*time.Hour {
		p = append(p, fmt.Sprintf("--hang-after %s: want 1s to 24h (checked once a second)", c.HangAfter))
	}
	if c.RingPoll < time.Millisecond || c.RingPoll > 200*time.Millisecond {
		p = append(p, fmt.Sprintf("--ring-poll %s: want 1ms to 200ms (gaps are emitted within a second)", c.RingPoll))
	}
	if c.Probes == "auto" {
		switch {
		case c.AutoWindow < 50*time.Millisecond || c.AutoWindow > 10*time.Minute:
			p = append(p, fmt.Sprintf("--auto-window %s: want 50ms to 10m (a window must hold a few steps)", c.AutoWindow))
		case c.AutoEvery < 2*c.AutoWindow || c.AutoEvery > 24*time.Hour:
			p = append(p, fmt.Sprintf("--auto-every %s: want at least twice --auto-window (%s) and at most 24h; use --probes full to keep the per-launch probes on", c.AutoEvery, c.AutoWindow))
		}
	}
	if c.Command == CmdDemo && c.DemoFor < 5*time.Second {
		p = append(p, "--demo-duration: must be at least 5s")
	}
	p = append(p, c.OutputProblems()...)
	if c.Command == CmdDemo {
		if err := creatableDir(c.OutDir); err != nil {
			p = append(p, fmt.Sprintf("--out %s: %v", c.OutDir, err))
		}
	}
	if c.Peers != "" {
		if host, port, err := net.SplitHostPort(c.Peers); err != nil {
			p = append(p, fmt.Sprintf("--peers %q: want HOST:PORT, the same for every sidecar of the job: %v", c.Peers, err))
		} else if host == "" {
			p = append(p, fmt.Sprintf("--peers %q: no host; want the address every sidecar of the job reaches, e.g. 10.0.0.5:29601", c.Peers))
		} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			p = append(p, fmt.Sprintf("--peers %q: bad port, want 1 to 65535", c.Peers))
		}
		if _, err := peers.LoadSecret(c.PeersSecret); err != nil {
			p = append(p, err.Error())
		}
	}
	if c.Prometheus != "" {
		if _, port, err := net.SplitHostPort(c.Prometheus); err != nil {
			p = append(p, fmt.Sprintf("--prometheus %q: want HOST:PORT or :PORT: %v", c.Prometheus, err))
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			p = append(p, fmt.Sprintf("--prometheus %q: bad port", c.Prometheus))
		}
	}
	for _, f := range []struct{ flag, path string }{
		{"nvml-lib", c.NVMLLib}, {"cuda-lib", c.CUDALib}, {"nccl-lib", c.NCCLLib},
	} {
		if f.path == "" {
			continue
		}
		if st, err := os.Stat(f.path); err != nil {
			p = append(p, fmt.Sprintf("--%s: %v", f.flag, err))
		} else if st.IsDir() {
			p = append(p, fmt.Sprintf("--%s %s: is a directory, want the library file", f.flag, f.path))
		}
	}
	if c.OTLPEndpoint != "" && strings.ContainsAny(c.OTLPEndpoint, " \t") {
		p = append(p, "--otlp-endpoint: contains whitespace")
	}
	if c.ServiceName == "" {
		p = append(p, "--service-name: must not be empty")
	}
	return p
}

// OutputProblems checks every output file the configuration names
// (CheckOutput); a command that fills in defaults (demo) checks again.
func (c *Config) OutputProblems() Problems {
	var p Problems
	for _, f := range []struct{ flag, path string }{
		{"gaps-out", c.GapsOut}, {"summary-json", c.SummaryJSON}, {"spans-out", c.SpansOut},
		{"windows-out", c.WindowsOut}, {"perfetto-out", c.PerfettoOut}, {"record", c.Record},
	} {
		if f.flag == "spans-out" && f.path == SpansNone {
			continue
		}
		if msg := CheckOutput(f.flag, f.path); msg != "" {
			p = append(p, msg)
		}
	}
	return p
}

// CheckOutput says why path cannot be written as the output of --flag
// ("" when it can, or when path is ""): its directory must exist and be
// writable, and the path must be nothing safefile refuses (a link, a
// FIFO, a device, a file with other names). The summary replaces its file
// by rename, so a symbolic link there is replaced, not written through; a
// link at any other output is refused, said before anything runs, as the
// streamed files must never follow one.
func CheckOutput(flag, path string) string {
	if path == "" {
		return ""
	}
	if safefile.Special(path) {
		// /dev/null, /dev/stdout, /dev/stderr, a FIFO: written as they are.
		if err := safefile.Check(path); err != nil {
			return fmt.Sprintf("--%s: %v", flag, err)
		}
		return ""
	}
	if err := writableDir(filepath.Dir(path)); err != nil {
		return fmt.Sprintf("--%s %s: %v", flag, path, err)
	}
	if err := safefile.Check(path); err != nil && (flag != "summary-json" || !isSymlink(path)) {
		return fmt.Sprintf("--%s: %v", flag, err)
	}
	return ""
}

func isSymlink(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && st.Mode()&os.ModeSymlink != 0
}

func writableDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("directory %s does not exist", dir)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return fmt.Errorf("directory %s is not writable: %w", dir, err)
	}
	return nil
}

// creatableDir accepts a directory that exists and is writable or whose
// nearest existing ancestor is writable.
func creatableDir(dir string) error {
	d := filepath.Clean(dir)
	for {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("%s is not a directory", d)
			}
			if err := unix.Access(d, unix.W_OK); err != nil {
				return fmt.Errorf("directory %s is not writable: %w", d, err)
			}
			return nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return fmt.Errorf("no existing parent directory")
		}
		d = parent
	}
}

// Options returns the flag names that apply to cmd, for help and docs.
func Options(cmd Command) []string {
	var names []string
	for _, o := range options {
		if o.appliesTo(cmd) {
			names = append(names, o.name)
		}
	}
	return names
}
