package otel

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Idle connections past the cap are closed at once instead of holding a
// file descriptor each (20,400 of them from one user exhausted the
// sidecar's, which then could not read the job's /proc); once they go, a
// scrape is served again. The server bounds every phase of a request.
func TestPromConnectionCap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	srv, capped := newPromServer(ln, reader)
	go func() { _ = srv.Serve(capped) }()
	defer srv.Close()
	if srv.ReadTimeout <= 0 || srv.IdleTimeout <= 0 || srv.ReadHeaderTimeout <= 0 || srv.WriteTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
		t.Errorf("server without a bound: %+v", srv)
	}
	cl := capped.(*capListener)
	var idle []net.Conn
	for range 10 * promMaxConns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for cl.refused.Load() < uint64(9*promMaxConns) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n, r := cl.open.Load(), cl.refused.Load(); n > promMaxConns || r < uint64(9*promMaxConns) {
		t.Fatalf("%d connections open, %d refused; want at most %d open", n, r, promMaxConns)
	}
	for _, c := range idle {
		c.Close()
	}
	for cl.open.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatalf("scrape after the idle connections went: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("scrape: %s", resp.Status)
	}
}
