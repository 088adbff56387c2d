package config

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

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

func intVar(dst func(*Config) *int) binding {
	return binding{
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a whole number: %q", v)
			}
			*dst(c) = n
			return nil
		},
		get: func(c *Config) string { return strconv.Itoa(*dst(c)) },
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
	{name: "step-at", usage: "a step ends at each sync or blocking copy made with `SITE` on its stack: FILE:LINE (train.py:142) or a function name (train_step); the summary's step_clock names the site found when none is given",
		binding: binding{
			set: func(c *Config, v string) error {
				if _, err := stepclock.ParseSpec(v); err != nil {
					return err
				}
				c.StepAt = strings.TrimSpace(v)
				return nil
			},
			get: func(c *Config) string { return c.StepAt },
		}},
	{name: "cpu-sample-hz", usage: "how often per second each CPU samples the traced thread running on it (native and Python stack), to name the code that burned the gaps charged to the CPU or a lock; 0 turns sampling off",
		binding: intVar(func(c *Config) *int { return &c.CPUSampleHz })},
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
