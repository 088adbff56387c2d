package cli

import (
	"slices"
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
