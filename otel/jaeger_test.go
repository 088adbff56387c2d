package otel_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/test/e2e/jaegertest"
)

// These tests push synthetic steps through the real Exporter into a real
// Jaeger and check what a user would see through Jaeger's query API.

// spansOfStep is how many spans synth's step n produces: train.step,
// gpu.idle and its host operations.
func spansOfStep(n int64) int {
	_, gaps := (synth{}).step(n)
	return 2 + len(gaps[0].Ops)
}

func emit(x *otel.Exporter, sy synth, from, to int64) (spans int) {
	for n := from; n < to; n++ {
		st, gaps := sy.step(n)
		deliver(x, st, gaps...)
		spans += 2 + len(gaps[0].Ops)
	}
	return spans
}

func TestJaegerStepTraces(t *testing.T) {
	j := jaegertest.Start(t)
	for _, proto := range []string{otel.ProtocolGRPC, otel.ProtocolHTTPProtobuf} {
		t.Run(proto, func(t *testing.T) {
			clearEnv(t)
			service := "gaptrace-test-" + strings.ReplaceAll(proto, "/", "-")
			endpoint := j.OTLPHTTPURL()
			if proto == otel.ProtocolGRPC {
				// Bare loopback host:port: plaintext without being told.
				endpoint = j.OTLPGRPCEndpoint()
			}
			x, err := otel.New(context.Background(), otel.Config{ServiceName: service, Endpoint: endpoint, Protocol: proto,
				BatchTimeout: 50 * time.Millisecond, Rank: -1,
				Resource: otel.ResourceInfo{TargetPID: 4242, TargetCmdline: []string{"python3", "train.py"}, GPUName: "NVIDIA H200"}})
			if err != nil {
				t.Fatal(err)
			}
			const steps = 8
			sy := synth{pid: 4242, t0: time.Now().Add(-10 * time.Second).UnixNano()}
			total := emit(x, sy, 0, steps)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := x.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if st := x.Stats(); st.SpansExported != uint64(total) || st.SpansDropped != 0 {
				t.Fatalf("stats %+v, want %d exported", st, total)
			}
			traces, err := j.WaitTraces(service, 100, 20*time.Second, func(ts []jaegertest.Trace) bool {
				return len(ts) == steps && spanTotal(ts) == total
			})
			if err != nil {
				t.Fatalf("%v: %d traces, %d spans (want %d, %d)", err, len(traces), spanTotal(traces), steps, total)
			}
			checkStepTraces(t, traces)
		})
	}
}

func spanTotal(ts []jaegertest.Trace) int {
	n := 0
	for _, t := range ts {
		n += len(t.Spans)
	}
	return n
}

