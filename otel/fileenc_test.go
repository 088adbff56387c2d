package otel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// encodingJSONLine is the reference: the spans file line as encoding/json
// writes it.
func encodingJSONLine(t *testing.T, s sdktrace.ReadOnlySpan, service string, res map[string]any) []byte {
	t.Helper()
	fs := toFileSpan(s, service)
	fs.Resource = res
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(fs); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The strings a traced program hands us: paths, command lines, bytes that
// are not UTF-8, HTML, control characters, line separators.
var awkwardStrings = []string{"", "plain", `q"uo\te`, "<a href='x'>&amp;</a>", "tab\tnl\nret\rbs\bff\f\x00\x1f\x7f",
	"caf\u00e9 \u4e2d\u6587 \U0001f600", "\u2028\u2029", "bad\xffutf8\xc3", "/data/shard-00001.tar", strings.Repeat("x", 300)}

func randomValue(r *rand.Rand) attribute.Value {
	str := func() string { return awkwardStrings[r.IntN(len(awkwardStrings))] }
	floats := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e-7, 1.5e-6, 1e-6, 123456789.125, 1e20, 1e21, 3e300, -2.5e-300,
		math.MaxFloat64, math.SmallestNonzeroFloat64, 4.026825, 0.12023499975469754}
	switch r.IntN(8) {
	case 0:
		return attribute.BoolValue(r.IntN(2) == 0)
	case 1:
		return attribute.Int64Value(r.Int64() - math.MaxInt64/2)
	case 2:
		if r.IntN(2) == 0 {
			return attribute.Float64Value(floats[r.IntN(len(floats))])
		}
		return attribute.Float64Value(math.Float64frombits(r.Uint64()&^(0x7ff<<52) | uint64(r.IntN(0x7ff))<<52))
	case 3:
		return attribute.StringValue(str())
	case 4:
		return attribute.BoolSliceValue([]bool{true, false}[:r.IntN(3)])
	case 5:
		return attribute.Int64SliceValue([]int64{-1, 0, math.MaxInt64}[:r.IntN(4)])
	case 6:
		return attribute.Float64SliceValue(floats[:r.IntN(4)])
	default:
		return attribute.StringSliceValue([]string{str(), str()}[:r.IntN(3)])
	}
}

func randomAttrs(r *rand.Rand, n int) []attribute.KeyValue {
	keys := []string{"gpu.step.number", "gpu.idle", "a", "b", "<k>", "z\u2028", "gpu.name", "process.pid"}
	var kvs []attribute.KeyValue
	for range n {
		kvs = append(kvs, attribute.KeyValue{Key: attribute.Key(keys[r.IntN(len(keys))]), Value: randomValue(r)})
	}
	return kvs
}

// TestFileSpanEncoding holds the spans file's hand-written encoder to
// encoding/json's output for the same span, byte for byte, over random
// spans: every attribute type, empty slices, repeated keys (the last value
// wins, as in a map), awkward strings, floats at the format's cutoffs.
func TestFileSpanEncoding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	t0 := time.Unix(1796108196, 711987665)
	var o attrOrders
	for i := range 3000 {
		stub := tracetest.SpanStub{
			Name: awkwardStrings[r.IntN(len(awkwardStrings))],
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{byte(i), 0xab, 3}, SpanID: trace.SpanID{0xfe, byte(i >> 8), byte(i)}}),
			StartTime:  t0.Add(time.Duration(i) * time.Millisecond),
			EndTime:    t0.Add(time.Duration(i)*time.Millisecond + time.Duration(r.IntN(1e9))),
			Attributes: randomAttrs(r, r.IntN(12)),
		}
		if r.IntN(2) == 0 {
			stub.Parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: stub.SpanContext.TraceID(), SpanID: trace.SpanID{1, 2, byte(i)}})
		}
		for range r.IntN(3) {
			stub.Events = append(stub.Events, sdktrace.Event{Name: awkwardStrings[r.IntN(len(awkwardStrings))],
				Time: t0.Add(time.Duration(r.IntN(1e9))), Attributes: randomAttrs(r, r.IntN(3))})
		}
		span := stub.Snapshot()
		var res map[string]any
		var resJSON []byte
		if i%3 != 0 {
			res = attrMap(randomAttrs(r, 1+r.IntN(4)))
			b, err := json.Marshal(res)
			if err != nil {
				continue // NaN in the resource: not a case the exporter meets
			}
			resJSON = b
		}
		service := awkwardStrings[r.IntN(len(awkwardStrings))]

		var want bytes.Buffer
		fs := toFileSpan(span, service)
		fs.Resource = res
		wantErr := json.NewEncoder(&want).Encode(fs)
		// Twice: the second finds its keys' order remembered.
		for range 2 {
			got, err := appendFileSpan(nil, span, service, resJSON, &o)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("span %d: error %v, encoding/json's %v", i, err, wantErr)
			}
			if err == nil && !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("span %d differs:\n got %s\nwant %s", i, got, want.Bytes())
			}
		}
	}
}

// TestFileExporterResource: the resource object is encoded once per
// resource and written on every line, and a resource without attributes
// other than service.name leaves the field out.
func TestFileExporterResource(t *testing.T) {
	path := t.TempDir() + "/spans.jsonl"
	x, err := newFileExporter(path, "svc", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	withAttrs := resource.NewSchemaless(attribute.String("service.name", "svc"), attribute.String("host.name", "h<1>"))
	bare := resource.NewSchemaless(attribute.String("service.name", "svc"))
	var spans []sdktrace.ReadOnlySpan
	for i, r := range []*resource.Resource{withAttrs, withAttrs, bare, withAttrs} {
		spans = append(spans, tracetest.SpanStub{Name: "s", Resource: r,
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{byte(i + 1)}}),
			Attributes:  []attribute.KeyValue{attribute.Int("i", i)}}.Snapshot())
	}
	if err := x.ExportSpans(t.Context(), spans[:2]); err != nil {
		t.Fatal(err)
	}
	if err := x.ExportSpans(t.Context(), spans[2:]); err != nil {
		t.Fatal(err)
	}
	if err := x.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for _, s := range spans {
		want.Write(encodingJSONLine(t, s, "svc", x.resourceAttrs(s.Resource())))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	if got != want.String() {
		t.Fatalf("spans file:\n%s\nwant\n%s", got, want.String())
	}
	if strings.Count(got, `"resource":{"host.name":"h\u003c1\u003e"}`) != 3 {
		t.Fatalf("want the resource on the 3 lines of the resource that has attributes:\n%s", got)
	}
}

// BenchmarkFileSpan encodes a step-like span (25 attributes, the resource)
// as the file exporter does, its key order remembered after the first.
func BenchmarkFileSpan(b *testing.B) {
	var attrs []attribute.KeyValue
	for i := range 25 {
		attrs = append(attrs, attribute.Float64(fmt.Sprintf("gpu.step.attr_%02d", (i*7)%25), float64(i)/3))
	}
	span := tracetest.SpanStub{Name: "train.step",
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}}),
		StartTime:   time.Unix(1796108196, 0), EndTime: time.Unix(1796108197, 0), Attributes: attrs}.Snapshot()
	res := []byte(`{"host.name":"vm","process.pid":4994}`)
	var o attrOrders
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = appendFileSpan(buf[:0], span, "gaptrace", res, &o); err != nil {
			b.Fatal(err)
		}
	}
}
