package otel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// batcher is a span processor with a bounded queue that never blocks the
// caller and counts everything it loses. The SDK's BatchSpanProcessor also
// drops on a full queue but does not expose how many spans it dropped or
// how long its queue is, and both are part of what gaptrace reports.
//
// One goroutine owns the exporter: it collects up to batchSize spans or
// waits batchTimeout, then exports. While an export is retrying (the OTLP
// exporters back off inside their own timeout) the queue keeps absorbing
// spans up to its capacity; beyond that OnEnd drops.
type batcher struct {
	exp          sdktrace.SpanExporter
	queue        chan sdktrace.ReadOnlySpan
	batchSize    int
	batchTimeout time.Duration
	log          *slog.Logger

	exported, dropped, errors atomic.Uint64
	lastErrLog                atomic.Int64 // unix ns of the last logged export error

	// runCtx is cancelled when Shutdown's deadline passes so that an
	// export stuck retrying against a dead collector gives up.
	runCtx    context.Context
	cancelRun context.CancelFunc
	flushReq  chan chan struct{}
	stopping  chan struct{}
	done      chan struct{}
	closed    atomic.Bool
	failing   atomic.Bool // the last export failed
	stopOnce  sync.Once
}

func newBatcher(exp sdktrace.SpanExporter, queueSize, batchSize int, batchTimeout time.Duration, log *slog.Logger) *batcher {
	ctx, cancel := context.WithCancel(context.Background())
	b := &batcher{
		exp:          exp,
		queue:        make(chan sdktrace.ReadOnlySpan, queueSize),
		batchSize:    batchSize,
		batchTimeout: batchTimeout,
		log:          log,
		runCtx:       ctx,
		cancelRun:    cancel,
		flushReq:     make(chan chan struct{}),
		stopping:     make(chan struct{}),
		done:         make(chan struct{}),
	}
	go b.run()
	return b
}

func (b *batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd enqueues without blocking; a full queue or a stopped batcher drops.
func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if b.closed.Load() {
		b.dropped.Add(1)
		return
	}
	select {
	case b.queue <- s:
	default:
		b.dropped.Add(1)
	}
}

func (b *batcher) run() {
	defer close(b.done)
	batch := make([]sdktrace.ReadOnlySpan, 0, b.batchSize)
	timer := time.NewTimer(b.batchTimeout)
	defer timer.Stop()
	export := func() {
		if len(batch) > 0 {
			b.export(batch)
			clear(batch)
			batch = batch[:0]
		}
	}
	for {
		select {
		case s := <-b.queue:
			batch = append(batch, s)
			if len(batch) >= b.batchSize {
				export()
				timer.Reset(b.batchTimeout)
			}
		case <-timer.C:
			export()
			timer.Reset(b.batchTimeout)
		case ack := <-b.flushReq:
			b.drain(&batch)
			export()
			close(ack)
		case <-b.stopping:
			b.drain(&batch)
			export()
			return
		}
	}
}

// drain moves everything queued now into batches, exporting full ones.
func (b *batcher) drain(batch *[]sdktrace.ReadOnlySpan) {
	for {
		select {
		case s := <-b.queue:
			*batch = append(*batch, s)
			if len(*batch) >= b.batchSize {
				b.export(*batch)
				clear(*batch)
				*batch = (*batch)[:0]
			}
		default:
			return
		}
	}
}

func (b *batcher) export(batch []sdktrace.ReadOnlySpan) {
	// Once stopping, a collector that just failed is not retried for every
	// remaining batch: each attempt could take the whole export timeout
	// and the process is waiting to exit. The batches are counted instead.
	if b.runCtx.Err() != nil || (b.closed.Load() && b.failing.Load()) {
		b.dropped.Add(uint64(len(batch)))
		return
	}
	if err := b.exp.ExportSpans(b.runCtx, batch); err != nil {
		b.failing.Store(true)
		b.errors.Add(1)
		b.dropped.Add(uint64(len(batch)))
		// A dead collector fails every batch; one line per 30 s is enough.
		now := time.Now().UnixNano()
		if last := b.lastErrLog.Load(); now-last > int64(30*time.Second) && b.lastErrLog.CompareAndSwap(last, now) {
			b.log.Warn("span export failed; spans dropped", "spans", len(batch),
				"dropped_total", b.dropped.Load(), "err", err)
		}
		return
	}
	b.failing.Store(false)
	b.exported.Add(uint64(len(batch)))
}

// ForceFlush exports everything queued before it returns or ctx ends.
func (b *batcher) ForceFlush(ctx context.Context) error {
	if b.closed.Load() {
		return nil
	}
	ack := make(chan struct{})
	select {
	case b.flushReq <- ack:
	case <-b.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flush spans: %w", ctx.Err())
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flush spans: %w", ctx.Err())
	}
}

// Shutdown stops accepting spans, exports what is queued until ctx ends,
// counts the rest as dropped and shuts the exporter down.
func (b *batcher) Shutdown(ctx context.Context) error {
	var err error
	b.stopOnce.Do(func() {
		b.closed.Store(true)
		close(b.stopping)
		select {
		case <-b.done:
		case <-ctx.Done():
			b.cancelRun()
			<-b.done
			err = fmt.Errorf("flush spans at shutdown: %w", ctx.Err())
		}
		b.cancelRun()
		// Spans that raced with closed or were left when the deadline hit.
		for {
			select {
			case <-b.queue:
				b.dropped.Add(1)
				continue
			default:
			}
			break
		}
		if e := b.exp.Shutdown(ctx); e != nil && !errors.Is(e, context.Canceled) {
			err = errors.Join(err, fmt.Errorf("shut down span exporter: %w", e))
		}
	})
	return err
}