// checkStepTraces checks the single-process span model: one trace per step,
// train.step root, gpu.idle children with cause and evidence inside the
// step, host operations under gpu.idle.
func checkStepTraces(t *testing.T, traces []jaegertest.Trace) {
	t.Helper()
	seen := map[int64]bool{}
	for i := range traces {
		tr := &traces[i]
		roots := tr.ByName(otel.SpanStep)
		if len(roots) != 1 || roots[0].ParentID() != "" {
			t.Errorf("trace %s: %d train.step spans, want 1 root", tr.TraceID, len(roots))
			continue
		}
		root := roots[0]
		n, err := tagInt(root, "gpu.step.number")
		if err != nil {
			t.Error(err)
			continue
		}
		if seen[n] {
			t.Errorf("step %d in two traces", n)
		}
		seen[n] = true
		if pid, _ := tr.ProcessTag(root, "process.pid"); fmt.Sprint(pid) != "4242" {
			t.Errorf("resource process.pid %v", pid)
		}
		if g, _ := tr.ProcessTag(root, "gpu.name"); g != "NVIDIA H200" {
			t.Errorf("resource gpu.name %v", g)
		}
		want := rotation[int(n)%len(rotation)]
		gaps := tr.ByName(otel.SpanGap)
		if len(gaps) != 1 {
			t.Errorf("step %d: %d gpu.idle spans, want 1", n, len(gaps))
			continue
		}
		g := gaps[0]
		if g.ParentID() != root.SpanID {
			t.Errorf("step %d: gpu.idle parent %s, want train.step %s", n, g.ParentID(), root.SpanID)
		}
		if g.StartTime < root.StartTime || g.EndTime() > root.EndTime() {
			t.Errorf("step %d: gpu.idle [%d,%d]µs outside step [%d,%d]µs", n, g.StartTime, g.EndTime(), root.StartTime, root.EndTime())
		}
		if c := g.TagString("gpu.gap.cause"); c != string(want) {
			t.Errorf("step %d: gpu.gap.cause %q, want %q", n, c, want)
		}
		switch want {
		case correlate.CauseIORead:
			if p := g.TagString("file.path"); p != fmt.Sprintf("/data/shard-%03d.bin", n) {
				t.Errorf("step %d: file.path %q", n, p)
			}
		case correlate.CauseIOWrite:
			if p := g.TagString("file.path"); p != fmt.Sprintf("/ckpt/step_%d.pt", n) {
				t.Errorf("step %d: file.path %q", n, p)
			}
		case correlate.CauseNet:
			if p := g.TagString("network.peer.address"); p != "10.1.2.3:443" {
				t.Errorf("step %d: network.peer.address %q", n, p)
			}
		case correlate.CauseComm:
			if k := g.TagString("gpu.gap.kind"); k != "stall" {
				t.Errorf("step %d: comm gap kind %q", n, k)
			}
		}
		if b := g.TagString("gpu.gap.breakdown." + string(want)); b != "28" {
			t.Errorf("step %d: breakdown.%s = %q ms, want 28", n, want, b)
		}
		if len(g.Logs) != 2 {
			t.Errorf("step %d: gpu.idle has %d events, want 2", n, len(g.Logs))
		}
		ops := 0
		for k := range tr.Spans {
			s := &tr.Spans[k]
			if s == root || s == g {
				continue
			}
			if s.ParentID() != g.SpanID {
				t.Errorf("step %d: span %s parent %s, want gpu.idle", n, s.OperationName, s.ParentID())
			}
			ops++
		}
		if want := spansOfStep(n) - 2; ops != want {
			t.Errorf("step %d: %d host-op spans, want %d", n, ops, want)
		}
		if want == correlate.CauseIOWrite && len(tr.ByName("fsync")) != 1 {
			t.Errorf("step %d: no fsync span under the checkpoint gap", n)
		}
		for k := range tr.Spans {
			if w := tr.Spans[k].Warnings; len(w) > 0 {
				t.Errorf("step %d: jaeger warns about %s: %v", n, tr.Spans[k].OperationName, w)
			}
		}
	}
}

func tagInt(s *jaegertest.Span, key string) (int64, error) {
	v, ok := s.Tag(key)
	if !ok {
		return 0, fmt.Errorf("span %s lacks %s", s.OperationName, key)
	}
	var n int64
	if _, err := fmt.Sscan(fmt.Sprint(v), &n); err != nil {
		return 0, fmt.Errorf("span %s: %s=%v: %w", s.OperationName, key, v, err)
	}
	return n, nil
}

