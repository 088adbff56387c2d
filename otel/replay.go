package otel

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Replay sends the spans of a file written in file mode to the OTLP
// endpoint of cfg (flag or environment, as for New), so a run recorded
// without a collector can be looked at in Jaeger or Tempo later. Span and
// trace IDs, parents, times, attributes, events and the resource are kept;
// numbers come back as int64 when integral (JSON does not say which they
// were). It returns how many spans were exported.
func Replay(ctx context.Context, path string, cfg Config) (int, error) {
	r, err := resolve(cfg)
	if err != nil {
		return 0, fmt.Errorf("otel config: %w", err)
	}
	if r.mode != "otlp" {
		return 0, errors.New("replay needs an OTLP endpoint (flag or OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
	exp, err := newOTLPTraceExporter(ctx, r)
	if err != nil {
		return 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open spans file: %w", err)
	}
	defer f.Close()

	resources := map[string]*resource.Resource{}
	scope := instrumentation.Scope{Name: instrumentationName}
	batch := make([]sdktrace.ReadOnlySpan, 0, DefaultBatchSize)
	sent := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := exp.ExportSpans(ctx, batch); err != nil {
			return fmt.Errorf("export replayed spans: %w", err)
		}
		sent += len(batch)
		batch = batch[:0]
		return nil
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		var fs FileSpan
		if err := json.Unmarshal(sc.Bytes(), &fs); err != nil {
			return sent, errors.Join(fmt.Errorf("%s:%d: %w", path, line, err), exp.Shutdown(ctx))
		}
		stub, err := fs.stub()
		if err != nil {
			return sent, errors.Join(fmt.Errorf("%s:%d: %w", path, line, err), exp.Shutdown(ctx))
		}
		key := fs.Service + "\x00" + fmt.Sprint(sortedPairs(fs.Resource))
		res, ok := resources[key]
		if !ok {
			attrs := append(toAttributes(fs.Resource), semconv.ServiceName(fs.Service))
			res = resource.NewWithAttributes(semconv.SchemaURL, attrs...)
			resources[key] = res
		}
		stub.Resource = res
		stub.InstrumentationScope = scope
		batch = append(batch, stub.Snapshot())
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return sent, errors.Join(err, exp.Shutdown(ctx))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return sent, errors.Join(fmt.Errorf("read %s: %w", path, err), exp.Shutdown(ctx))
	}
	if err := flush(); err != nil {
		return sent, errors.Join(err, exp.Shutdown(ctx))
	}
	return sent, exp.Shutdown(ctx)
}

func (fs *FileSpan) stub() (tracetest.SpanStub, error) {
	tid, err := trace.TraceIDFromHex(fs.TraceID)
	if err != nil {
		return tracetest.SpanStub{}, fmt.Errorf("trace_id: %w", err)
	}
	sid, err := trace.SpanIDFromHex(fs.SpanID)
	if err != nil {
		return tracetest.SpanStub{}, fmt.Errorf("span_id: %w", err)
	}
	s := tracetest.SpanStub{
		Name: fs.Name,
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
			TraceFlags: trace.FlagsSampled}),
		SpanKind:   trace.SpanKindInternal,
		StartTime:  time.Unix(0, fs.StartUnixNano),
		EndTime:    time.Unix(0, fs.EndUnixNano),
		Attributes: toAttributes(fs.Attributes),
	}
	if fs.ParentSpanID != "" {
		pid, err := trace.SpanIDFromHex(fs.ParentSpanID)
		if err != nil {
			return tracetest.SpanStub{}, fmt.Errorf("parent_span_id: %w", err)
		}
		s.Parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: pid,
			TraceFlags: trace.FlagsSampled, Remote: true})
	}
	for _, e := range fs.Events {
		s.Events = append(s.Events, sdktrace.Event{Name: e.Name, Time: time.Unix(0, e.TimeUnixNano),
			Attributes: toAttributes(e.Attributes)})
	}
	return s, nil
}

func sortedPairs(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, k+"="+fmt.Sprint(m[k]))
	}
	return out
}

// toAttributes turns decoded JSON values back into attributes.
func toAttributes(m map[string]any) []attribute.KeyValue {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]attribute.KeyValue, 0, len(m))
	for _, k := range keys {
		switch v := m[k].(type) {
		case string:
			out = append(out, attribute.String(k, v))
		case bool:
			out = append(out, attribute.Bool(k, v))
		case float64:
			out = append(out, number(k, v))
		case []any:
			out = append(out, slice(k, v))
		default:
			out = append(out, attribute.String(k, fmt.Sprint(v)))
		}
	}
	return out
}

func integral(v float64) bool { return v == math.Trunc(v) && math.Abs(v) < 1<<53 }

func number(k string, v float64) attribute.KeyValue {
	if integral(v) {
		return attribute.Int64(k, int64(v))
	}
	return attribute.Float64(k, v)
}

func slice(k string, vs []any) attribute.KeyValue {
	var strs []string
	var nums []float64
	allInt := true
	for _, v := range vs {
		switch x := v.(type) {
		case string:
			strs = append(strs, x)
		case float64:
			nums = append(nums, x)
			allInt = allInt && integral(x)
		default:
			strs = append(strs, fmt.Sprint(x))
		}
	}
	switch {
	case len(strs) > 0 || len(nums) == 0:
		for _, n := range nums {
			strs = append(strs, fmt.Sprint(n))
		}
		return attribute.StringSlice(k, strs)
	case allInt:
		ints := make([]int64, len(nums))
		for i, n := range nums {
			ints[i] = int64(n)
		}
		return attribute.Int64Slice(k, ints)
	default:
		return attribute.Float64Slice(k, nums)
	}
}
