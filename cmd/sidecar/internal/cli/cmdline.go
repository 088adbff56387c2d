package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

// Redacted replaces a secret in a command line.
const Redacted = "***"

// targetCmdline is what may be shown of pid's command line: every
// command line gaptrace reads from /proc and prints, logs or exports comes
// from here (run's own command goes through redactCmdline directly).
func targetCmdline(cfg *config.Config, pid int) []string {
	argv, _ := proc.Argv(pid)
	return redactCmdline(cfg, argv)
}

// redactCmdline applies --command-line and --redact to the target's
// command line before it goes into any span, metric, title, log line or
// check output.
func redactCmdline(cfg *config.Config, argv []string) []string {
	switch cfg.CommandLine {
	case "none":
		return nil
	case "name":
		if len(argv) == 0 {
			return nil
		}
		// A process that rewrote its title may hold its whole command
		// line in argv[0].
		name, _, _ := strings.Cut(strings.TrimSpace(argv[0]), " ")
		return []string{filepath.Base(name)}
	}
	out := slices.Clone(argv)
	if cfg.CommandLine != "full" {
		out = redactSecrets(out)
	}
	if cfg.Redact != "" {
		re := regexp.MustCompile(cfg.Redact) // validated by config
		for i := range out {
			out[i] = re.ReplaceAllString(out[i], Redacted)
		}
	}
	return out
}

// childEnv is the environment of the command gaptrace runs: gaptrace's own
// settings (GAPTRACE_*) and its OTLP exporter's (OTEL_EXPORTER_OTLP_*,
// which carry collector credentials in their headers) are not the
// command's business. A command that exports OTLP itself is given its own
// variables with env: gaptrace run -- env OTEL_EXPORTER_OTLP_ENDPOINT=… CMD.
func childEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, config.EnvPrefix) || strings.HasPrefix(kv, "OTEL_EXPORTER_OTLP_")
	})
}

// Exit codes of run for a command that cannot start, as a shell gives
// them: 127 not found, 126 found but not executable.
const (
	ExitNotExecutable = 126
	ExitNotFound      = 127
)

// findCommand resolves the command of run the way exec will.
func findCommand(name string) (int, error) {
	_, err := exec.LookPath(name)
	switch {
	case err == nil:
		return 0, nil
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return ExitNotFound, fmt.Errorf("command %q: not found", name)
	default:
		return ExitNotExecutable, fmt.Errorf("command %q: %w", name, err)
	}
}

// runExitCode is the exit policy of run (docs/security.md): the command's
// code, except that a command that succeeded does not hide an output
// gaptrace was asked to write and could not (a full disk): then 1. A
// failing command's own code always wins, and an unreachable collector
// never changes the code (OTLP export is best effort, counted and logged).
func runExitCode(code int, finishErr error) int {
	if code == 0 && len(safefile.FailedPaths(finishErr)) > 0 {
		return ExitFailure
	}
	return code
}
