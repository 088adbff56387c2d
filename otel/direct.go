package otel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Steps, their gaps and the gaps' host operations are most of the spans, a
// few for every step of every traced process (8 ranks at 60 steps a second
// each: 1,250 spans a second). They are built here as finished spans and
// handed to the span processors, not through the SDK's tracer: its Start
// and End copied each span's attributes four times and deduplicated them
// through a map, 17% of the sidecar's CPU on that job. The SDK's own
// decisions are kept: the provider's sampler, its ID generator (a job's
// shared spans take their derived IDs, fixedIDs), its resource and the
// default span limits.
// What the spans carry is built once per span: the attribute lists are
// the span's own, never reused.

// directOut holds what a directly built span takes from the provider.
type directOut struct {
	sampler sdktrace.Sampler
	res     *resource.Resource
	scope   instrumentation.Scope
	procs   []sdktrace.SpanProcessor
}

func newDirectOut(sampler sdktrace.Sampler, res *resource.Resource, procs ...sdktrace.SpanProcessor) *directOut {
	// The provider merges its resource with OTEL_RESOURCE_ATTRIBUTES
	// (sdktrace.WithResource); spans built here carry the same.
	merged, err := resource.Merge(resource.Environment(), res)
	if err != nil {
		merged = res
	}
	return &directOut{sampler: sampler, res: merged, scope: instrumentation.Scope{Name: instrumentationName}, procs: procs}
}

// spanAttrLimit is the SDK's default attribute count limit: past it the
// SDK keeps the first attributes and counts the rest dropped.
const spanAttrLimit = 128

// directSpan is a span being built. A span its sampler dropped records
// nothing, but its context still parents children (the SDK's
// non-recording span).
type directSpan struct {
	out       *directOut
	stub      tracetest.SpanStub
	recording bool
	children  int
}

// start begins a span under parent (invalid: the root of a new trace) with
// the IDs in fixed when set. attrs becomes the span's own list.
func (o *directOut) start(parent trace.SpanContext, fixed *fixedIDs, name string, at int64, attrs []attribute.KeyValue) *directSpan {
	var tid trace.TraceID
	var sid trace.SpanID
	switch {
	case fixed != nil:
		tid, sid = fixed.trace, fixed.span
	case parent.IsValid():
		tid, sid = parent.TraceID(), randomSpanID()
	default:
		tid, sid = idGenerator{}.NewIDs(context.Background())
	}
	pctx := context.Background()
	if parent.IsValid() {
		pctx = trace.ContextWithSpanContext(pctx, parent)
	}
	res := o.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: pctx, TraceID: tid, Name: name,
		Kind: trace.SpanKindInternal, Attributes: attrs})
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceState: res.Tracestate}
	if res.Decision == sdktrace.RecordAndSample {
		cfg.TraceFlags = parent.TraceFlags() | trace.FlagsSampled
	} else {
		cfg.TraceFlags = parent.TraceFlags() &^ trace.FlagsSampled
	}
	d := &directSpan{out: o, recording: res.Decision != sdktrace.Drop}
	d.stub.Name = name
	d.stub.SpanContext = trace.NewSpanContext(cfg)
	d.stub.Parent = parent
	d.stub.SpanKind = trace.SpanKindInternal
	d.stub.StartTime = unix(at)
	d.stub.Resource = o.res
	d.stub.InstrumentationScope = o.scope
	if d.recording {
		d.setAttributes(attrs)
		d.stub.Attributes = append(d.stub.Attributes, res.Attributes...)
	}
	return d
}

// child begins a span under d.
func (d *directSpan) child(name string, at int64, attrs []attribute.KeyValue) *directSpan {
	if d.recording {
		d.children++
	}
	return d.out.start(d.stub.SpanContext, nil, name, at, attrs)
}

func (d *directSpan) SpanContext() trace.SpanContext { return d.stub.SpanContext }

// setAttributes adds attrs, dropping invalid ones and those past the limit
// as the SDK does. The first call takes attrs as the span's own list.
func (d *directSpan) setAttributes(attrs []attribute.KeyValue) {
	if !d.recording || len(attrs) == 0 {
		return
	}
	valid := true
	for _, a := range attrs {
		if !a.Valid() {
			valid = false
			break
		}
	}
	if valid && d.stub.Attributes == nil && len(attrs) <= spanAttrLimit {
		d.stub.Attributes = attrs
		return
	}
	for _, a := range attrs {
		switch {
		case !a.Valid():
			d.stub.DroppedAttributes++
		case len(d.stub.Attributes) >= spanAttrLimit:
			d.stub.DroppedAttributes++
		default:
			d.stub.Attributes = append(d.stub.Attributes, a)
		}
	}
}

// addEvent records an event at a time.
func (d *directSpan) addEvent(name string, at int64, attrs ...attribute.KeyValue) {
	if !d.recording {
		return
	}
	d.stub.Events = append(d.stub.Events, sdktrace.Event{Name: name, Time: unix(at), Attributes: attrs})
}

// end finishes the span and hands it to the processors.
func (d *directSpan) end(at int64) {
	if !d.recording {
		return
	}
	d.stub.EndTime = unix(at)
	d.stub.ChildSpanCount = d.children
	ro := d.stub.Snapshot()
	for _, p := range d.out.procs {
		p.OnEnd(ro)
	}
	d.recording = false
}

// processors are the provider's span processors, in its order: the
// primary output's batcher, then the spans file's copy when there is one.
func (x *Exporter) processors() []sdktrace.SpanProcessor {
	ps := []sdktrace.SpanProcessor{x.batcher}
	if x.copy != nil {
		ps = append(ps, x.copy)
	}
	return ps
}
