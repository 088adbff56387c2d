package otel_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

func clearEnv(t *testing.T) {
	t.Helper()
	for _, v := range []string{"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
		"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_METRICS_EXPORTER",
		"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "K8S_JOB_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT"} {
		t.Setenv(v, "")
	}
	for _, sig := range []string{"", "TRACES_", "METRICS_"} {
		for _, k := range []string{"TIMEOUT", "COMPRESSION", "INSECURE", "CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			t.Setenv("OTEL_EXPORTER_OTLP_"+sig+k, "")
		}
	}
}

// shutdown flushes x at the end of a test that expects the flush to succeed.
func shutdown(t *testing.T, x *otel.Exporter) {
	t.Helper()
	if err := x.Shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func readSpansFile(t *testing.T, path string) []otel.FileSpan {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []otel.FileSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s otel.FileSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("spans file line %q: %v", sc.Text(), err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFileModeSpanModel(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, Rank: -1,
		Resource: otel.ResourceInfo{TargetPID: 4242, TargetCmdline: []string{"/usr/bin/python3", "train.py"}}})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 4242, t0: time.Now().Add(-time.Minute).UnixNano()}
	const steps = 8
	for n := range int64(steps) {
		st, gaps := sy.step(n)
		deliver(x, st, gaps...)
	}
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := readSpansFile(t, path)
	st := x.Stats()
	if st.SpansDropped != 0 || st.GapsDropped != 0 || int(st.SpansExported) != len(spans) {
		t.Errorf("stats %+v for %d spans in the file", st, len(spans))
	}

	byID := map[string]otel.FileSpan{}
	traces := map[string][]otel.FileSpan{}
	for _, s := range spans {
		byID[s.SpanID] = s
		traces[s.TraceID] = append(traces[s.TraceID], s)
		if s.Service != "from-env" {
			t.Errorf("span %s service %q, want OTEL_SERVICE_NAME's from-env", s.Name, s.Service)
		}
	}
	if len(traces) != steps {
		t.Fatalf("%d traces, want one per step (%d)", len(traces), steps)
	}
	for tid, ss := range traces {
		var root *otel.FileSpan
		for i := range ss {
			if ss[i].ParentSpanID == "" {
				if root != nil {
					t.Fatalf("trace %s has two roots", tid)
				}
				root = &ss[i]
			}
		}
		if root == nil || root.Name != otel.SpanStep {
			t.Fatalf("trace %s: root %+v, want %s", tid, root, otel.SpanStep)
		}
		n := int64(root.Attributes["gpu.step.number"].(float64))
		wantCause := rotation[int(n)%len(rotation)]
		var gapSpan *otel.FileSpan
		ops := 0
		for i := range ss {
			s := &ss[i]
			if s.ParentSpanID != "" && byID[s.ParentSpanID].TraceID != tid {
				t.Errorf("span %s has a parent outside its trace", s.Name)
			}
			switch {
			case s.Name == otel.SpanGap:
				gapSpan = s
				if s.ParentSpanID != root.SpanID {
					t.Errorf("gpu.idle parent %s, want root %s", s.ParentSpanID, root.SpanID)
				}
				if s.StartUnixNano < root.StartUnixNano || s.EndUnixNano > root.EndUnixNano {
					t.Errorf("gpu.idle [%d,%d] outside step [%d,%d]", s.StartUnixNano, s.EndUnixNano, root.StartUnixNano, root.EndUnixNano)
				}
			case s.ParentSpanID != "" && byID[s.ParentSpanID].Name == otel.SpanGap:
				ops++
			}
		}
		if gapSpan == nil {
			t.Fatalf("step %d: no gpu.idle span", n)
		}
		if c := gapSpan.Attributes["gpu.gap.cause"]; c != string(wantCause) {
			t.Errorf("step %d: cause %v, want %s", n, c, wantCause)
		}
		if ops == 0 {
			t.Errorf("step %d: no host-operation spans under gpu.idle", n)
		}
		if _, ok := root.Attributes["gpu.step.idle."+string(wantCause)]; !ok {
			t.Errorf("step %d: root lacks gpu.step.idle.%s: %v", n, wantCause, root.Attributes)
		}
		// A stall keeps the compute it overlapped: the comm step's 28 ms
		// stall at SM activity 0.25 saves 21 ms, its cpu 5 + 2×0.75 ms.
		wantSaved, wantCPU := 28.0, 7.0
		if wantCause == correlate.CauseComm {
			wantSaved, wantCPU = 21, 6.5
		}
		if got := root.Attributes["gpu.step.what_if."+string(wantCause)+"_ms"]; got != wantSaved {
			t.Errorf("step %d: gpu.step.what_if.%s_ms %v, want %v", n, wantCause, got, wantSaved)
		}
		if got := root.Attributes["gpu.step.what_if.cpu_ms"]; got != wantCPU {
			t.Errorf("step %d: gpu.step.what_if.cpu_ms %v, want %v", n, got, wantCPU)
		}
		checkCauseAttrs(t, wantCause, gapSpan)
		if len(gapSpan.Events) != 2 {
			t.Errorf("gpu.idle events %v, want drained and enqueued", gapSpan.Events)
		}
	}
}

