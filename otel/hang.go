package otel

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
)

// SpanHang is the span of a hang: exported when it is detected (ending
// then, with gpu.hang.status "ongoing") and again when it ends, each at
// once rather than with the next batch.
const SpanHang = "gpu.hang"

// hangFlushTimeout bounds the flush that sends a hang span at once.
const hangFlushTimeout = 5 * time.Second

// hangMetrics: gaptrace.hangs (gaptrace_hangs_total) counts hangs as they
// begin; gaptrace.hang.duration (gaptrace_hang_duration_seconds) is each
// hung process's ongoing hang, 0 once it ended.
type hangMetrics struct {
	once    sync.Once
	count   metric.Int64Counter
	mu      sync.Mutex
	seconds map[uint32]float64
	labels  map[uint32][]attribute.KeyValue
}

func (x *Exporter) hangInstruments() *hangMetrics {
	h := &x.hangs
	h.once.Do(func() {
		meter := x.metrics.mp.Meter(instrumentationName)
		h.seconds, h.labels = map[uint32]float64{}, map[uint32][]attribute.KeyValue{}
		var err error
		h.count, err = meter.Int64Counter("gaptrace.hangs", metric.WithUnit("{hang}"),
			metric.WithDescription("hangs detected: a traced thread inside one CUDA sync, collective wait or blocking syscall past --hang-after without progress"))
		if err != nil {
			x.log.Warn("hang counter not registered", "err", err)
		}
		_, err = meter.Float64ObservableGauge("gaptrace.hang.duration", metric.WithUnit("s"),
			metric.WithDescription("seconds the process has been hung (0: not hung now)"),
			metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
				h.mu.Lock()
				defer h.mu.Unlock()
				for pid, s := range h.seconds {
					o.Observe(s, metric.WithAttributes(h.labels[pid]...))
				}
				return nil
			}))
		if err != nil {
			x.log.Warn("hang gauge not registered", "err", err)
		}
	})
	return h
}

// Hang exports a hang as it begins, lasts (metrics only) and ends. Safe
// from any goroutine.
func (x *Exporter) Hang(r *hang.Report, started bool) {
	if x.closed.Load() {
		return
	}
	h := x.hangInstruments()
	var w *correlate.Workload
	if r.Rank >= 0 {
		rank := int(r.Rank)
		w = &correlate.Workload{Rank: &rank}
	}
	labels := x.metrics.labels(-1, r.PID, w)
	h.mu.Lock()
	h.labels[r.PID] = labels
	if r.Status == hang.Ongoing {
		h.seconds[r.PID] = r.Seconds
	} else {
		h.seconds[r.PID] = 0
	}
	h.mu.Unlock()
	if started && h.count != nil {
		h.count.Add(context.Background(), 1, metric.WithAttributes(labels...))
	}
	if !started && r.Status == hang.Ongoing {
		return // the gauge moves; the span was sent when it began
	}
	end := r.Detected
	if r.End != 0 {
		end = r.End
	}
	_, sp := x.tracer.Start(context.Background(), SpanHang, trace.WithTimestamp(unix(r.Since)),
		trace.WithAttributes(hangAttributes(r)...))
	for _, st := range r.Stacks {
		for _, th := range st.Threads {
			sp.AddEvent("gpu.hang.thread", trace.WithTimestamp(unix(r.Detected)), trace.WithAttributes(
				semconv.ProcessPID(int(st.PID)), semconv.ThreadID(int(th.TID)),
				attribute.String("thread.name", th.Comm), attribute.String("thread.state", th.State),
				attribute.String("code.stacktrace", stackText(th))))
		}
	}
	sp.End(trace.WithTimestamp(unix(end)))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangFlushTimeout)
		defer cancel()
		if err := x.tp.ForceFlush(ctx); err != nil {
			x.log.Warn("hang span flush", "err", err)
		}
	}()
}

func hangAttributes(r *hang.Report) []attribute.KeyValue {
	c := &r.Call
	a := []attribute.KeyValue{
		semconv.ProcessPID(int(r.PID)), semconv.ThreadID(int(r.TID)),
		attribute.String("gpu.hang.id", r.ID), attribute.String("gpu.hang.status", r.Status),
		attribute.String("gpu.hang.reason", r.Reason), attribute.String("gpu.hang.call", c.Name),
		attribute.String("gpu.hang.call.kind", string(c.Kind)), attribute.Float64("gpu.hang.seconds", r.Seconds),
		attribute.Int64("gpu.hang.detected_unix_nano", r.Detected),
	}
	if r.Rank >= 0 {
		a = append(a, attribute.Int("gpu.rank", int(r.Rank)))
	}
	if c.Stream != 0 || c.Kind == hang.Sync {
		a = append(a, attribute.String("gpu.stream", fmt.Sprintf("%#x", c.Stream)))
	}
	if c.File != "" {
		a = append(a, attribute.String("gpu.hang.file", c.File))
	}
	if k := c.Collective; k != nil {
		a = append(a, attribute.String("gpu.nccl.op", k.Op), attribute.String("gpu.nccl.comm", fmt.Sprintf("%#x", k.Comm)),
			attribute.Int64("gpu.nccl.seq", k.Seq), attribute.Int64("gpu.nccl.bytes", int64(k.Bytes)))
	}
	var arrived, missing []int64
	var missingText []string
	for _, m := range r.Arrived {
		arrived = append(arrived, int64(m.Rank))
	}
	for _, m := range r.Missing {
		missing = append(missing, int64(m.Rank))
		missingText = append(missingText, fmt.Sprintf("rank %d pid %d %s %s %s", m.Rank, m.PID, m.Host, m.State, m.Exit))
	}
	if len(arrived) > 0 {
		a = append(a, attribute.Int64Slice("gpu.hang.ranks.arrived", arrived))
	}
	if len(missing) > 0 {
		a = append(a, attribute.Int64Slice("gpu.hang.ranks.missing", missing),
			attribute.StringSlice("gpu.hang.ranks.missing.detail", missingText))
	}
	if g := r.GPU; g != nil {
		a = append(a, attribute.Int("gpu.index", g.Device), attribute.Float64("gpu.hang.sm_activity", g.SMActivity),
			attribute.Float64("gpu.hang.utilization", g.Utilization))
	}
	return a
}

// stackText renders a thread's Python frames, then its native ones.
func stackText(th hang.Thread) string {
	var b strings.Builder
	for _, f := range th.Python {
		b.WriteString("py " + f.String() + "\n")
	}
	for _, f := range th.Native {
		b.WriteString(f.String() + "\n")
	}
	if th.Err != "" {
		b.WriteString("(" + th.Err + ")\n")
	}
	return b.String()
}
