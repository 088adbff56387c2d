package main_test

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A Prometheus port that is already taken must not keep the job from
// running: gaptrace warns and traces without the endpoint.
func TestPrometheusPortTakenNeverBlocksTheJob(t *testing.T) {
	need(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--prometheus", ln.Addr().String(),
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--", "sh", "-c", "touch "+marker+"; exit 5")
	if code != 5 {
		t.Errorf("exit %d, want the command's 5\n%s", code, stderr)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Error("the command never ran")
	}
	if !strings.Contains(stderr, "prometheus endpoint not served") {
		t.Errorf("no warning about the taken port:\n%s", stderr)
	}
}

// attach --match must not pick another gaptrace whose own command line
// holds the same pattern, and bad settings fail with exit 2 at once.
func TestAttachMatchSkipsGaptraceAndBadSettingsFailFast(t *testing.T) {
	need(t)
	pattern := "zz-decoy-" + strconv.Itoa(os.Getpid())
	a := start(t, env(t), "attach", "--live", "off", "--match", pattern, "--duration", "8s", "--spans-out", filepath.Join(t.TempDir(), "a.jsonl"))
	b := start(t, env(t), "attach", "--live", "off", "--match", pattern, "--duration", "8s", "--spans-out", filepath.Join(t.TempDir(), "b.jsonl"))
	a.wait(t, 2*time.Minute)
	b.wait(t, 2*time.Minute)
	for _, p := range []*gtProc{a, b} {
		if strings.Contains(p.stderr.String(), "tracing matching process") {
			t.Errorf("attach --match traced another gaptrace:\n%s", p.stderr)
		}
	}

	for _, args := range [][]string{
		{"attach", "--pid", "1"},
		{"run", "--config", "/dev/zero", "--", "true"},
		{"run", "--otlp-endpoint", "ftp://collector:4317", "--", "true"},
	} {
		t0 := time.Now()
		code, _, stderr := runIn(t, t.TempDir(), env(t), args...)
		if code != 2 || time.Since(t0) > 10*time.Second || strings.Contains(stderr, "probes") {
			t.Errorf("%v: exit %d after %v, want 2 before anything loads\n%s", args, code, time.Since(t0), stderr)
		}
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory, unmounted
// when t ends; it skips t where mounting is not allowed.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// fillUp writes to a file in dir until the file system has no room left,
// and checks that a new byte does not fit.
func fillUp(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "probe"), []byte{1}, 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("%s is not full: a new byte gave %v", dir, err)
	}
	os.Remove(filepath.Join(dir, "probe")) // an empty file, if any
}

// badSetting is a setting gaptrace must refuse before anything loads: the
// flags or environment that make it, and what the refusal says.
type badSetting struct {
	args []string // before "--"
	env  []string
	says string
}

// assertRefusedBeforeLoading runs gaptrace run with each bad setting and
// checks it exits 2 saying why, without loading a probe or starting the
// command.
func assertRefusedBeforeLoading(t *testing.T, cases []badSetting) {
	t.Helper()
	for _, c := range cases {
		dir := t.TempDir()
		marker := filepath.Join(dir, "ran")
		args := append(append([]string{"run", "--live", "off"}, c.args...), "--", "touch", marker)
		code, _, stderr := runIn(t, dir, append(env(t), c.env...), args...)
		_, ran := os.Stat(marker)
		if code != 2 || !strings.Contains(stderr, c.says) || strings.Contains(stderr, "tracer loaded") || ran == nil {
			t.Errorf("%v %v: exit %d, command ran: %v; want exit 2 saying %q before anything loads\n%s",
				c.env, c.args, code, ran == nil, c.says, stderr)
		}
	}
}

// Settings that can only fail, or silently do nothing, are refused at the
// start with exit 2: a FIFO named as the configuration file, whose open
// would wait for a writer forever; an endpoint port no collector listens
// on; OTLP exporter variables the exporters would ignore; a GAPTRACE_*
// variable set to nothing, which would have been read as unset.
func TestBadSettingsRefusedBeforeLoading(t *testing.T) {
	need(t)
	fifo := filepath.Join(t.TempDir(), "config.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := []string{"--otlp-endpoint", "http://127.0.0.1:4318"}
	assertRefusedBeforeLoading(t, []badSetting{
		{args: []string{"--config", fifo}, says: "is not a regular file"},
		{env: []string{"GAPTRACE_CONFIG=" + fifo}, says: "is not a regular file"},
		{args: []string{"--otlp-endpoint", "http://127.0.0.1:99999"}, says: "bad port"},
		{args: endpoint, env: []string{"OTEL_EXPORTER_OTLP_TIMEOUT=abc"}, says: `OTEL_EXPORTER_OTLP_TIMEOUT="abc"`},
		{args: endpoint, env: []string{"OTEL_EXPORTER_OTLP_COMPRESSION=zstd"}, says: "want gzip or none"},
		{args: endpoint, env: []string{"OTEL_EXPORTER_OTLP_INSECURE=maybe"}, says: `OTEL_EXPORTER_OTLP_INSECURE="maybe"`},
		{args: endpoint, env: []string{"OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent"}, says: "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{args: endpoint, env: []string{"OTEL_METRICS_EXPORTER=bogus"}, says: `OTEL_METRICS_EXPORTER="bogus"`},
		{args: endpoint, env: []string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=abc"}, says: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		{args: endpoint, env: []string{"OTEL_EXPORTER_OTLP_METRICS_INSECURE=maybe"}, says: "OTEL_EXPORTER_OTLP_METRICS_INSECURE"},
		{env: []string{"GAPTRACE_PROBES="}, says: "$GAPTRACE_PROBES: empty value"},
		{args: []string{"--peers", "127.0.0.1:29601"}, says: "--peers 127.0.0.1:29601 needs --job-id"},
		{args: []string{"--peers", "node0", "--job-id", "j"}, says: `--peers "node0": want HOST:PORT`},
	})
}

// A full disk: every output keeps only whole lines or, for the summary and
// the trace, is not written at all (an earlier file is left as it was), no
// temporary file is left, nothing that failed is listed as written, the
// failure is logged when it happens, and run exits 1 although the command
// succeeded. The gaps, spans and summary fill a small disk as they go; the
// trace, the windows and the recording, in a second run, are written to a
// disk that is full from the start, each losing all it had to write.
func TestFullDisk(t *testing.T) {
	need(t)
	dir := mountTmpfs(t, 64<<10)
	gaps, spans, sum := filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "spans.jsonl"), filepath.Join(dir, "summary.json")
	code, stdout, stderr := runIn(t, t.TempDir(), env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--gaps-out", gaps, "--spans-out", spans, "--summary-json", sum, "--",
		filepath.Join(simgpuDir, "simtrain"), "--steps", "400", "--kernel-us", "500", "--stall", "io.read:every=2:ms=2", "--quiet")
	if code != 1 {
		t.Errorf("exit %d, want 1: the command succeeded but outputs were lost\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "no space left on device") {
		t.Errorf("the full disk is not reported:\n%s", stderr)
	}
	assertWholeLines(t, gaps, spans)
	assertNoTemporaryFiles(t, dir)
	if b, err := os.ReadFile(sum); err == nil && !json.Valid(b) {
		t.Errorf("partial summary.json: %q", b)
	} else if err != nil && !strings.Contains(stdout, "NOT written") {
		t.Errorf("summary.json missing but the summary does not say so:\n%s", stdout)
	}
	if !strings.Contains(stdout, "INCOMPLETE") {
		t.Errorf("no output is marked incomplete:\n%s", stdout)
	}

	// One output at a time, so that each one's loss alone decides the
	// exit code.
	full := mountTmpfs(t, 64<<10)
	trace := filepath.Join(full, "trace.json")
	const earlier = `{"traceEvents":[]}` + "\n"
	if err := os.WriteFile(trace, []byte(earlier), 0o600); err != nil {
		t.Fatal(err)
	}
	fillUp(t, full)
	for _, o := range []struct{ flag, path, said, listed string }{
		{"--perfetto-out", trace, "trace file write failed", "NOT written"},
		{"--record", filepath.Join(full, "run.rec"), "recording write failed", "INCOMPLETE"},
		{"--windows-out", filepath.Join(full, "windows.jsonl"), "windows file write failed", "INCOMPLETE"},
	} {
		scratch := t.TempDir()
		code, stdout, stderr := runIn(t, scratch, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
			"--spans-out", filepath.Join(scratch, "spans.jsonl"), o.flag, o.path, "--",
			filepath.Join(simgpuDir, "simtrain"), "--steps", "100", "--kernel-us", "500", "--stall", "io.read:every=2:ms=2", "--quiet")
		if code != 1 {
			t.Errorf("%s on a full disk: exit %d, want 1: the command succeeded but the output was lost\n%s", o.flag, code, stderr)
		}
		if !strings.Contains(stderr, "level=ERROR msg=\""+o.said) || !strings.Contains(stderr, "no space left on device") {
			t.Errorf("%s on a full disk: stderr does not say %q when it happens:\n%s", o.flag, o.said, stderr)
		}
		if want := o.path + " (" + o.listed; !strings.Contains(stdout, want) {
			t.Errorf("%s on a full disk: the summary's outputs do not list %q:\n%s", o.flag, want, stdout)
		}
		assertNoTemporaryFiles(t, full)
	}
	if b, err := os.ReadFile(trace); err != nil || string(b) != earlier {
		t.Errorf("the earlier trace at %s was replaced or removed by one that could not be written: %.80q %v", trace, b, err)
	}
	assertWholeLines(t, filepath.Join(full, "windows.jsonl"))
}

// assertWholeLines fails when a JSON-lines file ends in half a line or
// holds a line that is not whole JSON.
func assertWholeLines(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			t.Errorf("%s ends in half a line", p)
		}
		for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if line != "" && !json.Valid([]byte(line)) {
				t.Errorf("%s line %d is not whole JSON: %.80q", p, i+1, line)
			}
		}
	}
}

func assertNoTemporaryFiles(t *testing.T, dir string) {
	t.Helper()
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(left) > 0 {
		t.Errorf("temporary files left on the full disk: %v", left)
	}
}

// The spans file is capped and rotated; every kept file holds whole
// lines and no more files are kept than asked.
func TestSpansFileRotates(t *testing.T) {
	need(t)
	dir := t.TempDir()
	spans := filepath.Join(dir, "spans.jsonl")
	code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--spans-out", spans, "--spans-max-size", "64K", "--spans-keep", "2", "--",
		filepath.Join(simgpuDir, "simtrain"), "--steps", "3000", "--kernel-us", "500", "--stall", "io.read:every=2:ms=1", "--quiet",
		// Every step traced, however late the probes attach on a busy host:
		// the trainer creates its communicator, and waits for its probe,
		// before its first step.
		"--collectives", "1", "--await-probes", "30")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, p := range []string{spans, spans + ".1", spans + ".2"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v (3000 steps of spans are far more than three files of 64 KiB)", p, err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		for i, l := range lines {
			if !json.Valid([]byte(l)) {
				t.Fatalf("%s line %d is not whole JSON", p, i+1)
			}
		}
		// A batch that reaches the cap is split at a line: no file is
		// over it.
		if len(b) > 64<<10 {
			t.Errorf("%s: %d bytes in %d lines, over the 64 KiB cap", p, len(b), len(lines))
		}
	}
	if _, err := os.Stat(spans + ".3"); err == nil {
		t.Error("a third rotated file kept with --spans-keep 2")
	}
}