// checkCauseAttrs checks the attributes a gap span of each cause carries
// beyond the common ones.
func checkCauseAttrs(t *testing.T, wantCause correlate.Cause, gapSpan *otel.FileSpan) {
	t.Helper()
	switch wantCause {
	case correlate.CauseIORead:
		if p, _ := gapSpan.Attributes["file.path"].(string); !strings.HasPrefix(p, "/data/shard-") {
			t.Errorf("io.read gap file.path %q", p)
		}
	case correlate.CauseIOWrite:
		if a := gapSpan.Attributes; a["gpu.gap.episode.kind"] != "checkpoint" || a["gpu.gap.episode.file"] != a["file.path"] ||
			a["gpu.gap.episode.copies"] != 16.0 || a["gpu.gap.episode.serialize_ms"] != 10.0 || a["gpu.gap.episode.fsync_ms"] != 8.0 {
			t.Errorf("io.write gap episode attrs %v", a)
		}
	case correlate.CauseNet:
		if gapSpan.Attributes["network.peer.address"] != "10.1.2.3:443" {
			t.Errorf("net gap peer %v", gapSpan.Attributes["network.peer.address"])
		}
	case correlate.CauseComm:
		if gapSpan.Attributes["gpu.gap.kind"] != "stall" || gapSpan.Attributes["gpu.collective.op"] != "AllReduce" ||
			gapSpan.Attributes["gpu.gap.sm_activity"] != 0.25 || gapSpan.Attributes["gpu.gap.baseline_ms"] != 5.0 ||
			fmt.Sprint(gapSpan.Attributes["gpu.collective.ranks"]) != "2" ||
			fmt.Sprint(gapSpan.Attributes["gpu.collective.waiting_on_ranks"]) != "[1]" ||
			fmt.Sprint(gapSpan.Attributes["gpu.collective.late_rank"]) != "1" ||
			gapSpan.Attributes["gpu.collective.late_by_ms"] != 27.0 || gapSpan.Attributes["gpu.collective.late_pid"] == nil {
			t.Errorf("comm gap attrs %v", gapSpan.Attributes)
		}
	}
}

func TestPrometheusEndpoint(t *testing.T) {
	clearEnv(t)
	x, err := otel.New(context.Background(), otel.Config{PrometheusAddr: "127.0.0.1:0", Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, x)
	addr := x.PrometheusAddr()
	if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
		t.Fatalf("prometheus listens on %q", addr)
	}
	sy := synth{pid: 1, t0: time.Now().UnixNano()}
	for n := range int64(4) {
		st, gaps := sy.step(n)
		deliver(x, st, gaps[0])
	}
	// The correlator's losses: a live update, the summary's final counts,
	// then a stale snapshot that must not lower them.
	x.Losses(correlate.Losses{LateEvents: 5, ForcedEvents: 1})
	x.Summary(correlate.Summary{Steps: 4, ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 28e6 + 1e9},
		Losses: correlate.Losses{LateEvents: 9, ForcedEvents: 2, DroppedIntervals: 904, IncompleteSteps: 3, GapsAfterStep: 1}}, 17)
	x.Losses(correlate.Losses{LateEvents: 5, ForcedEvents: 1})
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for series, want := range map[string]float64{
		`gaptrace_gpu_idle_seconds_total{cause="io.read",gpu="0",pid="1"}`:  1.028, // 28 ms from step 0, topped up by Summary
		`gaptrace_gpu_idle_seconds_total{cause="net",gpu="0",pid="1"}`:      0.028,
		`gaptrace_gpu_idle_seconds_total{cause="cpu",gpu="0",pid="1"}`:      0.028,
		`gaptrace_steps_total{gpu="0",pid="1"}`:                             4,
		`gaptrace_step_duration_seconds_count{gpu="0",pid="1"}`:             4,
		`gaptrace_gap_duration_seconds_count{cause="comm",gpu="0",pid="1"}`: 1,
		`gaptrace_gpu_idle_ratio{gpu="0",pid="1"}`:                          0.35,
		`gaptrace_events_dropped_total`:                                     17,
		`gaptrace_events_late_total`:                                        9,
		`gaptrace_events_forced_total`:                                      2,
		`gaptrace_intervals_dropped_total`:                                  904,
		`gaptrace_steps_incomplete_total`:                                   3,
		`gaptrace_gaps_after_step_total`:                                    1,
		`gaptrace_spans_dropped_total`:                                      0,
	} {
		got, ok := metricValue(text, series)
		if !ok {
			t.Errorf("metrics lack %s", series)
		} else if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}
}

