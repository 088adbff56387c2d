package otel_test

import (
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/otel"
)

// sink is an OTLP/HTTP collector stand-in that records what reached it and
// can refuse the first requests to exercise retries.
type sink struct {
	mu       sync.Mutex
	paths    map[string]int
	headers  http.Header
	refuse   int // answer 503 to this many trace requests first
	refused  int
	received int // trace requests accepted
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paths[r.URL.Path]++
	if r.URL.Path == "/v1/traces" {
		s.headers = r.Header.Clone()
		if s.refused < s.refuse {
			s.refused++
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		s.received++
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// Export over TLS with a private CA, headers from the environment and the
// config merged, one refused request retried, metrics pushed at shutdown,
// and a local spans file beside OTLP.
func TestOTLPHTTPSinkTLSHeadersRetry(t *testing.T) {
	clearEnv(t)
	sk := &sink{paths: map[string]int{}, refuse: 1}
	srv := httptest.NewTLSServer(sk)
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team%20a,authorization=Bearer env")
	spansFile := filepath.Join(dir, "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{Endpoint: srv.URL, Protocol: otel.ProtocolHTTPProtobuf, CAFile: ca,
		Headers: map[string]string{"authorization": "Bearer flag"}, SpansFile: spansFile,
		BatchTimeout: 20 * time.Millisecond, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 9, t0: time.Now().UnixNano()}
	total := emit(x, sy, 0, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := x.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := x.Stats()
	// The refusal is one failed export (the batcher retries it, not the
	// exporter inside its call, so it is counted and said at once); its
	// spans go with the retry, none lost.
	if st.SpansExported != uint64(total) || st.SpansDropped != 0 || st.ExportErrors != 1 || st.ExportFailing {
		t.Errorf("stats %+v, want %d exported after one retried refusal, counted as one failed export", st, total)
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.refused != 1 || sk.received == 0 {
		t.Errorf("sink refused %d, accepted %d trace requests", sk.refused, sk.received)
	}
	if got := sk.headers.Get("X-Tenant"); got != "team a" {
		t.Errorf("x-tenant header %q, want the environment's (decoded) %q", got, "team a")
	}
	if got := sk.headers.Get("Authorization"); got != "Bearer flag" {
		t.Errorf("authorization header %q, want the config's", got)
	}
	if sk.paths["/v1/metrics"] == 0 {
		t.Errorf("no metrics pushed to /v1/metrics (paths %v)", sk.paths)
	}
	if got := len(readSpansFile(t, spansFile)); got != total {
		t.Errorf("local spans file beside OTLP has %d spans, want %d", got, total)
	}
}
