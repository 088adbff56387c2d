package otel

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// stuckExporter blocks every export until its context ends, like an OTLP
// exporter retrying against a collector that never answers.
type stuckExporter struct {
	calls atomic.Int32
}

func (s *stuckExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	s.calls.Add(1)
	<-ctx.Done()
	return ctx.Err()
}
func (s *stuckExporter) Shutdown(context.Context) error { return nil }

type failingExporter struct{}

func (failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	return errors.New("connection refused")
}
func (failingExporter) Shutdown(context.Context) error { return nil }

func spansThrough(b sdktrace.SpanProcessor) func(n int) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	tr := tp.Tracer("test")
	return func(n int) {
		for range n {
			_, sp := tr.Start(context.Background(), "s")
			sp.End()
		}
	}
}

func TestBatcherFullQueueDropsWithoutBlocking(t *testing.T) {
	exp := &stuckExporter{}
	b := newBatcher(exp, 16, 4, time.Hour, slog.Default())
	emit := spansThrough(b)

	// The first batch goes to the stuck exporter; wait for it so the
	// accounting below is exact.
	emit(4)
	deadline := time.Now().Add(5 * time.Second)
	for exp.calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("batcher never exported a full batch")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	emit(1000)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("ending 1000 spans against a stuck exporter took %s; OnEnd must not block", d)
	}
	if q := b.queueLen(); q != 16 {
		t.Errorf("queue holds %d spans, want its capacity 16", q)
	}
	if d := b.dropped.Load(); d != 1000-16 {
		t.Errorf("dropped %d, want %d", d, 1000-16)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	err := b.Shutdown(ctx)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown against a stuck exporter: err %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Shutdown took %s past a 200ms deadline", d)
	}
	// Every span is accounted for: nothing exported, all dropped.
	if got := b.dropped.Load() + b.exported.Load(); got != 1004 {
		t.Errorf("exported+dropped = %d, want 1004", got)
	}
	emit(3)
	if got := b.dropped.Load(); got != 1007 {
		t.Errorf("spans after Shutdown: dropped %d, want 1007", got)
	}
}

func TestBatcherCountsFailedExports(t *testing.T) {
	b := newBatcher(failingExporter{}, 64, 8, time.Hour, slog.Default())
	emit := spansThrough(b)
	emit(20)
	if err := b.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The first batch fails; the others wait behind it for the backoff
	// instead of each costing an attempt.
	if b.exported.Load() != 0 || b.dropped.Load() != 0 || b.errors.Load() != 1 {
		t.Errorf("exported %d dropped %d errors %d; want 0, 0 (kept for retry), 1",
			b.exported.Load(), b.dropped.Load(), b.errors.Load())
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b.dropped.Load() != 20 || b.errors.Load() != 2 {
		t.Errorf("after Shutdown: dropped %d errors %d; want 20 (one last attempt failed), 2", b.dropped.Load(), b.errors.Load())
	}
}

// recoveringExporter refuses until up is set, like a collector that is
// restarting.
type recoveringExporter struct {
	up       atomic.Bool
	calls    atomic.Int32
	exported atomic.Int32
}

func (r *recoveringExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	r.calls.Add(1)
	if !r.up.Load() {
		return errors.New("connection refused")
	}
	r.exported.Add(int32(len(spans)))
	return nil
}
func (r *recoveringExporter) Shutdown(context.Context) error { return nil }

// Spans ended while the collector is down are delivered once it is back,
// in a bounded number of attempts.
func TestBatcherRetriesAfterCollectorRecovers(t *testing.T) {
	exp := &recoveringExporter{}
	b := newBatcher(exp, 256, 8, 10*time.Millisecond, slog.Default())
	emit := spansThrough(b)
	emit(100)
	deadline := time.Now().Add(5 * time.Second)
	for b.errors.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	emit(60)
	time.Sleep(200 * time.Millisecond) // several batch timeouts while down
	if c := exp.calls.Load(); c > 2 {
		t.Errorf("%d export attempts while the collector was down inside the backoff", c)
	}
	exp.up.Store(true)
	for exp.exported.Load() < 160 && time.Now().Before(deadline.Add(5*time.Second)) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := exp.exported.Load(); got != 160 || b.dropped.Load() != 0 {
		t.Errorf("delivered %d of 160 after recovery, dropped %d", got, b.dropped.Load())
	}
}

// What waits for retry is bounded: beyond the queue size the oldest
// spans are dropped and counted.
func TestBatcherRetryBounded(t *testing.T) {
	b := newBatcher(failingExporter{}, 32, 8, time.Hour, slog.Default())
	emit := spansThrough(b)
	for range 10 {
		emit(30)
		if err := b.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	b.flushReq <- done // runs on the batcher's goroutine: read retryN there
	<-done
	if b.retryN > 32 {
		t.Errorf("%d spans held for retry, cap 32", b.retryN)
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := b.dropped.Load(); d != 300 {
		t.Errorf("dropped %d of 300 against a dead collector", d)
	}
}

// slowFailingExporter fails each export after a delay, like a retry loop
// that gives up.
type slowFailingExporter struct{ calls atomic.Int32 }

func (s *slowFailingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	s.calls.Add(1)
	time.Sleep(50 * time.Millisecond)
	return errors.New("connection refused")
}
func (s *slowFailingExporter) Shutdown(context.Context) error { return nil }

func TestBatcherShutdownGivesUpOnFailingCollector(t *testing.T) {
	exp := &slowFailingExporter{}
	b := newBatcher(exp, 1024, 8, time.Hour, slog.Default())
	emit := spansThrough(b)
	emit(800) // 100 batches; trying each would take 5 s
	start := time.Now()
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Shutdown took %s retrying a failing collector batch after batch", d)
	}
	if b.dropped.Load() != 800 || b.exported.Load() != 0 {
		t.Errorf("dropped %d exported %d, want 800 and 0", b.dropped.Load(), b.exported.Load())
	}
	if c := exp.calls.Load(); c >= 100 {
		t.Errorf("%d export attempts for 100 batches after the collector failed", c)
	}
}
