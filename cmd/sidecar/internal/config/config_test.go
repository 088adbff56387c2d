package config

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLayering(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gaptrace.yaml")
	if err := os.WriteFile(file, []byte("probes: lite\nmin-gap: 3ms\nservice-name: from-file\nrank: 2\nsyscall-threshold: 20us\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	getenv := env(map[string]string{
		"GAPTRACE_CONFIG":       file,
		"GAPTRACE_MIN_GAP":      "5ms", // env beats file
		"GAPTRACE_SERVICE_NAME": "from-env",
	})
	cfg, _, err := Load(CmdRun, []string{"--service-name", "from-flag", "--", "python", "train.py", "--lr", "1"}, getenv, io.Discard)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.Probes != "lite" {
		t.Errorf("probes = %q, want lite (file)", cfg.Probes)
	}
	if cfg.MinGap != 5*time.Millisecond {
		t.Errorf("min-gap = %v, want 5ms (env over file)", cfg.MinGap)
	}
	if cfg.ServiceName != "from-flag" {
		t.Errorf("service-name = %q, want from-flag (flag over env)", cfg.ServiceName)
	}
	if cfg.Rank != 2 || cfg.SyscallThreshold != 20*time.Microsecond {
		t.Errorf("rank=%d threshold=%v, want 2 and 20us from the file", cfg.Rank, cfg.SyscallThreshold)
	}
	if got := strings.Join(cfg.Argv, " "); got != "python train.py --lr 1" {
		t.Errorf("argv = %q", got)
	}
	// Defaults survive where nothing overrides them.
	if cfg.OTLPProtocol != "" || cfg.Live != "auto" || cfg.Duration != 0 {
		t.Errorf("defaults lost: %+v", cfg)
	}
}

