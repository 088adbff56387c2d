package otel

import (
	"slices"
	"sort"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/gaptrace/gaptrace/correlate"
)

// emitStep builds and ends every span of one step (direct.go): the root or
// the rank's span, its gaps and their host operations. Fixed IDs are given
// to the one span they name, never to its children.
// It returns the span the gaps hang under, for gaps that come later.
func (x *Exporter) emitStep(s correlate.Step, gaps []correlate.Gap) trace.SpanContext {
	stepAttrs := appendWhatIf(stepAttributes(s), s, gaps)
	out := x.direct
	var parent, root *directSpan
	job, rank := x.cfg.JobID, x.cfg.Rank
	if rank < 0 && s.Workload != nil && s.Workload.Rank != nil {
		// One sidecar tracing several ranks (torchrun's workers, a
		// DaemonSet): each step hangs under its own process's rank.
		rank = *s.Workload.Rank
	}
	if job == "" {
		root = out.start(trace.SpanContext{}, nil, SpanStep, s.Start, stepAttrs)
		parent = root
	} else {
		tid, rootID := StepTraceID(job, s.Number), StepRootSpanID(job, s.Number)
		jobAttr := attribute.String("gaptrace.job.id", job)
		remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: rootID,
			TraceFlags: trace.FlagsSampled, Remote: true})
		if rank <= 0 && x.claimRoot(s.Number) {
			// Rank 0, or a lone process of unknown rank, owns the root;
			// once per step even when the process drives several GPUs.
			// Each span gets a list of its own (stepAttrs has room).
			attrs := stepAttrs
			if rank >= 0 {
				attrs = slices.Clone(stepAttrs)
			}
			root = out.start(trace.SpanContext{}, &fixedIDs{tid, rootID}, SpanStep, s.Start, setAttr(attrs, jobAttr))
			parent = root
		}
		if rank >= 0 {
			parent = out.start(remote, &fixedIDs{tid, rankSpanID(job, s.Number, rank, s.Device)}, "rank "+strconv.Itoa(rank),
				s.Start, setAttr(setAttr(stepAttrs, jobAttr), attribute.Int("gaptrace.rank", rank)))
		}
		if parent == nil {
			// Rank -1 with a job ID on a second device: hang under the
			// root the first device emitted.
			parent = out.start(remote, nil, "device "+strconv.Itoa(s.Device), s.Start, stepAttrs)
		}
	}
	addStepEvents(parent, s)
	for i := range gaps {
		x.emitGap(parent.SpanContext(), parent, &gaps[i])
	}
	if root != nil && root != parent {
		root.end(s.End)
	}
	parent.end(s.End)
	return parent.SpanContext()
}

// emitGap emits one gap's span as a child of parent (invalid: the root of
// a trace of its own), with its host operations. under, when not nil, is
// parent's span being built (it counts its children).
func (x *Exporter) emitGap(parent trace.SpanContext, under *directSpan, g *correlate.Gap) {
	var sp *directSpan
	if under != nil {
		sp = under.child(SpanGap, g.Start, gapAttributes(g))
	} else {
		sp = x.direct.start(parent, nil, SpanGap, g.Start, gapAttributes(g))
	}
	sp.addEvent("gpu.queue.drained", g.Start, attribute.String("gpu.gap.source", g.Evidence.Source))
	var endAttrs []attribute.KeyValue
	if g.Evidence.CUDACall != "" {
		endAttrs = []attribute.KeyValue{attribute.String("gpu.cuda.call", g.Evidence.CUDACall)}
	}
	sp.addEvent("gpu.work.enqueued", g.End, endAttrs...)
	ops := g.Ops
	if len(ops) > MaxOpsPerGap {
		// Keep the longest: they explain the most of the gap.
		ops = append([]correlate.HostOp(nil), ops...)
		sort.SliceStable(ops, func(i, j int) bool { return ops[i].End-ops[i].Start > ops[j].End-ops[j].Start })
		sp.setAttributes([]attribute.KeyValue{attribute.Int("gpu.gap.ops.omitted", len(ops)-MaxOpsPerGap)})
		ops = ops[:MaxOpsPerGap]
	}
	for i := range ops {
		op := &ops[i]
		attrs := make([]attribute.KeyValue, 0, 1+len(op.Attrs))
		if op.TID != 0 {
			attrs = append(attrs, semconv.ThreadID(int(op.TID)))
		}
		for _, k := range sortedKeys(op.Attrs) {
			attrs = append(attrs, attribute.String(k, op.Attrs[k]))
		}
		name := op.Name
		if name == "" {
			name = "host.op"
		}
		sp.child(name, op.Start, attrs).end(op.End)
	}
	sp.end(g.End)
}

// setAttr sets kv in attrs: in place of an attribute of its key (a
// process's own rank, from its workload), else appended. A span's
// attributes never repeat a key.
func setAttr(attrs []attribute.KeyValue, kv attribute.KeyValue) []attribute.KeyValue {
	for i := range attrs {
		if attrs[i].Key == kv.Key {
			attrs[i] = kv
			return attrs
		}
	}
	return append(attrs, kv)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
