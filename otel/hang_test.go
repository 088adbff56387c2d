package otel_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/testutil"
	"github.com/gaptrace/gaptrace/otel"
)

// A hang is a span at once (not with the next batch, whose timeout is
// longer than the test waits), counted, and its duration a gauge per
// process that drops to 0 when it ends.
func TestHangSpanAndMetrics(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, PrometheusAddr: "127.0.0.1:0", Rank: -1,
		BatchTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, x)
	now := time.Now().UnixNano()
	r := &hang.Report{Kind: "hang", ID: "hang-7-8-1", Status: hang.Ongoing, PID: 7, TID: 8, Rank: 0,
		Reason: "pid 7 tid 8 in cuStreamSynchronize", Since: now - 3e9, Detected: now, Seconds: 3,
		Call: hang.Call{PID: 7, TID: 8, Kind: hang.Sync, Name: "cuStreamSynchronize",
			Collective: &hang.Collective{Op: "AllReduce", Comm: 0xc0, Seq: 5, Bytes: 4096, Ranks: 2}},
		Missing: []hang.Member{{Proc: hang.Proc{PID: 9, State: hang.StateStopped}, Rank: 1, Seq: 4}},
		Stacks: []hang.Stacks{{PID: 7, Threads: []hang.Thread{{TID: 8, State: "running",
			Python: []hang.Frame{{Function: "train", File: "t.py", Line: 3}}}}}}}
	x.Hang(r, true)
	var span *otel.FileSpan
	if !testutil.Poll(5*time.Second, 20*time.Millisecond, func() bool {
		for _, s := range readSpansFile(t, path) {
			if s.Name == otel.SpanHang {
				span = &s
				return true
			}
		}
		return false
	}) {
		t.Fatal("no gpu.hang span in the spans file within 5 s")
	}
	if span.Attributes["gpu.hang.status"] != "ongoing" || span.Attributes["gpu.nccl.op"] != "AllReduce" {
		t.Errorf("span attributes %v", span.Attributes)
	}
	metrics := func() string {
		resp, err := http.Get("http://" + x.PrometheusAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	text := metrics()
	for series, want := range map[string]float64{
		`gaptrace_hangs_total{pid="7",rank="0"}`:           1,
		`gaptrace_hang_duration_seconds{pid="7",rank="0"}`: 3,
	} {
		if got, ok := metricValue(text, series); !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v (found %v), want %v\n%s", series, got, ok, want, text)
		}
	}
	r.Status, r.End, r.Seconds = hang.Ended, now+1e9, 4
	x.Hang(r, false)
	if got, _ := metricValue(metrics(), `gaptrace_hang_duration_seconds{pid="7",rank="0"}`); got != 0 {
		t.Errorf("hang duration %v after it ended, want 0", got)
	}
}
