package otel

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// collector counts OTLP/HTTP requests per signal path and refuses metrics,
// as a traces-only backend does.
type collector struct {
	mu   sync.Mutex
	hits map[string]int
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.hits[r.URL.Path]++
	c.mu.Unlock()
	if r.URL.Path == "/v1/metrics" {
		http.Error(w, "metrics not accepted here", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (c *collector) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits[path]
}

// TestExportersNone: OTEL_METRICS_EXPORTER=none and OTEL_TRACES_EXPORTER=none
// each keep that signal off the OTLP endpoint (a traces-only backend then
// sees no metrics, and no export error is counted), while the other signal
// and an explicit spans file are unaffected. Without them, both signals go
// out, so the test can tell the difference.
func TestExportersNone(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		metrics, traces        string
		wantMetrics, wantSpans bool
	}{
		{"both on", "", "", true, true},
		{"metrics none", "none", "", false, true},
		{"traces none", "", "none", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_METRICS_EXPORTER", tc.metrics)
			t.Setenv("OTEL_TRACES_EXPORTER", tc.traces)
			c := &collector{hits: map[string]int{}}
			srv := httptest.NewServer(c)
			defer srv.Close()
			spans := filepath.Join(t.TempDir(), "spans.jsonl")
			ctx := context.Background()
			x, err := New(ctx, Config{Endpoint: srv.URL, Protocol: ProtocolHTTPProtobuf, SpansFile: spans,
				BatchTimeout: 10 * time.Millisecond, MetricsInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UnixNano()
			g := correlate.Gap{PID: 1, TID: 1, Start: now, End: now + 2e6, Duration: 2e6, Cause: correlate.CauseNet}
			x.Gap(g)
			x.Step(correlate.StepResult{Step: correlate.Step{PID: 1, Start: now - 1e6, End: now + 5e6,
				ByCause: map[correlate.Cause]int64{correlate.CauseNet: 2e6}}, GapList: []correlate.Gap{g}})
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err = x.Shutdown(sctx) // flushes both signals once
			gotMetrics, gotSpans := c.count("/v1/metrics") > 0, c.count("/v1/traces") > 0
			if gotMetrics != tc.wantMetrics || gotSpans != tc.wantSpans {
				t.Errorf("OTLP requests: metrics %v spans %v; want %v %v (%v)", gotMetrics, gotSpans, tc.wantMetrics, tc.wantSpans, c.hits)
			}
			if !tc.wantMetrics && err != nil {
				t.Errorf("shutdown with metrics off: %v", err)
			}
			if st := x.Stats(); st.ExportErrors != 0 || (tc.wantSpans && st.SpansExported == 0) {
				t.Errorf("stats %+v", st)
			}
			if !tc.wantSpans {
				// The local copy still gets the spans: it is a file the
				// user asked for, not an OTLP exporter.
				if n := countLines(t, spans); n == 0 {
					t.Error("spans file empty with OTEL_TRACES_EXPORTER=none")
				}
			}
		})
	}
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}
