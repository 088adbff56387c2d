package record

import (
	"log/slog"
	"os"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// BenchmarkReplay runs a whole recording through a fresh engine, its calls
// decoded beforehand: the engine's own cost per recorded call, free of the
// machine's load. GAPTRACE_BENCH_REC names another recording (one of 8 ranks
// from tools/sidecar-cost.sh with GTFLAGS=--record is the busiest).
func BenchmarkReplay(b *testing.B) {
	path := os.Getenv("GAPTRACE_BENCH_REC")
	if path == "" {
		path = "../testdata/recordings/sim-ddp-sidecar-auto.rec.gz"
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	h, calls, err := Read(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	cfg := h.Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		Replay(cfg, discard{}, calls)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(calls)), "ns/call")
}

type discard struct{}

func (discard) Gap(correlate.Gap)         {}
func (discard) Step(correlate.StepResult) {}
