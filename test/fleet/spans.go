package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	collpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
	"github.com/gaptrace/gaptrace/otel"
)

// replayed are a recording's steps and gaps as gaptrace found them, in
// the order a live run delivers them (a step's gaps before the step).
type replayed struct {
	steps []correlate.Step
	gaps  [][]correlate.Gap // gaps[i] belong to steps[i]
	loose []correlate.Gap   // gaps after their step, or in none
}

// collector keeps each step with the gaps the engine delivered in it, and
// the gaps no step carries (Late).
type collector struct{ r replayed }

func (c *collector) Gap(g correlate.Gap) {
	if g.Late {
		c.r.loose = append(c.r.loose, g)
	}
}

func (c *collector) Step(s correlate.StepResult) {
	c.r.steps = append(c.r.steps, s.Step)
	c.r.gaps = append(c.r.gaps, s.GapList)
}

// replayRecording correlates a recording (--record) again.
func replayRecording(path string) (replayed, error) {
	f, err := os.Open(path)
	if err != nil {
		return replayed{}, err
	}
	defer f.Close()
	h, calls, err := record.Read(f)
	if err != nil && len(calls) == 0 {
		return replayed{}, fmt.Errorf("%s: %w", path, err)
	}
	cfg := h.Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	var c collector
	if _, err := record.ReplayAs(cfg, &c, h, calls, record.View{}); err != nil {
		return replayed{}, fmt.Errorf("%s: %w", path, err)
	}
	r := c.r
	if len(r.steps) == 0 {
		return r, fmt.Errorf("%s: no steps", path)
	}
	return r, nil
}

// sidecarSpans turns the replayed run into the spans rank's sidecar
// exports, through gaptrace's own exporter (spans file mode), and reads
// them back: the same span model, IDs and attributes a live sidecar of
// that rank in a job sends.
func sidecarSpans(r replayed, dir, job string, rank, ranksPerNode int) ([]otel.FileSpan, error) {
	path := filepath.Join(dir, "rank-"+strconv.Itoa(rank)+".jsonl")
	ctx := context.Background()
	x, err := otel.New(ctx, otel.Config{SpansFile: path, JobID: job, Rank: rank, QueueSize: 1 << 20,
		Logger:    slog.New(slog.DiscardHandler),
		BatchSize: 4096, BatchTimeout: time.Second,
		Resource: otel.ResourceInfo{TargetPID: 1000 + rank, TargetCmdline: []string{"python3", "train.py"},
			GPUName: "NVIDIA H100 80GB HBM3", Host: fmt.Sprintf("node-%03d", rank/ranksPerNode)}})
	if err != nil {
		return nil, err
	}
	for i, s := range r.steps {
		for _, g := range r.gaps[i] {
			x.Gap(g)
		}
		x.Step(correlate.StepResult{Step: s, GapList: r.gaps[i]})
	}
	for _, g := range r.loose {
		x.Gap(g)
	}
	if err := x.Shutdown(ctx); err != nil {
		return nil, err
	}
	if st := x.Stats(); st.SpansDropped != 0 {
		return nil, fmt.Errorf("rank %d: %d spans dropped while writing the spans file", rank, st.SpansDropped)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []otel.FileSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var fs otel.FileSpan
		if err := json.Unmarshal(sc.Bytes(), &fs); err != nil {
			return nil, err
		}
		out = append(out, fs)
	}
	return out, sc.Err()
}

// batches groups a sidecar's spans into OTLP requests of about size spans,
// one resource each, in start order.
func batches(spans []otel.FileSpan, size int) ([]*collpb.ExportTraceServiceRequest, error) {
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].EndUnixNano < spans[j].EndUnixNano })
	var out []*collpb.ExportTraceServiceRequest
	for lo := 0; lo < len(spans); lo += size {
		hi := min(lo+size, len(spans))
		res := &resourcepb.Resource{Attributes: append(keyValues(spans[lo].Resource),
			&commonpb.KeyValue{Key: "service.name", Value: str(spans[lo].Service)})}
		ss := &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: "github.com/gaptrace/gaptrace/otel"}}
		for i := lo; i < hi; i++ {
			sp, err := protoSpan(&spans[i])
			if err != nil {
				return nil, err
			}
			ss.Spans = append(ss.Spans, sp)
		}
		out = append(out, &collpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
			{Resource: res, ScopeSpans: []*tracepb.ScopeSpans{ss}}}})
	}
	return out, nil
}

func protoSpan(fs *otel.FileSpan) (*tracepb.Span, error) {
	tid, err := hex.DecodeString(fs.TraceID)
	if err != nil || len(tid) != 16 {
		return nil, fmt.Errorf("trace_id %q", fs.TraceID)
	}
	sid, err := hex.DecodeString(fs.SpanID)
	if err != nil || len(sid) != 8 {
		return nil, fmt.Errorf("span_id %q", fs.SpanID)
	}
	sp := &tracepb.Span{TraceId: tid, SpanId: sid, Name: fs.Name, Kind: tracepb.Span_SPAN_KIND_INTERNAL,
		StartTimeUnixNano: uint64(fs.StartUnixNano), EndTimeUnixNano: uint64(fs.EndUnixNano),
		Attributes: keyValues(fs.Attributes)}
	if fs.ParentSpanID != "" {
		if sp.ParentSpanId, err = hex.DecodeString(fs.ParentSpanID); err != nil {
			return nil, fmt.Errorf("parent_span_id %q", fs.ParentSpanID)
		}
	}
	for _, e := range fs.Events {
		sp.Events = append(sp.Events, &tracepb.Span_Event{Name: e.Name, TimeUnixNano: uint64(e.TimeUnixNano),
			Attributes: keyValues(e.Attributes)})
	}
	return sp, nil
}

func str(s string) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}}
}

// anyValue types a JSON value as otel.Replay does: integral numbers are
// integers.
func anyValue(v any) *commonpb.AnyValue {
	switch x := v.(type) {
	case string:
		return str(x)
	case bool:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: x}}
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(x)}}
		}
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: x}}
	case []any:
		arr := &commonpb.ArrayValue{}
		for _, e := range x {
			arr.Values = append(arr.Values, anyValue(e))
		}
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
	}
	return str(fmt.Sprint(v))
}

func keyValues(m map[string]any) []*commonpb.KeyValue {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*commonpb.KeyValue, 0, len(m))
	for _, k := range keys {
		out = append(out, &commonpb.KeyValue{Key: k, Value: anyValue(m[k])})
	}
	return out
}
