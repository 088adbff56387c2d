package main_test

// The adversarial tier: gaptrace runs as root beside code it does not
// control. Each test plays the hostile side (a planted link, a file name
// made of terminal escapes, a secret on the command line, a collector that
// never answers) against the built binary and checks what the operator's
// system, terminal and telemetry receive.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cilium/ebpf/link"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// runIn runs gaptrace in dir and returns its exit code and output.
func runIn(t *testing.T, dir string, environ []string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(gaptraceBin, args...)
	cmd.Dir, cmd.Env = dir, environ
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		testutil.KillGroup(t, cmd.Process.Pid)
		<-done
		t.Fatalf("gaptrace %v did not exit\n%s\n%s", args, &stdout, &stderr)
	}
	if !exitStatusOnly(waitErr) {
		t.Fatalf("wait for gaptrace %v: %v", args, waitErr)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func victimFile(t *testing.T) string {
	t.Helper()
	v := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(v, []byte("not gaptrace's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return v
}

func assertUntouched(t *testing.T, victim string) {
	t.Helper()
	if b, err := os.ReadFile(victim); err != nil || string(b) != "not gaptrace's\n" {
		t.Errorf("a file gaptrace was never told to write changed: %.80q %v", b, err)
	}
}

// assertOwnerGroupOnly fails unless path is a regular file (not a link)
// of mode 0640 or stricter: outputs name the job's files and hosts.
func assertOwnerGroupOnly(t *testing.T, path string) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&^0o640 != 0 {
		t.Errorf("%s: %v, want a regular file of mode 0640 or stricter", path, st.Mode())
	}
}

// A symbolic link planted where an output goes must never be written
// through; gaptrace refuses before anything loads (exit 2), or, for the
// summary, replaces the link itself. What it creates is mode 0640 or
// stricter.
func TestPlantedSymlinksNeverWrittenThrough(t *testing.T) {
	need(t)
	victim := victimFile(t)
	for _, flag := range []string{"--gaps-out", "--spans-out", "--windows-out", "--perfetto-out", "--record"} {
		dir := t.TempDir()
		link := filepath.Join(dir, "out.jsonl")
		symlink(t, victim, link)
		code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", flag, link, "--", "true")
		if code != 2 || !strings.Contains(stderr, "symbolic link") {
			t.Errorf("%s through a symlink: exit %d, want 2 with a clear refusal\n%s", flag, code, stderr)
		}
	}
	// The default spans file, in the current directory.
	dir := t.TempDir()
	symlink(t, victim, filepath.Join(dir, "gaptrace-spans.jsonl"))
	code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--", "true")
	if code != 2 || !strings.Contains(stderr, "symbolic link") || !strings.Contains(stderr, "--spans-out") {
		t.Errorf("default spans file through a symlink: exit %d, want 2 naming --spans-out\n%s", code, stderr)
	}
	// GAPTRACE_PPROF's two files: the heap profile is written at exit,
	// but refused at the start like the rest.
	for _, ext := range []string{".cpu", ".heap"} {
		dir := t.TempDir()
		prof := filepath.Join(dir, "prof")
		symlink(t, victim, prof+ext)
		code, _, stderr := runIn(t, dir, append(env(t), "GAPTRACE_PPROF="+prof), "run", "--live", "off",
			"--spans-out", filepath.Join(dir, "spans.jsonl"), "--", "true")
		if code != 2 || !strings.Contains(stderr, "GAPTRACE_PPROF") || !strings.Contains(stderr, "symbolic link") {
			t.Errorf("GAPTRACE_PPROF with a symlink at %s: exit %d, want 2 with a clear refusal\n%s", prof+ext, code, stderr)
		}
	}
	assertUntouched(t, victim)

	// Every file a run creates, with links at the summary's name and at
	// its old fixed temporary name.
	dir = t.TempDir()
	sum := filepath.Join(dir, "summary.json")
	symlink(t, victim, sum)
	symlink(t, victim, sum+".tmp")
	outs := map[string]string{"--summary-json": sum}
	for flag, name := range map[string]string{"--spans-out": "spans.jsonl", "--gaps-out": "gaps.jsonl",
		"--windows-out": "windows.jsonl", "--perfetto-out": "trace.json", "--record": "run.rec"} {
		outs[flag] = filepath.Join(dir, name)
	}
	args := []string{"run", "--live", "off"}
	for flag, p := range outs {
		args = append(args, flag, p)
	}
	prof := filepath.Join(dir, "prof")
	code, _, stderr = runIn(t, dir, append(env(t), "GAPTRACE_PPROF="+prof), append(args, "--", "true")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	assertUntouched(t, victim)
	for _, p := range append(slices.Collect(maps.Values(outs)), prof+".cpu", prof+".heap") {
		assertOwnerGroupOnly(t, p)
	}

	// convert: a link at its output is refused; one at the old fixed
	// temporary name OUT.tmp means nothing.
	gaps := filepath.Join(dir, "saved-gaps.jsonl")
	if err := os.WriteFile(gaps, []byte(`{"start_unix_nano":1700000000000000000,"duration_ns":5000000,"cause":"io.read","pid":7}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "converted.json")
	symlink(t, victim, trace)
	code, _, stderr = runIn(t, dir, nil, "convert", "--from", gaps, "--perfetto-out", trace)
	if code != 2 || !strings.Contains(stderr, "symbolic link") {
		t.Errorf("convert through a symlink: exit %d, want 2 with a clear refusal\n%s", code, stderr)
	}
	trace = filepath.Join(dir, "converted2.json")
	symlink(t, victim, trace+".tmp")
	code, _, stderr = runIn(t, dir, nil, "convert", "--from", gaps, "--perfetto-out", trace)
	if code != 0 {
		t.Errorf("convert beside a link at %s.tmp: exit %d, want 0\n%s", trace, code, stderr)
	}
	assertOwnerGroupOnly(t, trace)
	assertUntouched(t, victim)
}

// The files demo writes under --out, and replay's outputs, are refused
// as the named outputs of run are: exit 2, said before anything runs, the
// planted file untouched.
func TestUnsafeOutputsUnderDemoAndReplayExitTwo(t *testing.T) {
	need(t)
	victim := victimFile(t)
	out := t.TempDir()
	symlink(t, victim, filepath.Join(out, "gaptrace-trace.json"))
	// A FIFO is written as it is when it is the user's own (a reader on
	// purpose); another user's is refused.
	if err := syscall.Mkfifo(filepath.Join(out, "gaptrace-gaps.jsonl"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(out, "gaptrace-gaps.jsonl"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runIn(t, t.TempDir(), env(t), "demo", "--live", "off", "--out", out)
	if code != 2 || !strings.Contains(stderr, "gaptrace-trace.json is a symbolic link") ||
		!strings.Contains(stderr, "gaptrace-gaps.jsonl belongs to uid 65534") ||
		strings.Contains(stderr, "tracing the simulated trainer") {
		t.Errorf("demo --out with a link and a FIFO at its files: exit %d, want 2 naming both before anything runs\n%s", code, stderr)
	}

	rec, err := filepath.Abs("../../correlate/testdata/recordings/h200-acc-full.rec.gz")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "gaps.jsonl")
	symlink(t, victim, link)
	code, _, stderr = runIn(t, dir, nil, "replay", rec, "--gaps-out", link)
	if code != 2 || !strings.Contains(stderr, "symbolic link") {
		t.Errorf("replay --gaps-out through a symlink: exit %d, want 2 with a clear refusal\n%s", code, stderr)
	}
	assertUntouched(t, victim)
}

// otlpCollector is an OTLP/HTTP collector that decodes what it receives,
// as a real one does: an undecodable request is a lost batch.
type otlpCollector struct {
	mu    sync.Mutex
	reqs  []*coltrace.ExportTraceServiceRequest
	bad   int
	calls int
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.URL.Path == "/v1/traces" {
		c.calls++
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			c.bad++
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.reqs = append(c.reqs, &req)
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// attrs returns every attribute as "key=value" and the span count.
func (c *otlpCollector) attrs() ([]string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	n := 0
	add := func(kvs []*commonpb.KeyValue) {
		for _, kv := range kvs {
			out = append(out, kv.Key+"="+kv.GetValue().GetStringValue())
		}
	}
	for _, r := range c.reqs {
		for _, rs := range r.ResourceSpans {
			add(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					n++
					add(s.Attributes)
				}
			}
		}
	}
	return out, n
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A hostile trainer: its data directory's name is terminal escapes (title,
// OSC 52 clipboard, clear screen), a forged log line and bytes that are
// not UTF-8; its command line carries secrets; the environment carries
// the collector's credentials. Every span must still arrive, with valid
// UTF-8 and no secret; the terminal must get no escape sequence; the
// trainer must not see gaptrace's OTLP headers.
func TestHostileTrainer(t *testing.T) {
	need(t)
	col := &otlpCollector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	endpoint := "http://alice:pw-in-url@" + u.Host

	dir := t.TempDir()
	hostile := filepath.Join(dir, "d\x1b]0;owned\x07\x1b]52;c;aGk=\x07\x1b[2J\nlevel=ERROR msg=forged\xff")
	envFile := filepath.Join(dir, "env.txt")
	prom := freePort(t)
	script := `env > "$2"; exec "$0" --steps 300 --kernel-us 3000 --stall io.read:every=2:ms=20 --quiet --data-dir "$1"`
	// --live auto on a pipe: the log-line mode, every 5 s.
	args := []string{"run", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf", "--prometheus", prom,
		"--summary-json", filepath.Join(dir, "summary.json"),
		"--", "sh", "-c", script, filepath.Join(simgpuDir, "simtrain"), hostile, envFile,
		"--api-key=hunter2-secret", "--token", "tok-secret"}
	environ := append(env(t), "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20hdr-secret", "OTEL_METRICS_EXPORTER=none")
	p := start(t, environ, args...)

	// target_info while the job runs.
	var targetInfo string
	for deadline := time.Now().Add(60 * time.Second); targetInfo == "" && time.Now().Before(deadline); {
		if resp, err := http.Get("http://" + prom + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "target_info{") {
					targetInfo = l
				}
			}
		}
		select {
		case <-p.done:
			deadline = time.Time{}
		case <-time.After(100 * time.Millisecond):
		}
	}
	code := p.wait(t, 3*time.Minute)
	stdout, stderr := p.stdout.String(), p.stderr.String()
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}

	attrs, spans := col.attrs()
	if spans == 0 || col.bad != 0 {
		t.Fatalf("collector decoded %d spans in %d requests, %d undecodable", spans, col.calls, col.bad)
	}
	all := strings.Join(attrs, "\n")
	for _, a := range attrs {
		if !utf8.ValidString(a) {
			t.Errorf("invalid UTF-8 reached the collector: %q", a)
		}
	}
	if !strings.Contains(all, `simtrain-data.bin`) || !strings.Contains(all, `forged\xff`) {
		t.Errorf("no span names the hostile data file (escaped); attributes:\n%s", truncate(all, 3000))
	}
	if !strings.Contains(all, "--api-key=*** --token ***") {
		t.Errorf("command line not redacted in the resource:\n%s", truncate(all, 3000))
	}
	if !strings.Contains(targetInfo, "--api-key=*** --token ***") {
		t.Errorf("target_info does not carry the redacted command line: %q", targetInfo)
	}
	outputs := map[string]string{"collector": all, "target_info": targetInfo, "stdout": stdout, "stderr": stderr}
	for what, s := range outputs {
		for _, secret := range []string{"hunter2-secret", "tok-secret", "pw-in-url", "hdr-secret"} {
			if strings.Contains(s, secret) {
				t.Errorf("%s carries the secret %q", what, secret)
			}
		}
	}
	for what, s := range map[string]string{"stdout": stdout, "stderr": stderr} {
		for _, bad := range []string{"\x1b", "\x07", "\nlevel=ERROR msg=forged", "\xff"} {
			if strings.Contains(s, bad) {
				t.Errorf("%s carries %q from the target's file name", what, bad)
			}
		}
	}
	if !strings.Contains(stdout, `msg=forged\xff/simtrain-data.bin`) || !strings.Contains(stdout, `top_file="`) {
		t.Errorf("the hostile file name is not shown escaped on stdout:\n%s", stdout)
	}
	envs, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(envs), "hdr-secret") || strings.Contains(string(envs), "OTEL_EXPORTER_OTLP_") {
		t.Errorf("gaptrace's OTLP settings reached the trainer's environment")
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

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

// A collector that accepts connections and never answers must not hold
// the job's exit: run returns within 5 s of the command's end.
func TestSilentCollectorExitWithinFiveSeconds(t *testing.T) {
	need(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never read, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	dir := t.TempDir()
	endFile := filepath.Join(dir, "end")
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		script := `"$0" --steps 150 --kernel-us 1000 --stall io.read:every=2:ms=2 --quiet; date +%s.%N > "$1"`
		p := start(t, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
			"--otlp-endpoint", "http://"+ln.Addr().String(), "--otlp-protocol", protocol,
			"--", "sh", "-c", script, filepath.Join(simgpuDir, "simtrain"), endFile)
		// The promise is about waiting on the collector. On a loaded
		// machine gaptrace's own shutdown work also waits for a CPU: the
		// kernel's record of that wait from the command's end on is added
		// to the 5 s.
		rd := testutil.TrackRunDelay(p.cmd.Process.Pid, 20*time.Millisecond)
		var atEnd time.Duration
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			testutil.Poll(2*time.Minute, 20*time.Millisecond, func() bool {
				_, err := os.Stat(endFile)
				select {
				case <-p.done:
				default:
					if err != nil {
						return false
					}
				}
				atEnd = rd.Total()
				return true
			})
		}()
		code := p.wait(t, 2*time.Minute)
		exited := time.Now()
		delay := rd.Stop()
		<-ended
		b, err := os.ReadFile(endFile)
		if err != nil {
			t.Fatalf("%s: the command did not finish: %v\n%s", protocol, err, p.stderr)
		}
		if err := os.Remove(endFile); err != nil {
			t.Fatal(err)
		}
		sec, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		late := exited.Sub(time.Unix(0, int64(sec*1e9)))
		delay -= atEnd
		t.Logf("%s: gaptrace exited %v after the command, %v of it waiting for a CPU", protocol, late.Round(time.Millisecond), delay.Round(time.Millisecond))
		if code != 0 || late > 5*time.Second+delay {
			t.Errorf("%s: exit %d, %v after the command ended (%v of it waiting for a CPU); want 0 within 5 s\n%s",
				protocol, code, late, delay, p.stderr)
		}
	}
}

// A probe detach slower than the bound (held back a minute here) must not
// hold the job's exit: run stops waiting 3 s after the job exited, says
// so, writes its summary and exits within 5 s; and once it is gone nothing
// of it stays attached, not even the uprobes on a process of the job that
// outlives it, which only the kernel can have detached (gaptrace's own
// detach never ran).
func TestSlowDetachExitWithinFiveSeconds(t *testing.T) {
	need(t)
	dir := t.TempDir()
	endFile, orphanFile, seenFile := filepath.Join(dir, "end"), filepath.Join(dir, "orphan"), filepath.Join(dir, "seen")
	sum := filepath.Join(dir, "summary.json")
	// The job leaves a trainer running behind it (its output elsewhere, so
	// that gaptrace's pipes close when gaptrace exits), traced until
	// gaptrace exits, and ends once the test saw that trainer's uprobe
	// links.
	script := `"$0" --steps 100000000 --kernel-us 1000 --quiet </dev/null >/dev/null 2>&1 & echo $! > "$2"
while [ ! -e "$3" ]; do sleep 0.05; done
"$0" --steps 50 --kernel-us 1000 --quiet; date +%s.%N > "$1"`
	environ := append(env(t), "GAPTRACE_TEST_DETACH_DELAY=1m")
	p := start(t, environ, "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--summary-json", sum,
		"--", "sh", "-c", script, filepath.Join(simgpuDir, "simtrain"), endFile, orphanFile, seenFile)
	// The trainer and its workers are in gaptrace's process group.
	t.Cleanup(func() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) })
	orphan := 0
	testutil.WaitFor(t, time.Minute, "the trainer left behind", func() bool {
		b, err := os.ReadFile(orphanFile)
		orphan, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && orphan > 0
	})
	// Every link gaptrace holds, as its fds say, until it exits.
	held := map[string]string{} // link_id → fdinfo
	snapshot := func() {
		infos, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fdinfo/*", p.cmd.Process.Pid))
		for _, f := range infos {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(b), "\n") {
				if id, ok := strings.CutPrefix(l, "link_id:"); ok {
					held[strings.TrimSpace(id)] = string(b)
				}
			}
		}
	}
	orphanLinks := func() (n int) {
		for _, info := range held {
			if strings.Contains(info, "probe") && strings.Contains(info, fmt.Sprintf("pid:\t%d\n", orphan)) {
				n++
			}
		}
		return n
	}
	testutil.WaitFor(t, time.Minute, "uprobe links on the trainer left behind", func() bool {
		snapshot()
		return orphanLinks() > 0
	})
	if err := os.WriteFile(seenFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rd := testutil.TrackRunDelay(p.cmd.Process.Pid, 20*time.Millisecond)
	var atEnd time.Duration
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		testutil.Poll(2*time.Minute, 20*time.Millisecond, func() bool {
			_, err := os.Stat(endFile)
			select {
			case <-p.done:
			default:
				if err != nil {
					return false
				}
			}
			atEnd = rd.Total()
			return true
		})
	}()
	for done := false; !done; {
		select {
		case <-p.done:
			done = true
		case <-time.After(20 * time.Millisecond):
			snapshot()
		}
	}
	exited := time.Now()
	code := p.cmd.ProcessState.ExitCode()
	delay := rd.Stop()
	<-ended
	b, err := os.ReadFile(endFile)
	if err != nil {
		t.Fatalf("the job did not finish: %v\n%s", err, p.stderr)
	}
	sec, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	late := exited.Sub(time.Unix(0, int64(sec*1e9)))
	delay -= atEnd
	t.Logf("gaptrace exited %v after the job, %v of it waiting for a CPU; it held %d links, %d of them uprobes on pid %d",
		late.Round(time.Millisecond), delay.Round(time.Millisecond), len(held), orphanLinks(), orphan)
	if code != 0 || late > 5*time.Second+delay {
		t.Errorf("exit %d, %v after the job ended (%v of it waiting for a CPU); want 0 within 5 s\n%s", code, late, delay, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "probes still detaching at the deadline") {
		t.Errorf("gaptrace does not say it stopped waiting for the detach:\n%s", p.stderr)
	}
	if b, err := os.ReadFile(sum); err != nil || !json.Valid(b) {
		t.Errorf("no whole summary written: %v", err)
	}
	if err := syscall.Kill(orphan, 0); err != nil {
		t.Fatalf("the trainer left behind is gone (%v): it no longer shows that the kernel detached its probes", err)
	}
	var left []string
	testutil.Poll(20*time.Second, 100*time.Millisecond, func() bool {
		left = left[:0]
		for id := range held {
			n, _ := strconv.ParseUint(id, 10, 32)
			l, err := link.NewFromID(link.ID(n))
			if err == nil {
				l.Close()
				left = append(left, id)
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("link %s: %v", id, err)
			}
		}
		return len(left) == 0
	})
	if len(left) > 0 {
		slices.Sort(left)
		t.Errorf("links gaptrace held still attached after it exited: %v", left)
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

// heldShell starts `sh -c 'sleep 600'` with extra arguments after the
// script ($0, $1, ...): they stay on the shell's command line while it waits,
// as a trainer's secrets stay on its own.
func heldShell(t *testing.T, args ...string) int {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", "sleep 600; :"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reap(t, cmd) })
	want := strings.Join(cmd.Args, "\x00")
	testutil.WaitFor(t, 30*time.Second, "the shell's command line", func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
		return err == nil && strings.TrimSuffix(string(b), "\x00") == want
	})
	return cmd.Process.Pid
}

// check --pid quotes the target's command line; it goes through the same
// --command-line and --redact as spans, metrics and logs.
func TestCheckRedactsTheTargetCommandLine(t *testing.T) {
	bin := testutil.Gaptrace(t)
	pid := heldShell(t, "trainer", "--api-key=sk-check-secret", "--token", "tok-check-secret", "--lr", "0.1",
		"--db", "postgres://bob:pw-check-secret@db/x", "-H", "Authorization: Bearer bb-check-secret",
		"--password", "-dash-check-secret", "--tokenizer", "gpt2", "--run-name", "visible-name")
	secrets := []string{"sk-check-secret", "tok-check-secret", "pw-check-secret", "bb-check-secret", "dash-check-secret"}
	for _, tc := range []struct {
		flags      []string
		want, hide []string
	}{
		{nil, []string{"sh -c", "--api-key=*** --token *** --lr 0.1", "postgres://***@db/x",
			"-H Authorization: Bearer *** --password *** --tokenizer gpt2", "visible-name"}, secrets},
		{[]string{"--redact", "visible-\\w+"}, []string{"--api-key=***", "--run-name ***"}, append(secrets, "visible-name")},
		{[]string{"--command-line", "name"}, []string{fmt.Sprintf("pid %d sh\n", pid)}, append(secrets, "--lr", "trainer")},
		{[]string{"--command-line", "none"}, []string{fmt.Sprintf("pid %d\n", pid)}, append(secrets, "sh -c", "trainer")},
		{[]string{"--command-line", "full"}, []string{"--api-key=sk-check-secret --token tok-check-secret"}, nil},
	} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"check", "--pid", strconv.Itoa(pid)}, tc.flags...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); !exitStatusOnly(err) {
			t.Fatalf("check %v: %v\n%s", tc.flags, err, &stderr)
		}
		var target string
		for _, l := range strings.SplitAfter(stdout.String(), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[1] == "target" {
				target = l
			}
		}
		if target == "" {
			t.Errorf("check %v: no target line\n%s%s", tc.flags, &stdout, &stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(target, w) {
				t.Errorf("check %v: target line %q lacks %q", tc.flags, target, w)
			}
		}
		for _, h := range tc.hide {
			if strings.Contains(stdout.String()+stderr.String(), h) {
				t.Errorf("check %v prints %q:\n%s%s", tc.flags, h, &stdout, &stderr)
			}
		}
	}
}

// check mounts tracefs where none is mounted, to look inside, and unmounts
// it again: in a mount namespace of its own whose tracefs (and debugfs,
// whose tracing directory mounts tracefs when looked at) is unmounted,
// check reports the tracepoints it found inside, says it left tracefs
// unmounted, and afterwards no tracefs is mounted there. The host's mounts
// are never touched (the namespace's propagation is private).
func TestCheckLeavesTracefsUnmounted(t *testing.T) {
	testutil.NeedRoot(t, "mounts tracefs in a mount namespace")
	bin := testutil.Gaptrace(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	hostBefore := tracefsMounts(t, "/proc/self/mountinfo")
	// Deepest first: debugfs's tracing automount before debugfs itself.
	const script = `fs() { awk '{ split($0, a, " - "); split(a[2], b, " "); if (b[1] == "tracefs" || b[1] == "debugfs") print $5 }' /proc/self/mountinfo; }
for m in $(fs | sort -r); do umount "$m" || exit 99; done
echo "before: $(fs | tr '\n' ' ')"
"$0" check
echo "check exit $?"
echo "after: $(fs | tr '\n' ' ')"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("unshare: %v\n%s%s", err, out, &stderr)
	}
	report := string(out)
	line := func(prefix string) string {
		for _, l := range strings.Split(report, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no %q line:\n%s%s", prefix, report, &stderr)
		return ""
	}
	if l := line("before:"); strings.TrimSpace(strings.TrimPrefix(l, "before:")) != "" {
		t.Fatalf("tracefs or debugfs still mounted in the namespace before check (%s): the test proves nothing\n%s", l, report)
	}
	if l := line("OK    tracefs "); !strings.Contains(l, "not mounted; it can be") || !strings.Contains(l, "check left it unmounted") {
		t.Errorf("check's tracefs line does not say it mounted tracefs to look and left it unmounted: %q", l)
	}
	// Found inside the tracefs check mounted: it did look.
	if l := line("OK    tracepoints "); !strings.Contains(l, "present") {
		t.Errorf("check did not look inside the tracefs it mounted: %q", l)
	}
	if l := line("check exit "); l != "check exit 0" && l != "check exit 1" {
		t.Errorf("check: %s\n%s%s", l, report, &stderr)
	}
	if l := line("after:"); strings.TrimSpace(strings.TrimPrefix(l, "after:")) != "" {
		t.Errorf("check left a mount behind in its namespace (%s)\n%s", l, report)
	}
	if hostAfter := tracefsMounts(t, "/proc/self/mountinfo"); !slices.Equal(hostAfter, hostBefore) {
		t.Errorf("the host's tracefs mounts changed: %v, were %v", hostAfter, hostBefore)
	}
}

// tracefsMounts lists the mount points of tracefs and debugfs in a
// mountinfo file.
func tracefsMounts(t *testing.T, mountinfo string) []string {
	t.Helper()
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); ok && len(f) > 4 && len(g) > 0 && (g[0] == "tracefs" || g[0] == "debugfs") {
			points = append(points, f[4])
		}
	}
	return points
}

// The debug log line of the command run starts: its arguments as given
// (one of them a whole header), redacted like every other output.
func TestRunDebugLogRedactsTheCommand(t *testing.T) {
	need(t)
	dir := t.TempDir()
	code, stdout, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--log-level", "debug",
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--", "sh", "-c", "exit 0", "sh",
		"-H", "Authorization: Bearer bb-debug-secret", "--password", "-dash-debug-secret", "--passphrase", "pp-debug-secret",
		"--tokenizer", "gpt2")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	var line string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "command started under tracing") {
			line = l
		}
	}
	if !strings.Contains(line, "Authorization: Bearer ***") || !strings.Contains(line, "--tokenizer gpt2") {
		t.Errorf("no redacted argv in the debug log:\n%s", stderr)
	}
	for _, secret := range []string{"bb-debug-secret", "dash-debug-secret", "pp-debug-secret"} {
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("the output carries %q:\n%s", secret, stderr)
		}
	}
}

// attach --match beside other attach --match with the same pattern, each
// under a wrapper whose command line holds the pattern only because the
// gaptrace it starts does: two under timeout (their command lines name the
// gaptrace binary), one under a shell that names it only through a
// variable (a gaptrace runs under it). Each traces the real target and
// none of the wrappers, which would trace another gaptrace through them.
func TestAttachMatchSkipsOtherGaptracesWrappers(t *testing.T) {
	need(t)
	pattern := "zzdecoy77-" + strconv.Itoa(os.Getpid())
	attach := func(out string) []string {
		return []string{"attach", "--live", "off", "--match", pattern, "--spans-out", filepath.Join(t.TempDir(), out)}
	}
	// The shell first, and its gaptrace waiting, so that no scan of the
	// others can see the shell before its gaptrace exists.
	environ := append(env(t), "GT="+gaptraceBin)
	c := startArgv(t, environ, append([]string{"sh", "-c", `"$GT" "$@"; :`, pattern}, attach("c.jsonl")...)...)
	waiting := regexp.MustCompile(`msg="waiting for processes"`)
	c.waitFor(t, waiting, 2*time.Minute)
	a := startArgv(t, env(t), append([]string{"timeout", "300", gaptraceBin}, attach("a.jsonl")...)...)
	b := startArgv(t, env(t), append([]string{"timeout", "300", gaptraceBin}, attach("b.jsonl")...)...)
	a.waitFor(t, waiting, 2*time.Minute)
	b.waitFor(t, waiting, 2*time.Minute)

	target := exec.Command("sleep", "600")
	target.Args[0] = pattern
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, target)
	tpid := target.Process.Pid
	traced := regexp.MustCompile(`msg="tracing matching process" component=cli pid=(\d+)`)
	skipped := regexp.MustCompile(`msg="not tracing a matching process: gaptrace runs it, or under it" component=cli pid=(\d+)`)
	pids := func(p *gtProc, re *regexp.Regexp) []int {
		var out []int
		for _, m := range re.FindAllStringSubmatch(p.stderr.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
		return out
	}
	wrappers := map[*gtProc]int{a: a.cmd.Process.Pid, b: b.cmd.Process.Pid, c: c.cmd.Process.Pid}
	names := map[*gtProc]string{a: "a (timeout)", b: "b (timeout)", c: "c (sh)"}
	for p, w := range wrappers {
		t.Logf("%s: wrapper pid %d", names[p], w)
	}
	for p, own := range wrappers {
		// Done once it traced the target and passed over both other
		// wrappers, or as soon as it traced anything else.
		ok := testutil.Poll(2*time.Minute, 100*time.Millisecond, func() bool {
			tr := pids(p, traced)
			if slices.ContainsFunc(tr, func(n int) bool { return n != tpid }) {
				return true
			}
			sk := pids(p, skipped)
			for q, w := range wrappers {
				if w != own && q != p && !slices.Contains(sk, w) {
					return false
				}
			}
			return slices.Contains(tr, tpid)
		})
		if !ok {
			t.Errorf("%s: did not trace the target (pid %d) and pass over the other wrappers\n%s", names[p], tpid, p.stderr)
		}
	}
	for _, p := range []*gtProc{a, b, c} {
		// The group: sh does not pass a signal on to its command.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, p := range []*gtProc{a, b, c} {
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop", names[p])
		}
		if tr := pids(p, traced); !slices.Equal(tr, []int{tpid}) {
			t.Errorf("%s traced %v, want only the target %d\n%s", names[p], tr, tpid, p.stderr)
		}
	}
}

// A data file whose path is longer than the 255 bytes the openat probe
// copies: every gap that names it names it whole (restored from
// /proc/PID/fd while the file is open), never the probe's cut prefix
// passed off as a path.
func TestLongFilePathKeptWhole(t *testing.T) {
	need(t)
	dataDir := t.TempDir()
	for len(dataDir) <= 300 {
		dataDir = filepath.Join(dataDir, strings.Repeat("d", 60))
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dataDir, "simtrain-data.bin")
	dir := t.TempDir()
	gapsPath := filepath.Join(dir, "gaps.jsonl")
	code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--gaps-out", gapsPath, "--spans-out", filepath.Join(dir, "spans.jsonl"), "--",
		filepath.Join(simgpuDir, "simtrain"), "--steps", "100", "--kernel-us", "1000", "--stall", "io.read:every=5:ms=20",
		"--data-dir", dataDir, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	reads, named := 0, 0
	for _, g := range readGaps(t, gapsPath) {
		var paths []string
		for _, f := range g.Evidence.Files {
			paths = append(paths, f.Path)
		}
		for _, w := range g.Evidence.Workers {
			paths = append(paths, w.Files...)
		}
		for _, p := range paths {
			if p != want && (strings.HasPrefix(want, strings.TrimSuffix(p, "…[truncated]")) || strings.HasSuffix(p, "…[truncated]")) {
				t.Errorf("gap at step %d (%s) names the data file cut: %q (%d bytes), want %q (%d bytes)", g.Step, g.Cause, p, len(p), want, len(want))
			}
		}
		if g.Cause != correlate.CauseIORead {
			continue
		}
		reads++
		if slices.Contains(paths, want) {
			named++
		}
	}
	// 100 steps, a stall every 5th: 20 io.read stalls. How many the engine
	// reports, and with what evidence, is its business; a cut path in any
	// of them is this test's.
	t.Logf("%d io.read gaps, %d naming %d bytes of path whole", reads, named, len(want))
	if named == 0 {
		t.Errorf("%d io.read gaps, none naming the %d-byte data file path whole\n%s", reads, len(want), stderr)
	}
}
