package otel_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// The /metrics page parses with Prometheus' own text-format parser, and its
// names and labels follow the Prometheus conventions: counters end in
// _total, durations are in seconds, every series of a DaemonSet's node says
// which GPU, process and rank it is.
func TestPrometheusPageParsesWithPrometheusParser(t *testing.T) {
	clearEnv(t)
	x, err := otel.New(context.Background(), otel.Config{PrometheusAddr: "127.0.0.1:0", Rank: -1, JobID: "j",
		DeviceUUID: func(i int) string { return "GPU-u" }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = x.Shutdown(context.Background()) }()
	rank := 0
	sy := synth{pid: 4242, t0: time.Now().UnixNano()}
	st, gaps := sy.step(0)
	st.Workload = &correlate.Workload{Rank: &rank, ContainerID: "abc"}
	for i := range gaps {
		gaps[i].Workload = st.Workload
	}
	deliver(x, st, gaps...)
	x.Summary(correlate.Summary{Steps: 1}, 3)
	x.Events(map[string]uint64{"cuda.launch": 7, "syscall.futex": 2})
	x.Events(map[string]uint64{"cuda.launch": 5}) // a count never goes back
	resp, err := http.Get("http://" + x.PrometheusAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("Prometheus' parser rejects the page: %v", err)
	}
	need := map[string]dto.MetricType{
		"gaptrace_gpu_idle_seconds_total":    dto.MetricType_COUNTER,
		"gaptrace_steps_total":               dto.MetricType_COUNTER,
		"gaptrace_step_duration_seconds":     dto.MetricType_HISTOGRAM,
		"gaptrace_gap_duration_seconds":      dto.MetricType_HISTOGRAM,
		"gaptrace_events_dropped_total":      dto.MetricType_COUNTER,
		"gaptrace_events_late_total":         dto.MetricType_COUNTER,
		"gaptrace_events_forced_total":       dto.MetricType_COUNTER,
		"gaptrace_intervals_dropped_total":   dto.MetricType_COUNTER,
		"gaptrace_steps_incomplete_total":    dto.MetricType_COUNTER,
		"gaptrace_gaps_after_step_total":     dto.MetricType_COUNTER,
		"gaptrace_gpu_idle_ratio":            dto.MetricType_GAUGE,
		"gaptrace_spans_dropped_total":       dto.MetricType_COUNTER,
		"gaptrace_gaps_dropped_total":        dto.MetricType_COUNTER,
		"gaptrace_spans_exported_total":      dto.MetricType_COUNTER,
		"gaptrace_gaps_total":                dto.MetricType_COUNTER,
		"gaptrace_sidecar_cpu_seconds_total": dto.MetricType_COUNTER,
		"gaptrace_sidecar_memory_rss_bytes":  dto.MetricType_GAUGE,
		"gaptrace_sidecar_events_total":      dto.MetricType_COUNTER,
	}
	for name, typ := range need {
		f, ok := families[name]
		if !ok {
			t.Errorf("no family %s", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s is a %v, want %v", name, f.GetType(), typ)
		}
	}
	for name, f := range families {
		if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if strings.Contains(name, "_ms") || strings.Contains(name, "milliseconds") {
			t.Errorf("%s: durations are in seconds", name)
		}
	}
	if f := families["gaptrace_sidecar_memory_rss_bytes"]; f != nil && f.GetMetric()[0].GetGauge().GetValue() < 1<<20 {
		t.Errorf("sidecar RSS %v bytes: implausibly small", f.GetMetric()[0].GetGauge().GetValue())
	}
	byKind := map[string]float64{}
	if f := families["gaptrace_sidecar_events_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					byKind[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if byKind["cuda.launch"] != 7 || byKind["syscall.futex"] != 2 {
		t.Errorf("gaptrace_sidecar_events_total by kind %v, want cuda.launch 7, syscall.futex 2", byKind)
	}
	labels := map[string]string{}
	for _, m := range families["gaptrace_steps_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
	}
	for k, v := range map[string]string{"gpu": "0", "gpu_uuid": "GPU-u", "pid": "4242", "rank": "0", "job": "j", "container_id": "abc"} {
		if labels[k] != v {
			t.Errorf("steps series label %s=%q, want %q (labels %v)", k, labels[k], v, labels)
		}
	}
}