func TestConfigFlagBeatsEnvFile(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	b := filepath.Join(dir, "b.yaml")
	if err := os.WriteFile(a, []byte("probes: lite\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("probes: full\nmin-gap: 7ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Load(CmdRun, []string{"--config", b, "true"}, env(map[string]string{"GAPTRACE_CONFIG": a}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Probes != "full" || cfg.MinGap != 7*time.Millisecond || cfg.ConfigFile != b {
		t.Errorf("got probes=%s min-gap=%v file=%s, want b.yaml's values", cfg.Probes, cfg.MinGap, cfg.ConfigFile)
	}
}

func TestEveryProblemReportedAtOnce(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(file, []byte("probes: medium\nbogus-key: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := Load(CmdAttach, []string{
		"--config", file,
		"--min-gap", "soon",
		"--duration", "-3s",
		"--live", "sometimes",
		"--otlp-protocol", "carrier-pigeon",
		"--gaps-out", "/nonexistent-dir/gaps.jsonl",
		"--prometheus", "9464",
		"--peers", ":29601",
		"--pid", "12", "--match", "train(",
	}, env(map[string]string{"GAPTRACE_SYSCALL_THRESHOLD": "fast"}), io.Discard)
	var p Problems
	if !errors.As(err, &p) {
		t.Fatalf("want Problems, got %T %v", err, err)
	}
	want := []string{
		"probes", "bogus-key", "--min-gap", "--duration", "--live", "--otlp-protocol",
		"GAPTRACE_SYSCALL_THRESHOLD", "--gaps-out", "--prometheus", `--peers ":29601": no host`, "--peers needs --peers-secret-file", "needs --job-id", "--pid excludes",
		"regular expression",
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("problem about %q missing from:\n%s", w, msg)
		}
	}
	if len(p) != len(want) {
		t.Errorf("got %d problems, want %d:\n%s", len(p), len(want), msg)
	}
}

func TestCommandSpecificValidation(t *testing.T) {
	cases := []struct {
		cmd  Command
		args []string
		want string // "" = valid
	}{
		{CmdRun, nil, "no command given"},
		{CmdRun, []string{"--", "sleep", "1"}, ""},
		{CmdAttach, nil, "one of --pid PID, --match REGEX or --gpu-procs"},
		{CmdAttach, []string{"--pid", "abc"}, "not a process ID"},
		{CmdAttach, []string{"--pid", "1", "extra"}, "unexpected arguments"},
		{CmdAttach, []string{"--match", "python.*train"}, ""},
		{CmdAttach, []string{"--gpu-procs"}, ""},
		{CmdAttach, []string{"--gpu-procs", "--pid", "3"}, "--pid excludes"},
		{CmdCheck, []string{"--pid", "1"}, ""},
		{CmdDemo, []string{"--demo-duration", "1s"}, "at least 5s"},
		{CmdRun, []string{"--nvml-lib", "/no/such/libnvidia-ml.so.1", "true"}, "--nvml-lib"},
		{CmdRun, []string{"--min-gap", "0", "true"}, "must be positive"},
	}
	for _, tc := range cases {
		_, _, err := Load(tc.cmd, tc.args, env(nil), io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %v: unexpected error %v", tc.cmd, tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %v: error %v, want one mentioning %q", tc.cmd, tc.args, err, tc.want)
		}
	}
}

func TestUnknownFlagIsUsageError(t *testing.T) {
	_, _, err := Load(CmdRun, []string{"--no-such-flag", "true"}, env(nil), io.Discard)
	var u *UsageError
	if !errors.As(err, &u) {
		t.Fatalf("want *UsageError, got %T %v", err, err)
	}
}

func TestFlagOnlyForOtherCommand(t *testing.T) {
	// --match belongs to attach; run must reject it as a flag, and the
	// environment variable of a foreign option must be ignored.
	if _, _, err := Load(CmdRun, []string{"--match", "x", "true"}, env(nil), io.Discard); err == nil {
		t.Fatal("run accepted --match")
	}
	if _, _, err := Load(CmdRun, []string{"true"}, env(map[string]string{"GAPTRACE_MATCH": "x"}), io.Discard); err != nil {
		t.Fatalf("run failed on attach's env var: %v", err)
	}
}

func TestOTLPConfigured(t *testing.T) {
	c := Defaults(CmdRun)
	getenv := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if c.OTLPConfigured(getenv(nil)) {
		t.Fatal("no endpoint anywhere, yet configured")
	}
	if !c.OTLPConfigured(getenv(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})) {
		t.Fatal("standard OTEL variable ignored")
	}
}

func TestEnvNames(t *testing.T) {
	if got := EnvName("syscall-threshold"); got != "GAPTRACE_SYSCALL_THRESHOLD" {
		t.Fatal(got)
	}
	if got := EnvName("nvml-lib"); got != "GAPTRACE_NVML_LIB" {
		t.Fatal(got)
	}
}

// --help shows each option's default where there is one, and none for
// flags whose zero value the usage text already explains.
func TestHelpShowsDefaults(t *testing.T) {
	var out strings.Builder
	cfg := Defaults(CmdDemo)
	var problems Problems
	FlagSet(CmdDemo, &cfg, &problems, &out).PrintDefaults()
	help := out.String()
	for _, want := range []string{"[$GAPTRACE_DEMO_DURATION] (default 15s)", "[$GAPTRACE_PROBES] (default auto)",
		"[$GAPTRACE_MIN_GAP] (default 1ms)", "[$GAPTRACE_RANK] (default -1)", "[$GAPTRACE_OUT] (default out/demo)"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	for _, bad := range []string{"(default false)", "(default 0s)", `(default "")`} {
		if strings.Contains(help, bad) {
			t.Errorf("help shows %q", bad)
		}
	}
	if t.Failed() {
		t.Log(help)
	}
}

func TestConfigFileValuesAreNeverSilentlyIgnored(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, want string }{
		{"probes: null\n", `probes: no value (YAML null); quote it (probes: "null")`},
		{"probes:\n", "probes: no value"},
		{"gaps-out: \"\"\n", "gaps-out: empty value"},
		{"job-id: '  '\n", "job-id: empty value"},
	} {
		f := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(f, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := Load(CmdRun, []string{"--config", f, "--", "true"}, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a problem with %q", tc.yaml, err, tc.want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte("probes: \"null\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Load(CmdRun, []string{"--config", filepath.Join(dir, "q.yaml"), "--", "true"}, env(nil), io.Discard)
	if err != nil || cfg.Probes != "null" {
		t.Errorf("quoted null: probes %q, err %v", cfg.Probes, err)
	}
}

func TestConfigFileBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", MaxConfigFile)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A FIFO with no writer would block an open without O_NONBLOCK forever.
	fifo := filepath.Join(t.TempDir(), "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"/dev/zero": "not a regular file", fifo: "not a regular file", big: "larger than"} {
		done := make(chan error, 1)
		go func() {
			_, _, err := Load(CmdRun, []string{"--config", path, "--", "true"}, env(nil), io.Discard)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("--config %s: %v, want %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("--config %s is still being read", path)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1024": 1024, "16K": 16 << 10, "256M": 256 << 20, "1G": 1 << 30, "2GiB": 2 << 30, "10mb": 10 << 20} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1.5G", "99999999999T"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
	if c := Defaults(CmdRun); c.SpansMaxSize != DefaultSpansMaxSize || c.SpansKeep != 1 {
		t.Errorf("defaults %d/%d", c.SpansMaxSize, c.SpansKeep)
	}
}

// TestAutoSchedule: the auto probe set's window and period are checked
// against each other; under another probe set they are not used.
func TestAutoSchedule(t *testing.T) {
	for _, c := range []struct {
		args []string
		bad  string
	}{
		{[]string{"--auto-window", "1s", "--auto-every", "30s"}, ""},
		{[]string{"--auto-window", "10ms"}, "--auto-window"},
		{[]string{"--auto-window", "20m"}, "--auto-window"},
		{[]string{"--auto-window", "2s", "--auto-every", "3s"}, "--auto-every"},
		{[]string{"--auto-every", "48h"}, "--auto-every"},
		{[]string{"--auto-every", "0s"}, "--auto-every"},
		{[]string{"--auto-every", "soon"}, "--auto-every"},
		{[]string{"--probes", "full", "--auto-every", "0s"}, ""},
	} {
		cfg, _, err := Load(CmdRun, append(c.args, "--", "true"), env(nil), io.Discard)
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("%v: error %v, want one about %s", c.args, err, c.bad)
		case c.bad == "" && c.args[0] == "--auto-window" && (cfg.AutoWindow != time.Second || cfg.AutoEvery != 30*time.Second || cfg.Probes != "auto"):
			t.Errorf("%v: window %v every %v probes %s", c.args, cfg.AutoWindow, cfg.AutoEvery, cfg.Probes)
		}
	}
}

// TestRingPoll: the reader's own look at the ring buffer is bounded: under
// 1 ms it would spin, over 200 ms events would wait past the emission
// promise's margin.
func TestRingPoll(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
		bad  bool
	}{
		{nil, 20 * time.Millisecond, false},
		{[]string{"--ring-poll", "20ms"}, 20 * time.Millisecond, false},
		{[]string{"--ring-poll", "500us"}, 0, true},
		{[]string{"--ring-poll", "1s"}, 0, true},
	} {
		cfg, _, err := Load(CmdRun, append(c.args, "--", "true"), env(nil), io.Discard)
		switch {
		case c.bad && (err == nil || !strings.Contains(err.Error(), "--ring-poll")):
			t.Errorf("%v: error %v, want one about --ring-poll", c.args, err)
		case !c.bad && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case !c.bad && cfg.RingPoll != c.want:
			t.Errorf("%v: ring poll %v, want %v", c.args, cfg.RingPoll, c.want)
		}
	}
	cfg, _, err := Load(CmdRun, []string{"--", "true"}, env(map[string]string{"GAPTRACE_RING_POLL": "10ms"}), io.Discard)
	if err != nil || cfg.RingPoll != 10*time.Millisecond {
		t.Errorf("GAPTRACE_RING_POLL=10ms: %v, %v", cfg.RingPoll, err)
	}
}

// A variable set to nothing is a problem, as an empty value in the file
// is; every one is said at once. Unset, the default holds; a variable of
// an option the command does not have is not read, empty or not.
func TestEmptyEnvironmentValues(t *testing.T) {
	_, _, err := Load(CmdRun, []string{"--", "true"}, env(map[string]string{
		"GAPTRACE_PROBES": "", "GAPTRACE_MIN_GAP": "  ", "GAPTRACE_CONFIG": "", "GAPTRACE_PID": "",
	}), io.Discard)
	for _, want := range []string{"$GAPTRACE_PROBES: empty value", "$GAPTRACE_MIN_GAP: empty value", "$GAPTRACE_CONFIG: empty value"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v, want %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "GAPTRACE_PID") {
		t.Errorf("run read attach's GAPTRACE_PID: %v", err)
	}
	cfg, _, err := Load(CmdRun, []string{"--", "true"}, env(nil), io.Discard)
	if err != nil || cfg.Probes != "auto" {
		t.Errorf("unset: probes %q, %v; want the default", cfg.Probes, err)
	}
}

// --peers needs a secret file, from the flag, the environment or the
// configuration file: one that exists, only its owner may read, of at
// least 32 bytes; each refusal says how to make one.
func TestPeersSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==\n", 0o600)
	yaml := write("gaptrace.yaml", "peers: 127.0.0.1:29601\njob-id: j\npeers-secret-file: "+good+"\n", 0o644)
	base := []string{"--peers", "127.0.0.1:29601", "--job-id", "j", "--pid", "1"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // "" accepted
	}{
		{name: "none", args: base, want: "head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"},
		{name: "flag", args: append(base, "--peers-secret-file", good)},
		{name: "env", args: base, env: map[string]string{"GAPTRACE_PEERS_SECRET_FILE": good}},
		{name: "yaml", args: []string{"--config", yaml, "--pid", "1"}},
		{name: "missing", args: append(base, "--peers-secret-file", filepath.Join(dir, "nope")), want: "no such file"},
		{name: "group readable", args: append(base, "--peers-secret-file", write("g", strings.Repeat("s", 40), 0o640)), want: "chmod 600"},
		{name: "world readable", args: append(base, "--peers-secret-file", write("w", strings.Repeat("s", 40), 0o604)), want: "mode 0604"},
		{name: "short", args: append(base, "--peers-secret-file", write("s", "tiny\n", 0o600)), want: "at least 32"},
		{name: "directory", args: append(base, "--peers-secret-file", dir), want: "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := Load(CmdAttach, tc.args, env(tc.env), io.Discard)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && cfg.PeersSecret != good:
				t.Errorf("secret file %q, want %q", cfg.PeersSecret, good)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err %v, want %q in it", err, tc.want)
			}
		})
	}
}

