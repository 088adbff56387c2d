package main_test

import (
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestLiveViewUnknownTerminalSize: on a pseudo-terminal of 0x0 (what
// script(1) makes without a terminal) the frame cannot be drawn; gaptrace
// says so once and prints the periodic status line instead of nothing
// until the summary.
func TestLiveViewUnknownTerminalSize(t *testing.T) {
	need(t)
	cmd, out, copied := onTerminal(t, 0, append([]string{gaptraceBin, "run", "--live", "on", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--"},
		simtrain("--steps", "400", "--kernel-us", "2000", "--kernels-per-step", "10", "--stall", "io.write:every=20:ms=40", "--quiet")...)...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if !exitStatusOnly(err) {
			t.Fatalf("wait for gaptrace: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("gaptrace did not exit:\n%s", out.String())
	}
	select {
	case <-copied:
	case <-time.After(time.Minute):
	}
	o := out.String()
	if n := strings.Count(o, "the terminal reports no size"); n != 1 {
		t.Errorf("the fallback was noted %d times, want once:\n%s", n, o)
	}
	sum := strings.Index(o, "\nsummary\r\n") // the terminal ends lines with CR LF
	status := strings.Index(o, "gaptrace elapsed=")
	if sum < 0 || status < 0 || status > sum {
		t.Errorf("no status line before the summary:\n%s", o)
	}
	if strings.Contains(o, "\x1b[1;") {
		t.Errorf("a scroll region set on a terminal of unknown size:\n%q", o)
	}
}

var logTime = regexp.MustCompile(`time=(\S+)`)

// stampOf is the time of the first log line matching re.
func stampOf(t *testing.T, log string, re string) time.Time {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if regexp.MustCompile(re).MatchString(line) {
			if m := logTime.FindStringSubmatch(line); m != nil {
				ts, err := time.Parse(time.RFC3339Nano, m[1])
				if err == nil {
					return ts
				}
			}
		}
	}
	t.Fatalf("no log line matches %q:\n%s", re, log)
	return time.Time{}
}

// TestDeadOTLPEndpointSaidWhileTracing: a collector that is not there is
// said within seconds of the first export, counted in the status line,
// and the summary does not list it as an output that received the spans.
func TestDeadOTLPEndpointSaidWhileTracing(t *testing.T) {
	need(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	args := append([]string{"run", "--live", "auto", "--otlp-endpoint", "http://" + addr, "--otlp-insecure",
		"--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--"},
		simtrain("--steps", "400", "--kernel-us", "2000", "--kernels-per-step", "10", "--stall", "io.write:every=20:ms=40", "--quiet")...)
	code, stdout, stderr := runGaptrace(t, append(env(t), "OTEL_METRICS_EXPORTER=none"), args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	attachedAt := stampOf(t, stderr, `uprobes attached.*libcuda`)
	warnedAt := stampOf(t, stderr, `level=WARN msg="span export failed`)
	stoppedAt := stampOf(t, stderr, `msg="detaching probes"`)
	// The first batch leaves 2 s (the batch timeout) after the first
	// spans; the warning follows its failure, well before the end.
	if !warnedAt.Before(stoppedAt) || warnedAt.Sub(attachedAt) > 15*time.Second {
		t.Errorf("warned %v after the probes attached and %v before tracing stopped: want while tracing, within seconds",
			warnedAt.Sub(attachedAt), stoppedAt.Sub(warnedAt))
	}
	if n := strings.Count(stderr, `msg="span export failed`); n != 1 {
		t.Errorf("warned %d times in one run, want once (rate-limited)", n)
	}
	if !regexp.MustCompile(`gaptrace elapsed=.* export_errors=[1-9]\d* export_dropped=\d+ export_failing=true`).MatchString(stdout) {
		t.Errorf("no status line counts the failing export:\n%s", stdout)
	}
	if !regexp.MustCompile(`(?m)^  OTLP +http://` + regexp.QuoteMeta(addr) + ` \(NOT reached: [1-9]\d* failed exports`).MatchString(stdout) {
		t.Errorf("the summary lists the dead endpoint as an output:\n%s", stdout)
	}
}
