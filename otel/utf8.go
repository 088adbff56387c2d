package otel

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Protobuf string fields must be valid UTF-8, and one invalid string makes
// the OTLP exporters reject the whole batch ("string field contains
// invalid UTF-8"). File names, process names and command lines come from
// the traced program and are bytes, not text, so every string that leaves
// gaptrace is made valid first.

// ValidUTF8 returns s with each byte that is not part of valid UTF-8
// written as \xNN, so the value stays readable and distinct instead of
// collapsing into U+FFFD.
func ValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, `\x%02x`, s[i])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func validKVs(kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		if !utf8.ValidString(string(kv.Key)) {
			return false
		}
		switch kv.Value.Type() {
		case attribute.STRING:
			if !utf8.ValidString(kv.Value.AsString()) {
				return false
			}
		case attribute.STRINGSLICE:
			for _, s := range kv.Value.AsStringSlice() {
				if !utf8.ValidString(s) {
					return false
				}
			}
		}
	}
	return true
}

// validAttributes returns kvs with every key and string made valid UTF-8;
// kvs itself when it already is.
func validAttributes(kvs []attribute.KeyValue) []attribute.KeyValue {
	if validKVs(kvs) {
		return kvs
	}
	out := make([]attribute.KeyValue, len(kvs))
	for i, kv := range kvs {
		k := attribute.Key(ValidUTF8(string(kv.Key)))
		switch kv.Value.Type() {
		case attribute.STRING:
			out[i] = k.String(ValidUTF8(kv.Value.AsString()))
		case attribute.STRINGSLICE:
			ss := kv.Value.AsStringSlice()
			for j := range ss {
				ss[j] = ValidUTF8(ss[j])
			}
			out[i] = k.StringSlice(ss)
		default:
			out[i] = attribute.KeyValue{Key: k, Value: kv.Value}
		}
	}
	return out
}

func validSpan(s sdktrace.ReadOnlySpan) bool {
	if !utf8.ValidString(s.Name()) || !validKVs(s.Attributes()) {
		return false
	}
	for _, e := range s.Events() {
		if !utf8.ValidString(e.Name) || !validKVs(e.Attributes) {
			return false
		}
	}
	for _, l := range s.Links() {
		if !validKVs(l.Attributes) {
			return false
		}
	}
	return utf8.ValidString(s.Status().Description)
}

// validResource rebuilds r with valid strings (OTEL_RESOURCE_ATTRIBUTES
// and the target's command line can carry any bytes).
func validResource(r *resource.Resource) *resource.Resource {
	if r == nil || validKVs(r.Attributes()) {
		return r
	}
	return resource.NewWithAttributes(r.SchemaURL(), validAttributes(r.Attributes())...)
}

// utf8Exporter passes spans on with every string valid UTF-8. Spans that
// already are (nearly all) pass unchanged, without a copy.
type utf8Exporter struct{ next sdktrace.SpanExporter }

func (x utf8Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := spans
	// A batch's spans share one resource (immutable): its attributes,
	// copied out on each call, are checked once per resource, not once
	// per span (a tenth of what the sidecar allocated on a loader job).
	var lastRes *resource.Resource
	resOK := true
	for i, s := range spans {
		if r := s.Resource(); r != lastRes || i == 0 {
			lastRes, resOK = r, validKVs(r.Attributes())
		}
		if resOK && validSpan(s) {
			continue
		}
		if &out[0] == &spans[0] {
			out = append([]sdktrace.ReadOnlySpan(nil), spans...)
		}
		st := tracetest.SpanStubFromReadOnlySpan(s)
		st.Name = ValidUTF8(st.Name)
		st.Attributes = validAttributes(st.Attributes)
		for j := range st.Events {
			st.Events[j].Name = ValidUTF8(st.Events[j].Name)
			st.Events[j].Attributes = validAttributes(st.Events[j].Attributes)
		}
		for j := range st.Links {
			st.Links[j].Attributes = validAttributes(st.Links[j].Attributes)
		}
		st.Status.Description = ValidUTF8(st.Status.Description)
		st.Resource = validResource(st.Resource)
		out[i] = st.Snapshot()
	}
	return x.next.ExportSpans(ctx, out)
}

func (x utf8Exporter) Shutdown(ctx context.Context) error { return x.next.Shutdown(ctx) }