// An output naming an existing file of another user is refused before
// anything runs (as root, it was truncated and filled, and its owner could
// read it); /dev/null and /dev/stdout are accepted, for a non-root user
// too, though /dev is not theirs to write.
func TestOutputOwnership(t *testing.T) {
	if msg := CheckOutput("gaps-out", "/dev/null"); msg != "" {
		t.Errorf("/dev/null: %s", msg)
	}
	if msg := CheckOutput("summary-json", "/dev/stdout"); msg != "" {
		t.Errorf("/dev/stdout: %s", msg)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	p := filepath.Join(t.TempDir(), "gaps.jsonl")
	if err := os.WriteFile(p, []byte("theirs\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if msg := CheckOutput("gaps-out", p); !strings.Contains(msg, "belongs to uid 65534") {
		t.Errorf("another user's file: %q, want a refusal naming its owner", msg)
	}
}

func TestHangAfter(t *testing.T) {
	cfg, _, err := Load(CmdRun, []string{"true"}, env(map[string]string{"GAPTRACE_HANG_AFTER": "30s"}), io.Discard)
	if err != nil || cfg.HangAfter != 30*time.Second {
		t.Fatalf("GAPTRACE_HANG_AFTER=30s: %v %v", cfg.HangAfter, err)
	}
	if cfg, _, err := Load(CmdRun, []string{"true"}, env(nil), io.Discard); err != nil || cfg.HangAfter != 2*time.Minute {
		t.Fatalf("default: %v %v", cfg.HangAfter, err)
	}
	for _, bad := range []string{"0s", "500ms", "25h"} {
		_, _, err := Load(CmdRun, []string{"--hang-after", bad, "true"}, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--hang-after") {
			t.Errorf("--hang-after %s: %v, want a problem naming the flag", bad, err)
		}
	}
}

func TestStepAt(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // the value, or the error's words
		bad  bool
	}{
		{[]string{"--step-at", "train.py:142", "true"}, nil, "train.py:142", false},
		{[]string{"--step-at", "train_step", "true"}, nil, "train_step", false},
		{[]string{"true"}, map[string]string{"GAPTRACE_STEP_AT": "Trainer.step"}, "Trainer.step", false},
		{[]string{"--step-at", "train.py:0", "true"}, nil, "line must be a positive number", true},
		{[]string{"--step-at", "train.py", "true"}, nil, "FILE:LINE", true},
		{[]string{"--step-at", "train.py:", "true"}, nil, "no line after the colon", true},
		{[]string{"true"}, map[string]string{"GAPTRACE_STEP_AT": "a b"}, "holds a space", true},
	} {
		cfg, _, err := Load(CmdRun, tc.args, env(tc.env), io.Discard)
		switch {
		case tc.bad && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(strings.ToLower(err.Error()), "step")):
			t.Errorf("%v %v: error %v, want one naming step-at and %q", tc.args, tc.env, err, tc.want)
		case !tc.bad && (err != nil || cfg.StepAt != tc.want):
			t.Errorf("%v %v: StepAt %q, %v; want %q", tc.args, tc.env, cfg.StepAt, err, tc.want)
		}
	}
}