// One sidecar, several GPUs and processes (a DaemonSet on an 8-GPU node):
// every series says whose it is.
func TestPrometheusLabelsPerGPUAndProcess(t *testing.T) {
	clearEnv(t)
	x, err := otel.New(context.Background(), otel.Config{PrometheusAddr: "127.0.0.1:0", Rank: -1, JobID: "job-7",
		DeviceUUID: func(i int) string { return fmt.Sprintf("GPU-%d", i) }})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, x)
	rank := 3
	for i, w := range []*correlate.Workload{
		{Rank: &rank, ContainerID: "c0ffee", PodName: "train-0", PodNamespace: "ml"},
		nil,
	} {
		sy := synth{pid: uint32(100 + i), t0: time.Now().UnixNano()}
		st, gaps := sy.step(0)
		st.Device, st.Workload = i, w
		for i := range gaps {
			gaps[i].Device, gaps[i].Workload = i, w
		}
		deliver(x, st, gaps...)
	}
	x.Summary(correlate.Summary{Steps: 2}, 0)
	resp, err := http.Get("http://" + x.PrometheusAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, series := range []string{
		`gaptrace_steps_total{container_id="c0ffee",gpu="0",gpu_uuid="GPU-0",job="job-7",k8s_namespace_name="ml",k8s_pod_name="train-0",pid="100",rank="3"}`,
		`gaptrace_steps_total{gpu="1",gpu_uuid="GPU-1",job="job-7",pid="101"}`,
		`gaptrace_gpu_idle_seconds_total{cause="io.read",container_id="c0ffee",gpu="0",gpu_uuid="GPU-0",job="job-7",k8s_namespace_name="ml",k8s_pod_name="train-0",pid="100",rank="3"}`,
		`gaptrace_gpu_idle_seconds_total{cause="io.read",gpu="1",gpu_uuid="GPU-1",job="job-7",pid="101"}`,
	} {
		if v, ok := metricValue(text, series); !ok || v <= 0 {
			t.Errorf("metrics lack %s (%v)", series, v)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}
}

// A collector that accepts connections and never answers: Step must stay
// fast, the queue bounded, Shutdown on time, and the loss counted.
func TestSilentCollectorNeverBlocks(t *testing.T) {
	clearEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	const queue = 64
	x, err := otel.New(context.Background(), otel.Config{Endpoint: "http://" + ln.Addr().String(),
		Protocol: otel.ProtocolHTTPProtobuf, QueueSize: queue, BatchSize: 16, BatchTimeout: 10 * time.Millisecond, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 1, t0: time.Now().UnixNano()}
	var worst time.Duration
	for n := range int64(500) {
		st, gaps := sy.step(n)
		start := time.Now()
		deliver(x, st, gaps[0])
		worst = max(worst, time.Since(start))
		if q := x.Stats().QueueLen; q > queue {
			t.Fatalf("queue %d over its bound %d", q, queue)
		}
	}
	// Blocking on the collector would cost the export timeout (10 s); less
	// than that is scheduling noise on a loaded machine.
	if worst > 2*time.Second {
		t.Errorf("slowest Gap+Step took %s with a silent collector", worst)
	}
	if d := x.Stats().SpansDropped; d == 0 {
		t.Error("no spans counted as dropped although the collector never answered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = x.Shutdown(ctx) // the deadline error is expected: the collector never answers
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %s with a 500ms deadline", d)
	}
	st := x.Stats()
	if st.SpansExported != 0 || st.SpansDropped == 0 {
		t.Errorf("stats %+v: nothing can have been exported, everything dropped", st)
	}
	// Every span of the 500 steps is accounted for: root, gpu.idle and
	// 1 (io.read) or 2 (net, io.write, comm) host operations.
	if want := uint64(125 * (3 + 4 + 4 + 4)); st.SpansDropped != want {
		t.Errorf("dropped %d spans, want all %d counted", st.SpansDropped, want)
	}
}

// metricValue finds one series in Prometheus text exposition.
func metricValue(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, series+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		return v, err == nil
	}
	return 0, false
}

// One process driving two GPUs in a job: one root per step, distinct child
// spans per device, no duplicate span IDs.
func TestJobModeSeveralDevices(t *testing.T) {
	for _, rank := range []int{0, -1} {
		t.Run(strconv.Itoa(rank), func(t *testing.T) {
			clearEnv(t)
			path := filepath.Join(t.TempDir(), "spans.jsonl")
			x, err := otel.New(context.Background(), otel.Config{SpansFile: path, JobID: "job-d", Rank: rank})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now().UnixNano()
			for dev := range 2 {
				emit(x, synth{pid: 5, device: dev, t0: t0}, 0, 3)
			}
			if err := x.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			ids := map[string]bool{}
			roots := map[string]int{}
			children := map[string]int{}
			for _, s := range readSpansFile(t, path) {
				if ids[s.SpanID] {
					t.Errorf("span ID %s (%s) emitted twice", s.SpanID, s.Name)
				}
				ids[s.SpanID] = true
				switch {
				case s.Name == otel.SpanStep:
					roots[s.TraceID]++
					n := int64(s.Attributes["gpu.step.number"].(float64))
					if s.TraceID != otel.StepTraceID("job-d", n).String() || s.SpanID != otel.StepRootSpanID("job-d", n).String() {
						t.Errorf("step %d root not at the derived IDs", n)
					}
				case strings.HasPrefix(s.Name, "rank ") || strings.HasPrefix(s.Name, "device "):
					children[s.TraceID]++
				}
			}
			if len(roots) != 3 {
				t.Errorf("%d traces with a root, want 3", len(roots))
			}
			for tid, n := range roots {
				want := 2 // rank 0: a rank span per device
				if rank == -1 {
					want = 1 // the second device's span; the first hangs under the root
				}
				if n != 1 || children[tid] != want {
					t.Errorf("trace %s: %d roots, %d per-device spans; want 1, %d", tid, n, children[tid], want)
				}
			}
		})
	}
}

// Sampling keeps or drops whole steps, and two ranks of a job decide alike.
func TestTraceIDRatioSamplingKeepsWholeStepsOnEveryRank(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
	dir := t.TempDir()
	const steps = 200
	kept := map[int]map[string]map[string]int{} // rank → trace → span name → count
	for _, rank := range []int{0, 1} {
		path := filepath.Join(dir, strconv.Itoa(rank)+".jsonl")
		x, err := otel.New(context.Background(), otel.Config{SpansFile: path, JobID: "job-s", Rank: rank})
		if err != nil {
			t.Fatal(err)
		}
		emit(x, synth{pid: uint32(10 + rank), t0: time.Now().UnixNano()}, 0, steps)
		if err := x.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		kept[rank] = map[string]map[string]int{}
		for _, s := range readSpansFile(t, path) {
			if kept[rank][s.TraceID] == nil {
				kept[rank][s.TraceID] = map[string]int{}
			}
			kept[rank][s.TraceID][s.Name]++
		}
	}
	if n := len(kept[0]); n < steps/4 || n > steps*3/4 {
		t.Errorf("ratio 0.5 kept %d of %d steps", n, steps)
	}
	if len(kept[0]) != len(kept[1]) {
		t.Errorf("rank 0 kept %d steps, rank 1 %d", len(kept[0]), len(kept[1]))
	}
	for tid, names := range kept[0] {
		if kept[1][tid] == nil {
			t.Errorf("trace %s kept by rank 0 only", tid)
		}
		if names[otel.SpanStep] != 1 || names["rank 0"] != 1 || names[otel.SpanGap] != 1 {
			t.Errorf("trace %s kept partially: %v", tid, names)
		}
	}
}
