package otel

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

// memProc keeps every span it is handed.
type memProc struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

func (m *memProc) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (m *memProc) OnEnd(s sdktrace.ReadOnlySpan) {
	m.mu.Lock()
	m.spans = append(m.spans, s)
	m.mu.Unlock()
}
func (m *memProc) Shutdown(context.Context) error   { return nil }
func (m *memProc) ForceFlush(context.Context) error { return nil }

// directExporter is an exporter whose direct spans go to mem only; it is
// shut down when the test ends.
func directExporter(t *testing.T, cfg Config) (*Exporter, *memProc) {
	t.Helper()
	x, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := x.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	mem := &memProc{}
	x.direct.procs = []sdktrace.SpanProcessor{mem}
	return x, mem
}

// directStep is a step with two gaps, one with two host operations, and a
// throttled GPU.
func directStep(n int64) correlate.StepResult {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC).UnixNano() + n*int64(100*time.Millisecond)
	ms := int64(time.Millisecond)
	gap := func(a, b int64, cause correlate.Cause, ops ...correlate.HostOp) correlate.Gap {
		return correlate.Gap{PID: 7, TID: 8, Step: n, Kind: correlate.GapIdle, Start: t0 + a*ms, End: t0 + b*ms,
			Duration: (b - a) * ms, Cause: cause, Breakdown: map[correlate.Cause]int64{cause: (b - a) * ms},
			Evidence: correlate.Evidence{Source: "host", CUDACall: "cuStreamSynchronize"}, Ops: ops}
	}
	g1 := gap(10, 40, correlate.CauseIORead,
		correlate.HostOp{Name: "read", TID: 8, Start: t0 + 11*ms, End: t0 + 20*ms, Attrs: map[string]string{"file.path": "/data/a"}},
		correlate.HostOp{Name: "read", TID: 8, Start: t0 + 21*ms, End: t0 + 39*ms, Attrs: map[string]string{"file.path": "/data/b"}})
	g2 := gap(60, 70, correlate.CauseCPU)
	rank := 2
	w := &correlate.Workload{NSPID: 3, Rank: &rank, ContainerID: "c0ffee", PodName: "train-0", PodNamespace: "ml"}
	g1.Workload, g2.Workload = w, w
	st := correlate.Step{PID: 7, Number: n, Start: t0, End: t0 + 100*ms, Workload: w,
		ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 30 * ms, correlate.CauseCPU: 10 * ms},
		HW:      &event.HWContext{ThrottleReasons: []string{"sw_power_cap"}}}
	return correlate.StepResult{Step: st, GapList: []correlate.Gap{g1, g2}}
}

// TestDirectSpans: steps, gaps and operations built without the SDK's
// tracer carry what its spans carry (resource, scope, kind, sampling), link
// each to its parent, count children, and never repeat an attribute key.
func TestDirectSpans(t *testing.T) {
	for _, tc := range []struct {
		name      string
		job       string
		rank      int
		names     []string // the step's spans, root first
		remoteTop bool     // the step's span hangs under the job's root
	}{
		{"no job", "", -1, []string{SpanStep}, false},
		{"job rank 0", "j1", 0, []string{SpanStep, "rank 0"}, true},
		{"job rank 3", "j1", 3, []string{"rank 3"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team=vision")
			x, mem := directExporter(t, Config{JobID: tc.job, Rank: tc.rank})
			x.tp.RegisterSpanProcessor(mem)
			_, sdkSpan := x.tracer.Start(context.Background(), "reference")
			sdkSpan.End()
			x.Step(directStep(4))

			ref := mem.spans[0]
			byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
			byName := map[string][]sdktrace.ReadOnlySpan{}
			for _, s := range mem.spans[1:] {
				byID[s.SpanContext().SpanID()] = s
				byName[s.Name()] = append(byName[s.Name()], s)
				if !s.SpanContext().IsSampled() {
					t.Errorf("%s: not sampled", s.Name())
				}
				if s.Resource() != ref.Resource() && !s.Resource().Equal(ref.Resource()) {
					t.Errorf("%s: resource %v, the SDK's %v", s.Name(), s.Resource(), ref.Resource())
				}
				if v, ok := s.Resource().Set().Value("team"); !ok || v.AsString() != "vision" {
					t.Errorf("%s: OTEL_RESOURCE_ATTRIBUTES not in the resource", s.Name())
				}
				if s.InstrumentationScope() != ref.InstrumentationScope() || s.SpanKind() != ref.SpanKind() {
					t.Errorf("%s: scope %v kind %v, the SDK's %v %v", s.Name(), s.InstrumentationScope(), s.SpanKind(),
						ref.InstrumentationScope(), ref.SpanKind())
				}
				seen := map[string]bool{}
				for _, a := range s.Attributes() {
					if seen[string(a.Key)] {
						t.Errorf("%s: attribute %s twice", s.Name(), a.Key)
					}
					seen[string(a.Key)] = true
				}
			}
			var top sdktrace.ReadOnlySpan // the span the gaps hang under
			for i, n := range tc.names {
				got := byName[n]
				if len(got) != 1 {
					t.Fatalf("%d spans named %q, want 1 (spans: %v)", len(got), n, byName)
				}
				top = got[0]
				if i == 0 && !tc.remoteTop && top.Parent().IsValid() {
					t.Errorf("%s: parent %v, want none", n, top.Parent())
				}
			}
			if tc.remoteTop {
				if !top.Parent().IsRemote() || top.Parent().SpanID() != StepRootSpanID(tc.job, 4) ||
					top.SpanContext().TraceID() != StepTraceID(tc.job, 4) ||
					top.SpanContext().SpanID() != rankSpanID(tc.job, 4, tc.rank, 0) {
					t.Errorf("rank span %v under %v, want the job's root", top.SpanContext(), top.Parent())
				}
			}
			if len(top.Events()) != 1 || top.Events()[0].Name != "gpu.throttled" {
				t.Errorf("step events %v, want gpu.throttled", top.Events())
			}
			gaps := byName[SpanGap]
			if len(gaps) != 2 || top.ChildSpanCount() != 2 {
				t.Fatalf("%d gap spans, %d children of the step, want 2", len(gaps), top.ChildSpanCount())
			}
			for _, g := range gaps {
				if g.Parent().SpanID() != top.SpanContext().SpanID() || g.Parent().IsRemote() ||
					g.SpanContext().TraceID() != top.SpanContext().TraceID() {
					t.Errorf("gap under %v, want the step %v", g.Parent(), top.SpanContext())
				}
				if len(g.Events()) != 2 {
					t.Errorf("gap events %v, want drained and enqueued", g.Events())
				}
			}
			reads := byName["read"]
			if len(reads) != 2 {
				t.Fatalf("%d read spans, want 2", len(reads))
			}
			for _, r := range reads {
				g := byID[r.Parent().SpanID()]
				if g == nil || g.Name() != SpanGap || g.ChildSpanCount() != 2 {
					t.Errorf("read under %v, want a gap with 2 children", r.Parent())
				}
			}
		})
	}
}

// TestDirectSpansSampled: the provider's sampler decides for direct spans
// too; a dropped step drops its gaps.
func TestDirectSpansSampled(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	x, mem := directExporter(t, Config{Rank: -1})
	for n := range int64(20) {
		x.Step(directStep(n))
	}
	if len(mem.spans) != 0 {
		t.Fatalf("%d spans at a sample ratio of 0", len(mem.spans))
	}
}
