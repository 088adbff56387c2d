package main_test

// The adversarial tier: gaptrace runs as root beside code it does not
// control. Each test plays the hostile side (a planted link, a file name
// made of terminal escapes, a secret on the command line, a collector that
// never answers) against the built binary and checks what the operator's
// system, terminal and telemetry receive.

import (
	"bytes"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

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
