package config

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"
)

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
