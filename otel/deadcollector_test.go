package otel_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// lockedLog is a log destination safe for the exporter's goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDeadCollectorSaidAtOnce: an endpoint where nothing listens is said
// within seconds of the first export, once, and the counters say the
// export is failing; before, the exporter retried inside each call until
// its 10 s timeout and nothing was said until then.
func TestDeadCollectorSaidAtOnce(t *testing.T) {
	for _, proto := range []string{otel.ProtocolHTTPProtobuf, otel.ProtocolGRPC} {
		t.Run(proto, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_METRICS_EXPORTER", "none")
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close() // nothing listens there now: connections are refused
			var logs lockedLog
			insecure := true
			x, err := otel.New(context.Background(), otel.Config{Endpoint: "http://" + addr, Protocol: proto, Insecure: &insecure,
				BatchSize: 16, BatchTimeout: 50 * time.Millisecond, Rank: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			sy := synth{pid: 1, t0: time.Now().UnixNano()}
			sent := time.Now()
			for n := range int64(40) {
				st, gaps := sy.step(n)
				x.Gap(gaps[0])
				x.Step(correlate.StepResult{Step: st, GapList: gaps})
			}
			deadline := sent.Add(5 * time.Second)
			for !strings.Contains(logs.String(), "span export failed") && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			said := time.Since(sent)
			st := x.Stats()
			if !strings.Contains(logs.String(), "span export failed") {
				t.Fatalf("nothing said %v after the first spans; stats %+v\n%s", said, st, logs.String())
			}
			if st.ExportErrors == 0 || !st.ExportFailing || st.SpansExported != 0 {
				t.Errorf("stats %+v: want failed exports counted, failing, nothing exported", st)
			}
			if n := strings.Count(logs.String(), "span export failed"); n != 1 {
				t.Errorf("said %d times within %v, want once (rate-limited):\n%s", n, said, logs.String())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = x.Shutdown(ctx) // the dead collector's error is expected
			t.Logf("said after %v", said.Round(time.Millisecond))
		})
	}
}
