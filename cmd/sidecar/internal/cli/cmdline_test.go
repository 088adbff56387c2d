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
		"WANDB_API_KEY=w3", "--db", "postgres://bob:pw4@db:5432/x", "--auth-file=/s/a", "--password", "--verbose", "--keep=5",
		"--note=run 7 id=abc123"}
	for _, tc := range []struct {
		mode, redact string
		want         []string
	}{
		{"redacted", "", []string{"/usr/bin/python3", "train.py", "--api-key=***", "--token", "***", "--lr", "0.1",
			"WANDB_API_KEY=***", "--db", "postgres://***@db:5432/x", "--auth-file=***", "--password", "--verbose", "--keep=5",
			"--note=run 7 id=abc123"}},
		{"redacted", `id=\w+`, []string{"/usr/bin/python3", "train.py", "--api-key=***", "--token", "***", "--lr", "0.1",
			"WANDB_API_KEY=***", "--db", "postgres://***@db:5432/x", "--auth-file=***", "--password", "--verbose", "--keep=5",
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

// Each rule of the redacted mode, one argv per case: what it hides, and
// look-alikes it must leave alone (a hidden learning rate or tokenizer
// makes the command line useless for the operator).
func TestRedactSecretsRules(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in, want []string
	}{
		// --name value, --name=value, NAME=value.
		{"separate value", []string{"--passphrase", "PP1"}, []string{"--passphrase", "***"}},
		{"token=", []string{"--token=tk1"}, []string{"--token=***"}},
		{"single-dash option", []string{"-password", "pw1"}, []string{"-password", "***"}},
		{"value starting with a dash", []string{"--password", "-dashPW3", "--lr", "1"}, []string{"--password", "***", "--lr", "1"}},
		{"next option is no value", []string{"--api-key", "--lr", "1"}, []string{"--api-key", "--lr", "1"}},
		{"end of options is no value", []string{"--token", "--", "x"}, []string{"--token", "--", "x"}},
		{"underscore name", []string{"--hf_token", "hf1"}, []string{"--hf_token", "***"}},
		{"camel case", []string{"--apiKey=k1", "--clientSecret", "s1"}, []string{"--apiKey=***", "--clientSecret", "***"}},
		{"glued name", []string{"--authtoken", "a1", "PGPASSWORD=p1"}, []string{"--authtoken", "***", "PGPASSWORD=***"}},
		{"java property", []string{"-Djavax.net.ssl.keyStorePassword=p2"}, []string{"-Djavax.net.ssl.keyStorePassword=***"}},
		{"key=value", []string{"api_key=k2", "db.password=p3"}, []string{"api_key=***", "db.password=***"}},
		{"environment assignments", []string{"env", "AWS_SECRET_ACCESS_KEY=s2", "AWS_ACCESS_KEY_ID=AKIA1", "HF_TOKEN=h1", "OPENAI_API_KEY=o1", "MYSQL_PWD=m1", "python"},
			[]string{"env", "AWS_SECRET_ACCESS_KEY=***", "AWS_ACCESS_KEY_ID=***", "HF_TOKEN=***", "OPENAI_API_KEY=***", "MYSQL_PWD=***", "python"}},
		// Headers: one argument each, as curl -H takes them.
		{"bearer header", []string{"curl", "-H", "Authorization: Bearer BB2"}, []string{"curl", "-H", "Authorization: Bearer ***"}},
		{"basic header", []string{"--header", "Authorization: Basic dXNlcjpwdw=="}, []string{"--header", "Authorization: Basic ***"}},
		{"api key header", []string{"-H", "X-Api-Key: xk1", "-H", "X-Auth-Token:xt1"}, []string{"-H", "X-Api-Key: ***", "-H", "X-Auth-Token:***"}},
		{"cookie header", []string{"-H", "Cookie: a=1; sid=c1"}, []string{"-H", "Cookie: ***"}},
		{"header=", []string{"--header=Authorization: Bearer BB3"}, []string{"--header=Authorization: Bearer ***"}},
		{"bare bearer", []string{"--extra", "Bearer BB4"}, []string{"--extra", "Bearer ***"}},
		{"otlp headers", []string{"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20h2,x-team=ml"},
			[]string{"OTEL_EXPORTER_OTLP_HEADERS=authorization=***,x-team=ml"}},
		// Inside one argument: URLs, queries, configuration strings.
		{"url userinfo", []string{"--db", "https://user:pass1@host/x", "--mirror=ftp://u:p@2@m/"}, []string{"--db", "https://***@host/x", "--mirror=ftp://***@m/"}},
		{"url query", []string{"--url", "https://h/v1?x=1&api_key=q1&y=2"}, []string{"--url", "https://h/v1?x=1&api_key=***&y=2"}},
		{"connection string", []string{"--conn=AccountName=a;AccountKey=ak1;Suffix=core"}, []string{"--conn=AccountName=a;AccountKey=***;Suffix=core"}},
		{"json", []string{"--cfg", `{"lr": 0.1, "api_key": "j1", "wd": 0}`}, []string{"--cfg", `{"lr": 0.1, "api_key": "***", "wd": 0}`}},
		{"nested pair", []string{"--opts=extra=token=n1"}, []string{"--opts=extra=token=***"}},
		// A script or a rewritten title: one argument, words split at white space.
		{"shell script", []string{"sh", "-c", "python train.py --token t5 --lr 0.1 && mysql -uroot -pPW5 db"},
			[]string{"sh", "-c", "python train.py --token *** --lr 0.1 && mysql -uroot -p*** db"}},
		{"rewritten title", []string{"python train.py --password=p6 --epochs 3"}, []string{"python train.py --password=*** --epochs 3"}},
		// Short options glued to their value: only for programs known to
		// take a password that way.
		{"mysql -p", []string{"/usr/bin/mysql", "-uroot", "-pPW4", "-p1"}, []string{"/usr/bin/mysql", "-uroot", "-p***", "-p***"}},
		{"mysql -p alone prompts", []string{"mysql", "-p", "dbname"}, []string{"mysql", "-p", "dbname"}},
		{"sshpass", []string{"sshpass", "-p", "sp1", "ssh", "host"}, []string{"sshpass", "-p", "***", "ssh", "host"}},
		{"curl -u", []string{"curl", "-u", "bob:cu1", "https://h", "--user=bob:cu2", "-ubob:cu3"},
			[]string{"curl", "-u", "***", "https://h", "--user=***", "-u***"}},
		{"--user elsewhere", []string{"python", "--user", "bob", "--user=alice"}, nil},
		{"redis-cli -a", []string{"redis-cli", "-a", "ra1"}, []string{"redis-cli", "-a", "***"}},
		// Look-alikes.
		{"tokenizer", []string{"--tokenizer", "gpt2", "--tokenizer_name=gpt2"}, nil},
		{"keys", []string{"--keys", "3", "--num-keys=7", "--keyframe", "5"}, nil},
		{"key dim", []string{"--key-dim", "64", "--token-budget", "512", "--max-tokens", "100"}, nil},
		{"author", []string{"--author", "bob", "--passes", "2", "--bypass", "x", "--session-dir", "/tmp/s"}, nil},
		{"negated option", []string{"--no-auth", "train.py"}, nil},
		{"short options elsewhere", []string{"python", "-p1", "-p", "8080", "-pPW4"}, nil},
		{"paths and urls", []string{"--out", "s3://bucket/key/token", "--url=http://host:8080/a?b=c", "KEYBOARD=us"}, nil},
		{"text", []string{"--note=run 7 id=abc123", "--msg", "key points: none"}, nil},
	} {
		want := tc.want
		if want == nil {
			want = tc.in
		}
		if got := redactSecrets(slices.Clone(tc.in)); !slices.Equal(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, want)
		}
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
