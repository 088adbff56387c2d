package otel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/otel"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchExport pushes b.N synthetic steps (3–4 spans each) through a real
// Exporter and reports spans per wall second and per CPU second (the whole
// process: span building, batching, encoding, the sink's read), which is
// the cost a sidecar core pays per span.
func benchExport(b *testing.B, cfg otel.Config) {
	b.Helper()
	cfg.Rank = -1
	cfg.QueueSize = 1 << 16
	cfg.BatchSize = 512
	cfg.BatchTimeout = 100 * time.Millisecond
	x, err := otel.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	sy := synth{pid: 1, t0: time.Now().UnixNano()}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, wall0 := cpuTime(), time.Now()
	spans := 0
	for n := range int64(b.N) {
		st, gaps := sy.step(n)
		deliver(x, st, gaps[0])
		spans += 2 + len(gaps[0].Ops)
		// Keep the producer within the queue so the figure is throughput,
		// not the rate of dropping.
		for x.Stats().QueueLen > cfg.QueueSize/2 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if err := x.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	cpu, wall := cpuTime()-cpu0, time.Since(wall0)
	b.StopTimer()
	st := x.Stats()
	if st.SpansDropped != 0 || st.SpansExported != uint64(spans) {
		b.Fatalf("exported %d of %d spans, dropped %d", st.SpansExported, spans, st.SpansDropped)
	}
	b.ReportMetric(float64(spans)/wall.Seconds(), "spans/s")
	if cpu > 0 {
		b.ReportMetric(float64(spans)/cpu.Seconds(), "spans/cpu-s")
	}
	b.ReportMetric(float64(spans)/float64(b.N), "spans/step")
}

func BenchmarkExport(b *testing.B) {
	b.Run("file", func(b *testing.B) {
		benchExport(b, otel.Config{SpansFile: b.TempDir() + "/spans.jsonl"})
	})
	b.Run("discard", func(b *testing.B) {
		// Span building and batching alone: file mode without a file.
		benchExport(b, otel.Config{})
	})
	b.Run("otlp-http", func(b *testing.B) {
		b.Setenv("OTEL_METRICS_EXPORTER", "none")
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.WriteHeader(http.StatusOK)
		}))
		defer srv.Close()
		benchExport(b, otel.Config{Endpoint: srv.URL, Protocol: otel.ProtocolHTTPProtobuf})
	})
}
