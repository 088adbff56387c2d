package otel

import (
	"context"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestUTF8ExporterChecksEachResource: a batch whose spans carry different
// resources has each one checked, not only the first span's.
func TestUTF8ExporterChecksEachResource(t *testing.T) {
	good := resource.NewSchemaless(attribute.String("process.command", "/opt/train"))
	bad := resource.NewSchemaless(attribute.String("process.command", "/opt/tr\xffin"))
	var spans []sdktrace.ReadOnlySpan
	for _, r := range []*resource.Resource{good, good, bad, good, bad} {
		spans = append(spans, tracetest.SpanStub{Name: "train.step", Resource: r}.Snapshot())
	}
	mem := tracetest.NewInMemoryExporter()
	if err := (utf8Exporter{next: mem}).ExportSpans(context.Background(), spans); err != nil {
		t.Fatal(err)
	}
	got := mem.GetSpans()
	if len(got) != len(spans) {
		t.Fatalf("%d spans exported, want %d", len(got), len(spans))
	}
	for i, s := range got {
		for _, kv := range s.Resource.Attributes() {
			if !utf8.ValidString(kv.Value.AsString()) {
				t.Errorf("span %d: resource %s=%q is not valid UTF-8", i, kv.Key, kv.Value.AsString())
			}
		}
	}
}
