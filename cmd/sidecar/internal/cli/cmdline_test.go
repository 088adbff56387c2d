package cli

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
)

func TestRedactCmdline(t *testing.T) {
	argv := []string{"/usr/bin/python3", "train.py", "--api-key=sk-live-1", "--token", "tok2", "--lr", "0.1",
		"WANDB_API_KEY=w3", "--db", "postgres://bob:pw4@db:5432/x", "--auth-file=/s/a", "--password", "-x", "--keep=5",
		"--note=run 7 id=abc123"}
	for _, tc := range []struct {
		mode, redact string
		want         []string
	}{
		{"redacted", "", []string{"/usr/bin/python3", "train.py", "--api-key=***", "--token", "***", "--lr", "0.1",
			"WANDB_API_KEY=***", "--db", "postgres://***@db:5432/x", "--auth-file=***", "--password", "-x", "--keep=5",
			"--note=run 7 id=abc123"}},
		{"redacted", `id=\w+`, []string{"/usr/bin/python3", "train.py", "--api-key=***", "--token", "***", "--lr", "0.1",
			"WANDB_API_KEY=***", "--db", "postgres://***@db:5432/x", "--auth-file=***", "--password", "-x", "--keep=5",
			"--note=run 7 ***"}},
		{"name", "", []string{"python3"}},
		{"none", "", nil},
		{"full", "", argv},
	} {
		cfg := config.Defaults(config.CmdRun)
		cfg.CommandLine, cfg.Redact = tc.mode, tc.redact
		got := redactCmdline(&cfg, argv)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s %q:\n got %q\nwant %q", tc.mode, tc.redact, got, tc.want)
		}
	}
	if argv[2] != "--api-key=sk-live-1" {
		t.Error("redaction changed the command that runs")
	}
}

func TestChildEnvDropsGaptraceSettings(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer x", "GAPTRACE_JOB_ID=j",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://c", "OTEL_SERVICE_NAME=trainer", "RANK=0"})
	want := []string{"PATH=/bin", "OTEL_SERVICE_NAME=trainer", "RANK=0"}
	if !slices.Equal(got, want) || strings.Contains(strings.Join(got, " "), "Bearer") {
		t.Errorf("child env %q, want %q", got, want)
	}
}

func TestAttachRefusesWholeHostTargets(t *testing.T) {
	h := newHarness(t)
	for _, pid := range []int{1, os.Getpid(), os.Getppid()} {
		h.stderr.b.Reset()
		code := h.main(context.Background(), "attach", "--pid", strconv.Itoa(pid))
		if code != ExitUsage || !strings.Contains(h.stderr.String(), "--force") {
			t.Errorf("attach --pid %d: exit %d, want 2 asking for --force\n%s", pid, code, h.stderr.String())
		}
	}
	if h.pipe.runs != 0 || len(h.pipe.traced) != 0 {
		t.Error("pipeline used for a refused target")
	}
	if !isGaptrace(os.Getpid()) {
		t.Error("isGaptrace does not recognise a process running this binary")
	}
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, sleep)
	if isGaptrace(sleep.Process.Pid) {
		t.Error("isGaptrace claims sleep")
	}
}

// A bad exporter setting is a configuration error, found before any
// probe loads.
func TestBadOTLPSettingsRefusedBeforeLoading(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--otlp-endpoint", "ftp://user:pw@collector:4317", "--", "true"},
		{"run", "--otlp-endpoint", "collector", "--", "true"},
		{"run", "--prometheus", "127.0.0.1:99999", "--", "true"},
	} {
		h := newHarness(t)
		code := h.main(context.Background(), args...)
		if code != ExitUsage || !strings.Contains(h.stderr.String(), "invalid configuration") {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, h.stderr.String())
		}
		if strings.Contains(h.stderr.String(), "pw") {
			t.Errorf("%v: the endpoint's password is printed:\n%s", args, h.stderr.String())
		}
		if h.pipe != nil && h.pipe.runs != 0 {
			t.Errorf("%v: pipeline built", args)
		}
	}
}

// The OTLP exporters' own variables, which they would ignore when
// malformed, and endpoints whose port no collector listens on are
// configuration errors too, said with the configuration's other problems
// in one round, before any pipeline is built.
func TestBadExporterEnvironmentRefusedBeforeLoading(t *testing.T) {
	endpoint := []string{"--otlp-endpoint", "http://collector:4318"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		says string
	}{
		{nil, []string{"--otlp-endpoint", "http://collector:99999"}, "bad port"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:99999"}, nil, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}, endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "abc"}, endpoint, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, endpoint, "want gzip or none"},
		{map[string]string{"OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "zstd"}, endpoint, "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"},
		{map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "maybe"}, endpoint, "want true or false"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent"}, endpoint, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{map[string]string{"OTEL_METRICS_EXPORTER": "bogus"}, endpoint, "OTEL_METRICS_EXPORTER"},
	} {
		h := newHarness(t)
		for k, v := range tc.env {
			t.Setenv(k, v) // read by the exporter's package from the process environment
		}
		args := append(append([]string{"run"}, tc.args...), "--", "true")
		code := h.main(context.Background(), args...)
		if code != ExitUsage || !strings.Contains(h.stderr.String(), tc.says) || h.pipe.pc.Config != nil {
			t.Errorf("%v %v: exit %d, pipeline built: %v; want 2 saying %q\n%s", tc.env, tc.args, code,
				h.pipe.pc.Config != nil, tc.says, h.stderr.String())
		}
		for k := range tc.env {
			t.Setenv(k, "")
		}
	}

	// With a problem of the configuration's own, every one at once.
	h := newHarness(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "abc")
	code := h.main(context.Background(), "run", "--min-gap", "0", "--otlp-endpoint", "http://collector:99999", "--", "true")
	for _, want := range []string{"--min-gap", "bad port", "OTEL_EXPORTER_OTLP_TIMEOUT"} {
		if code != ExitUsage || !strings.Contains(h.stderr.String(), want) {
			t.Errorf("exit %d; want 2 saying %q among every problem\n%s", code, want, h.stderr.String())
		}
	}
}