// Two ranks of one job, each with its own exporter (its own sidecar in
// production), must land in one trace per step: a train.step root emitted
// by rank 0, a "rank N" child per rank, each rank's gaps under its span.
func TestJaegerRanksShareTrace(t *testing.T) {
	clearEnv(t)
	j := jaegertest.Start(t)
	const service, job, steps = "gaptrace-ranks", "job-7f3a", 4
	t0 := time.Now().Add(-10 * time.Second).UnixNano()
	exps := map[int]*otel.Exporter{}
	// Rank 1 first: its spans reference a root that does not exist yet.
	for _, rank := range []int{1, 0} {
		x, err := otel.New(context.Background(), otel.Config{ServiceName: service, Endpoint: j.OTLPHTTPURL(),
			JobID: job, Rank: rank, BatchTimeout: 50 * time.Millisecond,
			Resource: otel.ResourceInfo{TargetPID: 1000 + rank}})
		if err != nil {
			t.Fatal(err)
		}
		exps[rank] = x
		// Ranks start their steps a little apart, as real ones do.
		emit(x, synth{pid: uint32(1000 + rank), t0: t0 + int64(rank)*int64(time.Millisecond)}, 0, steps)
		if err := x.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	for n := range int64(steps) {
		want += 1 + 2*spansOfStep(n) // one root, then per rank: rank span, gpu.idle, ops
	}
	traces, err := j.WaitTraces(service, 100, 20*time.Second, func(ts []jaegertest.Trace) bool {
		return len(ts) == steps && spanTotal(ts) == want
	})
	if err != nil {
		t.Fatalf("%v: %d traces with %d spans, want %d with %d", err, len(traces), spanTotal(traces), steps, want)
	}
	for n := range int64(steps) {
		id := otel.StepTraceID(job, n).String()
		tr, err := j.Trace(id)
		if err != nil || tr == nil {
			t.Fatalf("step %d: trace %s not in jaeger: %v", n, id, err)
		}
		roots := tr.ByName(otel.SpanStep)
		if len(roots) != 1 || roots[0].ParentID() != "" {
			t.Fatalf("step %d: %d train.step roots", n, len(roots))
		}
		root := roots[0]
		if root.SpanID != otel.StepRootSpanID(job, n).String() {
			t.Errorf("step %d: root span ID %s, want the derived %s", n, root.SpanID, otel.StepRootSpanID(job, n))
		}
		ranks := tr.ByNamePrefix("rank ")
		if len(ranks) != 2 {
			t.Fatalf("step %d: %d rank spans, want 2", n, len(ranks))
		}
		names := map[string]bool{}
		for _, r := range ranks {
			names[r.OperationName] = true
			if r.ParentID() != root.SpanID {
				t.Errorf("step %d: %s parent %s, want root", n, r.OperationName, r.ParentID())
			}
			gaps := 0
			for k := range tr.Spans {
				if s := &tr.Spans[k]; s.OperationName == otel.SpanGap && s.ParentID() == r.SpanID {
					gaps++
					if pid, _ := tr.ProcessTag(s, "process.pid"); fmt.Sprint(pid) != fmt.Sprint(1000+rankOf(t, r)) {
						t.Errorf("step %d: %s has a gap from process %v", n, r.OperationName, pid)
					}
				}
			}
			if gaps != 1 {
				t.Errorf("step %d: %s has %d gpu.idle children, want 1", n, r.OperationName, gaps)
			}
		}
		if !names["rank 0"] || !names["rank 1"] {
			t.Errorf("step %d: rank spans %v", n, names)
		}
		// No orphans: every parent is in the trace.
		for k := range tr.Spans {
			s := &tr.Spans[k]
			if p := s.ParentID(); p != "" && tr.Span(p) == nil {
				t.Errorf("step %d: %s's parent %s is missing", n, s.OperationName, p)
			}
			// Ranks' steps never line up to the microsecond, so a rank span
			// may stick out of rank 0's root and Jaeger says it would
			// adjust for clock skew; any other warning (a missing parent,
			// a duplicate span ID) is a bug.
			for _, w := range s.Warnings {
				if !strings.HasPrefix(w, "clock skew adjustment disabled") {
					t.Errorf("step %d: jaeger warns about %s: %s", n, s.OperationName, w)
				}
			}
		}
	}
}

func rankOf(t *testing.T, s *jaegertest.Span) int {
	t.Helper()
	var r int
	if _, err := fmt.Sscanf(s.OperationName, "rank %d", &r); err != nil {
		t.Fatalf("rank span named %q: %v", s.OperationName, err)
	}
	return r
}

// Jaeger dies mid-run: the tracer side never blocks, memory stays bounded
// by the queue, every span is either exported or counted as dropped.
func TestJaegerStoppedMidRun(t *testing.T) {
	clearEnv(t)
	j := jaegertest.Start(t)
	const service, queue = "gaptrace-outage", 256
	x, err := otel.New(context.Background(), otel.Config{ServiceName: service, Endpoint: j.OTLPHTTPURL(),
		QueueSize: queue, BatchSize: 64, BatchTimeout: 20 * time.Millisecond, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 77, t0: time.Now().Add(-time.Hour).UnixNano()}
	total := emit(x, sy, 0, 10)
	if _, err := j.WaitTraces(service, 100, 20*time.Second, func(ts []jaegertest.Trace) bool { return len(ts) == 10 }); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	j.Stop()

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const outageSteps = 20000
	var worst time.Duration
	for n := int64(10); n < 10+outageSteps; n++ {
		start := time.Now()
		total += emit(x, sy, n, n+1)
		worst = max(worst, time.Since(start))
		if q := x.Stats().QueueLen; q > queue {
			t.Fatalf("queue length %d over its bound %d", q, queue)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// ~75k spans went through; keeping them would cost well over 50 MB.
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 16<<20 {
		t.Errorf("heap grew by %d MB during the outage; the queue bound is not holding", grow>>20)
	}
	// Blocking on the dead collector would cost the exporter's retry
	// backoff (5 s) or export timeout (10 s); below that, what remains is
	// scheduling noise on a loaded CI machine.
	if worst > 2*time.Second {
		t.Errorf("slowest step emission during the outage took %s", worst)
	}
	if d := x.Stats().SpansDropped; d == 0 {
		t.Error("no drops counted during the outage")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_ = x.Shutdown(ctx) // the deadline error is expected: the collector is gone
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Shutdown took %s with a 1s deadline", d)
	}
	st := x.Stats()
	if st.SpansExported+st.SpansDropped != uint64(total) {
		t.Errorf("exported %d + dropped %d != %d spans emitted", st.SpansExported, st.SpansDropped, total)
	}
	if first := uint64(emitCount(0, 10)); st.SpansExported < first {
		t.Errorf("exported %d, want at least the %d spans before the outage", st.SpansExported, first)
	}
	t.Logf("outage: %d spans emitted, %d exported, %d dropped, %d export errors, worst step %s",
		total, st.SpansExported, st.SpansDropped, st.ExportErrors, worst)
}

func emitCount(from, to int64) int {
	n := 0
	for s := from; s < to; s++ {
		n += spansOfStep(s)
	}
	return n
}

// A run recorded in file mode, replayed into Jaeger later, looks the same
// as one exported live.
func TestJaegerReplayFile(t *testing.T) {
	clearEnv(t)
	j := jaegertest.Start(t)
	const service, steps = "gaptrace-replay", 8
	path := t.TempDir() + "/spans.jsonl"
	x, err := otel.New(context.Background(), otel.Config{ServiceName: service, SpansFile: path, Rank: -1,
		Resource: otel.ResourceInfo{TargetPID: 4242, GPUName: "NVIDIA H200"}})
	if err != nil {
		t.Fatal(err)
	}
	total := emit(x, synth{pid: 4242, t0: time.Now().Add(-time.Minute).UnixNano()}, 0, steps)
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	n, err := otel.Replay(context.Background(), path, otel.Config{Endpoint: j.OTLPHTTPURL()})
	if err != nil || n != total {
		t.Fatalf("replayed %d of %d spans: %v", n, total, err)
	}
	traces, err := j.WaitTraces(service, 100, 20*time.Second, func(ts []jaegertest.Trace) bool {
		return len(ts) == steps && spanTotal(ts) == total
	})
	if err != nil {
		t.Fatalf("%v: %d traces, %d spans", err, len(traces), spanTotal(traces))
	}
	checkStepTraces(t, traces)
}
