package otel

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/gaptrace/gaptrace/internal/safefile"
)

// FileSpan is one line of the JSON-lines spans file written in file mode.
// It carries the same information an OTLP backend would get, flattened so
// that jq and a few lines of Python can read it.
type FileSpan struct {
	TraceID       string         `json:"trace_id"`
	SpanID        string         `json:"span_id"`
	ParentSpanID  string         `json:"parent_span_id,omitempty"`
	Name          string         `json:"name"`
	StartUnixNano int64          `json:"start_unix_nano"`
	EndUnixNano   int64          `json:"end_unix_nano"`
	Attributes    map[string]any `json:"attributes,omitempty"`
	Events        []FileEvent    `json:"events,omitempty"`
	Service       string         `json:"service"`
	// Resource holds the resource attributes other than service.name
	// (host, target process, GPU, k8s.*), so Replay can restore them.
	Resource map[string]any `json:"resource,omitempty"`
}

// FileEvent is a span event in FileSpan.
type FileEvent struct {
	Name         string         `json:"name"`
	TimeUnixNano int64          `json:"time_unix_nano"`
	Attributes   map[string]any `json:"attributes,omitempty"`
}

// fileExporter writes spans as JSON lines. It is only called from the
// batcher's goroutine, the mutex guards against Shutdown racing an export.
type fileExporter struct {
	mu      sync.Mutex
	f       *safefile.Writer
	service string

	// The provider has one resource; its map is built once.
	lastRes  *resource.Resource
	resAttrs map[string]any
	resJSON  []byte // resAttrs encoded; empty when there are none

	line  []byte     // the batch being encoded, reused
	order attrOrders // the order attributes are written in
}

func (x *fileExporter) resourceAttrs(r *resource.Resource) map[string]any {
	if r == x.lastRes {
		return x.resAttrs
	}
	var kvs []attribute.KeyValue
	for _, kv := range r.Attributes() {
		if kv.Key != "service.name" {
			kvs = append(kvs, kv)
		}
	}
	x.lastRes, x.resAttrs, x.resJSON = r, attrMap(kvs), nil
	return x.resAttrs
}

func newFileExporter(path, service string, maxSize int64, keep int) (*fileExporter, error) {
	f, err := safefile.NewWriter(path)
	if err != nil {
		return nil, fmt.Errorf("open spans file: %w", err)
	}
	f.MaxSize, f.Keep = maxSize, keep
	return &fileExporter{f: f, service: service}, nil
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func toFileSpan(s sdktrace.ReadOnlySpan, service string) FileSpan {
	fs := FileSpan{
		TraceID:       s.SpanContext().TraceID().String(),
		SpanID:        s.SpanContext().SpanID().String(),
		Name:          s.Name(),
		StartUnixNano: s.StartTime().UnixNano(),
		EndUnixNano:   s.EndTime().UnixNano(),
		Attributes:    attrMap(s.Attributes()),
		Service:       service,
	}
	if p := s.Parent(); p.IsValid() {
		fs.ParentSpanID = p.SpanID().String()
	}
	for _, e := range s.Events() {
		fs.Events = append(fs.Events, FileEvent{Name: e.Name, TimeUnixNano: e.Time.UnixNano(), Attributes: attrMap(e.Attributes)})
	}
	return fs
}

func (x *fileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.f == nil {
		return fmt.Errorf("spans file closed")
	}
	b := x.line[:0]
	for _, s := range spans {
		res, err := x.resourceJSON(s.Resource())
		if err != nil {
			return err
		}
		n := len(b)
		if b, err = appendFileSpan(b, s, x.service, res, &x.order); err != nil {
			return fmt.Errorf("encode span: %w", err)
		}
		// A batch that would take the file past its cap is split at the
		// line that does: what came before fills this file, the rest
		// starts the next one, so no file exceeds the cap by more than a
		// line longer than the cap itself.
		if max := x.f.MaxSize; max > 0 && n > 0 && x.f.Size()+int64(len(b)) > max {
			if err := x.f.WriteRecords(b[:n]); err != nil {
				x.line = b
				return err
			}
			b = b[:copy(b, b[n:])]
		}
	}
	x.line = b
	// One write per batch (or per file a batch fills), so that a reader (or
	// a crash) sees whole steps; a failed write leaves the file at the last
	// whole line.
	return x.f.WriteRecords(b)
}

// resourceJSON is the encoded resource object of FileSpan.Resource, built
// once per resource: it is the same on every line.
func (x *fileExporter) resourceJSON(r *resource.Resource) ([]byte, error) {
	if r == x.lastRes && x.resJSON != nil {
		return x.resJSON, nil
	}
	m := x.resourceAttrs(r)
	if len(m) == 0 {
		x.resJSON = []byte{}
		return x.resJSON, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode resource: %w", err)
	}
	x.resJSON = b
	return b, nil
}

func (x *fileExporter) Shutdown(context.Context) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.f == nil {
		return nil
	}
	err := x.f.Close()
	x.f = nil
	if err != nil {
		return fmt.Errorf("spans file: %w", err)
	}
	return nil
}

// discardExporter counts nothing and writes nothing: file mode without a
// spans file still keeps metrics and stats.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
