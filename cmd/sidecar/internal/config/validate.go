package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

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
	if c.CPUSampleHz < 0 || c.CPUSampleHz > 1000 {
		p = append(p, fmt.Sprintf("--cpu-sample-hz %d: want 0 (off) to 1000", c.CPUSampleHz))
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
