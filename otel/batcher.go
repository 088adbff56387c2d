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

	// Batches a failed export left, oldest first, retried with backoff;
	// at most retryCap spans, the oldest dropped beyond. Owned by run.
	retry     [][]sdktrace.ReadOnlySpan
	retryN    int
	retryCap  int
	nextRetry time.Time
	backoff   time.Duration
}

// Retry backoff after a failed export: a collector restart or a network
// blip is ridden out without an export attempt per batch meanwhile.
const (
	retryBackoffMin = time.Second
	retryBackoffMax = 30 * time.Second
)

// errLogEvery bounds how often a failing export is logged.
const errLogEvery = 30 * time.Second

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
		retryCap:     queueSize,
		backoff:      retryBackoffMin,
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
			b.retryDue()
			timer.Reset(b.batchTimeout)
		case ack := <-b.flushReq:
			b.drain(&batch)
			export()
			close(ack)
		case <-b.stopping:
			b.drain(&batch)
			export()
			b.retryAtExit()
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
	// and the process is waiting to exit. The batch waits with the others
	// for the one attempt at exit.
	if b.runCtx.Err() != nil {
		b.dropped.Add(uint64(len(batch)))
		return
	}
	if len(b.retry) > 0 || b.closed.Load() && b.failing.Load() {
		// Order is kept: older batches go first, when the backoff allows.
		b.stash(batch)
		b.retryDue()
		return
	}
	if !b.attempt(batch) {
		b.stash(batch)
	}
}

// attempt exports one batch and updates the counters and the backoff.
func (b *batcher) attempt(batch []sdktrace.ReadOnlySpan) bool {
	err := b.exp.ExportSpans(b.runCtx, batch)
	if err == nil {
		if b.failing.Load() {
			b.log.Info("span export recovered", "failed_exports", b.errors.Load(), "dropped_total", b.dropped.Load())
		}
		b.failing.Store(false)
		b.backoff = retryBackoffMin
		b.exported.Add(uint64(len(batch)))
		return true
	}
	b.failing.Store(true)
	b.errors.Add(1)
	b.nextRetry = time.Now().Add(b.backoff)
	b.backoff = min(2*b.backoff, retryBackoffMax)
	// The first failure is said at once (the exporter does not retry
	// inside the call, see newOTLPTraceExporter); a dead collector fails
	// every retry after it, and one line per errLogEvery is enough.
	now := time.Now().UnixNano()
	if last := b.lastErrLog.Load(); (last == 0 || now-last > int64(errLogEvery)) && b.lastErrLog.CompareAndSwap(last, now) {
		b.log.Warn("span export failed; spans kept for retry (bounded, oldest dropped first); said again at most every "+errLogEvery.String()+" while it fails",
			"spans", len(batch), "retrying", b.retryN+len(batch), "failed_exports", b.errors.Load(), "dropped_total", b.dropped.Load(), "err", err)
	}
	return false
}

// stash keeps a copy of batch for retry (the caller reuses its slice),
// dropping the oldest kept batches beyond retryCap spans.
func (b *batcher) stash(batch []sdktrace.ReadOnlySpan) {
	b.retry = append(b.retry, append([]sdktrace.ReadOnlySpan(nil), batch...))
	b.retryN += len(batch)
	for b.retryN > b.retryCap && len(b.retry) > 0 {
		b.dropped.Add(uint64(len(b.retry[0])))
		b.retryN -= len(b.retry[0])
		b.retry[0] = nil
		b.retry = b.retry[1:]
	}
}

// retryDue retries kept batches, oldest first, when the backoff has
// passed; it stops at the first failure.
func (b *batcher) retryDue() {
	for len(b.retry) > 0 && !time.Now().Before(b.nextRetry) && b.runCtx.Err() == nil {
		if !b.attempt(b.retry[0]) {
			return
		}
		b.retryN -= len(b.retry[0])
		b.retry[0] = nil
		b.retry = b.retry[1:]
	}
}

// retryAtExit gives kept batches one more chance, whatever the backoff,
// and counts what is still left as dropped: one failed attempt ends it,
// so a dead collector costs at most one export timeout here.
func (b *batcher) retryAtExit() {
	b.nextRetry = time.Time{}
	b.retryDue()
	for _, r := range b.retry {
		b.dropped.Add(uint64(len(r)))
	}
	b.retry, b.retryN = nil, 0
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
