package otel

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
)

func TestPromName(t *testing.T) {
	for _, c := range []struct{ name, unit, suffix, want string }{
		{"gaptrace.gpu.idle", "s", "_total", "gaptrace_gpu_idle_seconds_total"},
		{"gaptrace.steps", "{step}", "_total", "gaptrace_steps_total"},
		{"gaptrace.gpu.idle_ratio", "1", "", "gaptrace_gpu_idle_ratio"},
		{"gaptrace.gap.duration", "s", "", "gaptrace_gap_duration_seconds"},
		{"io.read", "By", "_total", "io_read_bytes_total"},
		{"io.bytes", "By", "_total", "io_bytes_total"}, // unit word not repeated
		{"rate", "By/s", "", "rate_bytes_per_seconds"},
		{"9lives-x", "", "", "_9lives_x"},
		{"done_total", "", "_total", "done_total"},
	} {
		if got := promName(c.name, c.unit, c.suffix); got != c.want {
			t.Errorf("promName(%q, %q, %q) = %q, want %q", c.name, c.unit, c.suffix, got, c.want)
		}
	}
}

// The exposition of every instrument kind gaptrace uses, exactly: HELP and
// TYPE lines, sorted series, cumulative buckets, escaped label values,
// target_info from the resource.
func TestPromExposition(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	res := resource.NewSchemaless(attribute.String("service.name", "gaptrace"), attribute.String("k8s.pod.name", `p"1`))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
	meter := mp.Meter("t")
	ctx := context.Background()
	idle, _ := meter.Float64Counter("gaptrace.gpu.idle", metric.WithUnit("s"), metric.WithDescription("idle time\nby cause"))
	hist, _ := meter.Float64Histogram("gaptrace.gap.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(0.01, 0.1))
	gauge, _ := meter.Float64Gauge("gaptrace.gpu.idle_ratio", metric.WithUnit("1"))
	updown, _ := meter.Int64UpDownCounter("queue.len", metric.WithUnit("{span}"))
	withCause := func(c string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("cause", c))
	}
	idle.Add(ctx, 1.5, withCause("net"))
	idle.Add(ctx, 0.25, withCause("io.read"))
	for _, v := range []float64{0.005, 0.05, 0.05, 3} {
		hist.Record(ctx, v, withCause("io.read"))
	}
	gauge.Record(ctx, 0.35)
	updown.Add(ctx, 7)
	updown.Add(ctx, -2)

	rec := httptest.NewRecorder()
	promHandler{reader: reader}.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != promContentType {
		t.Errorf("content type %q", ct)
	}
	want := `# HELP target_info Target metadata
# TYPE target_info gauge
target_info{k8s_pod_name="p\"1",service_name="gaptrace"} 1
# TYPE gaptrace_gap_duration_seconds histogram
gaptrace_gap_duration_seconds_bucket{cause="io.read",le="0.01"} 1
gaptrace_gap_duration_seconds_bucket{cause="io.read",le="0.1"} 3
gaptrace_gap_duration_seconds_bucket{cause="io.read",le="+Inf"} 4
gaptrace_gap_duration_seconds_sum{cause="io.read"} 3.105
gaptrace_gap_duration_seconds_count{cause="io.read"} 4
# HELP gaptrace_gpu_idle_seconds_total idle time\nby cause
# TYPE gaptrace_gpu_idle_seconds_total counter
gaptrace_gpu_idle_seconds_total{cause="io.read"} 0.25
gaptrace_gpu_idle_seconds_total{cause="net"} 1.5
# TYPE gaptrace_gpu_idle_ratio gauge
gaptrace_gpu_idle_ratio 0.35
# TYPE queue_len gauge
queue_len 5
`
	if got := rec.Body.String(); got != want {
		t.Errorf("exposition:\n%s\nwant:\n%s", got, want)
	}
}

// Every line a scraper sees is a comment or `name{labels} value`, and the
// special float values are spelled as Prometheus spells them.
func TestPromSpecialValues(t *testing.T) {
	for v, want := range map[float64]string{1e-7: "1e-07", 2: "2", 0.1: "0.1"} {
		if got := formatFloat(v); got != want {
			t.Errorf("formatFloat(%v) = %q, want %q", v, got, want)
		}
	}
	var b strings.Builder
	writeProm(&b, &metricdata.ResourceMetrics{})
	if b.Len() != 0 {
		t.Errorf("empty collection wrote %q", b.String())
	}
}
