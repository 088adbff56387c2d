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
// One goroutine owns the exporter: it takes the queue when batchSize spans
// are waiting or every batchTimeout, then exports. While an export is
// retrying (the OTLP exporters back off inside their own timeout) the
// queue keeps absorbing spans up to its capacity; beyond that OnEnd drops.
// The queue is a slice under a mutex, not a channel: a step ends its spans
// one after another, and a channel woke the exporting goroutine for each
// (on 8 ranks, a fifth of all the sidecar's goroutine wake-ups); OnEnd
// signals it only when a batch is full.
type batcher struct {
	exp          sdktrace.SpanExporter
	queueSize    int
	qmu          sync.Mutex
	queue        []sdktrace.ReadOnlySpan // at most queueSize, guarded by qmu
	full         chan struct{}           // a batch is waiting; capacity 1
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
		queueSize:    queueSize,
		queue:        make([]sdktrace.ReadOnlySpan, 0, min(queueSize, batchSize)),
		full:         make(chan struct{}, 1),
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
	b.qmu.Lock()
	if b.closed.Load() || len(b.queue) >= b.queueSize {
		b.qmu.Unlock()
		b.dropped.Add(1)
		return
	}
	b.queue = append(b.queue, s)
	n := len(b.queue)
	b.qmu.Unlock()
	if n == b.batchSize || n == b.queueSize {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

// queueLen is how many spans wait for the exporting goroutine.
func (b *batcher) queueLen() int {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	return len(b.queue)
}

// take swaps the queue for spare (emptied) and returns what was queued.
func (b *batcher) take(spare []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	q := b.queue
	b.queue = spare[:0]
	return q
}

func (b *batcher) run() {
	defer close(b.done)
	var spare []sdktrace.ReadOnlySpan
	timer := time.NewTimer(b.batchTimeout)
	defer timer.Stop()
	// export sends what is queued, batchSize spans at a time.
	export := func() {
		q := b.take(spare)
		for rest := q; len(rest) > 0; {
			n := min(len(rest), b.batchSize)
			b.export(rest[:n])
			rest = rest[n:]
		}
		clear(q)
		spare = q[:0]
	}
	for {
		select {
		case <-b.full:
			export()
			timer.Reset(b.batchTimeout)
		case <-timer.C:
			export()
			b.retryDue()
			timer.Reset(b.batchTimeout)
		case ack := <-b.flushReq:
			export()
			close(ack)
		case <-b.stopping:
			export()
			b.retryAtExit()
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
		// Spans left when the deadline hit.
		b.dropped.Add(uint64(len(b.take(nil))))
		if e := b.exp.Shutdown(ctx); e != nil && !errors.Is(e, context.Canceled) {
			err = errors.Join(err, fmt.Errorf("shut down span exporter: %w", e))
		}
	})
	return err
}
