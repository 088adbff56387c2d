package gateway_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
	"github.com/gaptrace/gaptrace/test/e2e/jaegertest"
	"github.com/gaptrace/gaptrace/test/fleet/gateway"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// binary returns the gateway or skips: make test builds it (make otelcol)
// and sets GAPTRACE_OTELCOL; a GAPTRACE_OTELCOL that names no file fails.
func binary(t *testing.T) string {
	t.Helper()
	testutil.SkipShort(t, "gateway")
	bin, err := gateway.Binary()
	if errors.Is(err, gateway.ErrNoBinary) {
		t.Skipf("%v (make test does both)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func start(t *testing.T, bin string, o gateway.Options) *gateway.Gateway {
	t.Helper()
	g, err := gateway.Start(bin, o, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return g
}

// The deployed configuration passes the collector's own validation with
// the one variable it needs, and fails, naming it, without.
func TestGatewayConfigValidates(t *testing.T) {
	bin := binary(t)
	cfg, err := gateway.Config()
	if err != nil {
		t.Fatal(err)
	}
	validate := func(env ...string) (string, error) {
		cmd := exec.Command(bin, "validate", "--config", cfg)
		cmd.Env = append(cleanEnv(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := validate("TRACES_ENDPOINT=tempo.observability.svc:4317"); err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	if out, err := validate(); err == nil || !strings.Contains(out, "endpoint") {
		t.Errorf("validate without TRACES_ENDPOINT: %v, want a failure naming the endpoint\n%s", err, out)
	}
	if out, err := validate("TRACES_ENDPOINT=tempo:4317", "SAMPLE_PERCENT=ten"); err == nil {
		t.Errorf("validate with SAMPLE_PERCENT=ten passed\n%s", out)
	}
}

// sidecarRun is one `gaptrace run` of simtrain exporting into the gateway.
type sidecarRun struct {
	dir  string
	sum  correlate.Summary
	gaps []correlate.Gap
}

var stallArgs = []string{"--kernels-per-step", "20", "--kernel-us", "2000", "--launch-gap-us", "20",
	"--stall", "io.read:every=5:ms=30", "--stall", "net:every=7:ms=40", "--stall", "io.write:every=11:ms=60"}

func runSidecar(t *testing.T, endpoint string, flags []string, steps int) sidecarRun {
	t.Helper()
	testutil.NeedRoot(t, "attaches eBPF probes")
	bin, sim := testutil.Gaptrace(t), testutil.SimGPU(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "simgpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"run",
		"--nvml-lib", filepath.Join(sim, "libnvidia-ml.so.1"),
		"--cuda-lib", filepath.Join(sim, "libcuda.so.1"),
		"--nccl-lib", filepath.Join(sim, "libnccl.so.2"),
		"--gaps-out", filepath.Join(dir, "gaps.jsonl"),
		"--summary-json", filepath.Join(dir, "summary.json"),
		"--live", "off",
		"--otlp-endpoint", endpoint, "--otlp-protocol", "grpc", "--otlp-insecure",
	}
	args = append(args, flags...)
	args = append(args, "--", filepath.Join(sim, "simtrain"),
		"--data-dir", filepath.Join(dir, "data"), "--truth", filepath.Join(dir, "truth.jsonl"), "--quiet",
		"--steps", strconv.Itoa(steps))
	args = append(args, stallArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "SIMGPU_DIR="+filepath.Join(dir, "simgpu"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &testutil.LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gaptrace run: %v\n%s", err, out.String())
		}
	case <-time.After(4 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("gaptrace run still running after 4 min (killed: %v)\n%s", <-done, out.String())
	}
	r := sidecarRun{dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &r.sum); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "gaps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var g correlate.Gap
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatal(err)
		}
		r.gaps = append(r.gaps, g)
	}
	return r
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "TORCHELASTIC_") &&
			!strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "K8S_JOB_NAME=") &&
			!strings.HasPrefix(kv, "TRACES_") && !strings.HasPrefix(kv, "SAMPLE_PERCENT=") {
			env = append(env, kv)
		}
	}
	return env
}

func countSpans(ts []jaegertest.Trace, name string) int {
	n := 0
	for i := range ts {
		n += len(ts[i].ByName(name))
	}
	return n
}

// TestGatewayEndToEnd: a sidecar on simtrain sends spans and metrics to
// the gateway; with every step kept, each step trace and gap reaches
// Jaeger, and the gateway's Prometheus endpoint shows the sidecar's idle
// by cause under the job's label, equal to the run's summary, and span
// metrics that counted every gap.
func TestGatewayEndToEnd(t *testing.T) {
	bin := binary(t)
	j := jaegertest.Start(t)
	g := start(t, bin, gateway.Options{TracesEndpoint: j.OTLPGRPCEndpoint(), SamplePercent: 100, KeepGapMS: 100,
		DecisionWait: time.Second})
	const service, job = "gw-e2e", "gw-e2e-job"
	r := runSidecar(t, g.OTLPGRPCEndpoint(), []string{"--service-name", service, "--job-id", job, "--rank", "0"}, 30)
	if r.sum.Steps < 30 || len(r.gaps) == 0 {
		t.Fatalf("summary: %d steps, %d gaps", r.sum.Steps, len(r.gaps))
	}
	want := int(r.sum.Steps + r.sum.Windows)
	traces, err := j.WaitTraces(service, 1000, 60*time.Second, func(ts []jaegertest.Trace) bool {
		return len(ts) == want && countSpans(ts, "gpu.idle") == len(r.gaps)
	})
	if err != nil {
		t.Fatalf("%v: %d traces (want %d), %d gpu.idle spans (gaps file: %d)\n%s", err, len(traces), want,
			countSpans(traces, "gpu.idle"), len(r.gaps), g.Logs())
	}

	var samples []gateway.Sample
	ok := testutil.Poll(30*time.Second, 200*time.Millisecond, func() bool {
		samples, err = gateway.Scrape(g.PromURL())
		calls, _ := gateway.Sum(samples, "gaptrace_span_calls_total",
			map[string]string{"span_name": "gpu.idle", "gaptrace_job_id": job})
		_, n := gateway.Sum(samples, "gaptrace_gpu_idle_seconds_total", map[string]string{"gaptrace_job_id": job})
		return err == nil && int(calls) == len(r.gaps) && n > 0
	})
	if !ok {
		calls, _ := gateway.Sum(samples, "gaptrace_span_calls_total", map[string]string{"span_name": "gpu.idle"})
		t.Fatalf("gateway metrics: %v; gpu.idle span calls %v (want %d)\n%s", err, calls, len(r.gaps), g.Logs())
	}
	for cause, ns := range r.sum.ByCause {
		if ns == 0 {
			continue
		}
		got, _ := gateway.Sum(samples, "gaptrace_gpu_idle_seconds_total",
			map[string]string{"gaptrace_job_id": job, "cause": string(cause)})
		if math.Abs(got-float64(ns)/1e9) > 1e-6+0.001*float64(ns)/1e9 {
			t.Errorf("gaptrace_gpu_idle_seconds_total{cause=%q} = %.6f s, summary says %.6f s", cause, got, float64(ns)/1e9)
		}
	}
	if _, n := gateway.Sum(samples, "gaptrace_gpu_idle_seconds_total", map[string]string{"job": job}); n != 0 {
		t.Errorf("%d series still carry the training job as label job (the exporter's own label)", n)
	}
	// Every series the job dashboard queries is served, under the job's label.
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dash, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "gaptrace-job.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`gaptrace_[a-z_]+`).FindAllString(string(dash), -1) {
		match := map[string]string{"gaptrace_job_id": job}
		switch name {
		case "gaptrace_job_id":
			continue
		case "gaptrace_events_dropped_total", "gaptrace_spans_dropped_total", "gaptrace_gaps_dropped_total":
			match = nil // process-wide: no job label
		}
		if _, n := gateway.Sum(samples, name, match); n == 0 {
			t.Errorf("the job dashboard queries %s, which the gateway does not serve (labels %v)", name, match)
		}
	}
	steps, _ := gateway.Sum(samples, "gaptrace_steps_total", map[string]string{"gaptrace_job_id": job, "rank": "0"})
	if int64(steps) != r.sum.Steps+r.sum.Windows {
		t.Errorf("gaptrace_steps_total %v, summary %d steps and %d windows", steps, r.sum.Steps, r.sum.Windows)
	}
}

// TestGatewayKeepsLongGaps: with ordinary steps sampled at 0 %, exactly
// the step traces that hold a gap of at least KEEP_GAP_MS reach Jaeger,
// while the span metrics still count every step.
func TestGatewayKeepsLongGaps(t *testing.T) {
	bin := binary(t)
	j := jaegertest.Start(t)
	const keepMS, service = 50, "gw-sampling"
	g := start(t, bin, gateway.Options{TracesEndpoint: j.OTLPGRPCEndpoint(), SamplePercent: 0, KeepGapMS: keepMS,
		DecisionWait: time.Second})
	r := runSidecar(t, g.OTLPGRPCEndpoint(), []string{"--service-name", service}, 40)
	long := map[int64]bool{}
	for _, gp := range r.gaps {
		if float64(gp.Duration)/1e6 >= keepMS {
			long[gp.Step] = true
		}
	}
	if len(long) == 0 || len(long) >= int(r.sum.Steps) {
		t.Fatalf("%d of %d steps hold a gap >= %d ms: the run cannot tell sampling apart", len(long), r.sum.Steps, keepMS)
	}
	all := int(r.sum.Steps + r.sum.Windows)
	// Every step passes the span metrics before sampling.
	testutil.WaitFor(t, 60*time.Second, "span metrics counting every step", func() bool {
		s, err := gateway.Scrape(g.PromURL())
		n, _ := gateway.Sum(s, "gaptrace_span_calls_total", map[string]string{"span_name": "train.step", "service_name": service})
		return err == nil && int(n) == all
	})
	traces, err := j.WaitTraces(service, 1000, 30*time.Second, func(ts []jaegertest.Trace) bool { return len(ts) == len(long) })
	if err != nil {
		t.Fatalf("%v: %d traces in Jaeger, want the %d steps with a gap >= %d ms (of %d)\n%s", err, len(traces), len(long),
			keepMS, all, g.Logs())
	}
	for i := range traces {
		roots := traces[i].ByName("train.step")
		if len(roots) != 1 {
			t.Errorf("trace %s: %d train.step spans", traces[i].TraceID, len(roots))
			continue
		}
		n, _ := strconv.ParseInt(roots[0].TagString("gpu.step.number"), 10, 64)
		if !long[n] {
			t.Errorf("step %d kept without a gap >= %d ms", n, keepMS)
		}
	}
	t.Logf("kept %d of %d step traces (sampling 0 %%, gaps >= %d ms kept)", len(traces), all, keepMS)
}
