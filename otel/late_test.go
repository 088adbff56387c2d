package otel_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// TestLateGapsOrphansAndShutdown: the exporter holds no gap. A gap the
// engine marks late whose step was never emitted here becomes a trace of
// its own at once; one whose step was emitted hangs under it; a step's
// own gaps come with it. After Shutdown, the gaps of a step and late gaps
// are counted dropped.
func TestLateGapsOrphansAndShutdown(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{Rank: -1, SpansFile: path})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 1, t0: time.Now().UnixNano()}
	for n := range int64(2) {
		_, gaps := sy.step(n)
		gaps[0].Late = true
		x.Gap(gaps[0])
	}
	st, gaps := sy.step(2)
	deliver(x, st, gaps...)
	late := gaps[0]
	late.Start, late.End, late.Late = late.End, late.End+int64(time.Millisecond), true
	x.Gap(late)
	if d := x.Stats().GapsDropped; d != 0 {
		t.Errorf("before shutdown: dropped %d, want 0", d)
	}
	shutdown(t, x)
	st, gaps = sy.step(3)
	deliver(x, st, gaps...)
	gaps[0].Late = true
	x.Gap(gaps[0])
	if d := x.Stats().GapsDropped; d != 2 {
		t.Errorf("after shutdown: dropped %d, want the step's gap and the late one", d)
	}
	var stepSpan string
	var gapSpans []otel.FileSpan
	for _, s := range readSpansFile(t, path) {
		switch s.Name {
		case otel.SpanStep:
			stepSpan = s.SpanID
		case otel.SpanGap:
			gapSpans = append(gapSpans, s)
		}
	}
	if len(gapSpans) != 4 || stepSpan == "" {
		t.Fatalf("%d gap spans and step span %q, want 4 and step 2's", len(gapSpans), stepSpan)
	}
	for _, s := range gapSpans {
		n := int64(s.Attributes["gpu.step.number"].(float64))
		switch {
		case n < 2 && s.ParentSpanID != "":
			t.Errorf("the late gap of step %d, whose step never came, hangs under %s", n, s.ParentSpanID)
		case n == 2 && s.ParentSpanID != stepSpan:
			t.Errorf("a gap of step 2 hangs under %q, not its step %s", s.ParentSpanID, stepSpan)
		case n > 2:
			t.Errorf("a gap of step %d delivered after shutdown became a span", n)
		}
	}
}

// TestLateGapsJoinTheirStep: one exporter for two ranks' processes. The
// correlator decides some gaps after their step was emitted (a wait on
// the other rank is judged once that rank's events are in), and learns a
// process's device late (its first gaps carry device 0, its steps device
// 1). Every gap must still be a span under its own step's span, none
// dropped, with or without a job ID (rank spans).
func TestLateGapsJoinTheirStep(t *testing.T) {
	for _, job := range []string{"", "job-7"} {
		clearEnv(t)
		path := filepath.Join(t.TempDir(), "spans.jsonl")
		x, err := otel.New(context.Background(), otel.Config{Rank: -1, JobID: job, SpansFile: path})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now().Add(-time.Minute).UnixNano()
		ranks := []synth{{pid: 100, device: 0, t0: t0}, {pid: 101, device: 1, t0: t0}}
		var late []correlate.Gap
		want := 0
		for n := range int64(10) {
			for r, sy := range ranks {
				st, gaps := sy.step(n)
				rank := r
				st.Workload = &correlate.Workload{Rank: &rank}
				var carried []correlate.Gap
				for i := range gaps {
					gaps[i].Workload = st.Workload
					if r == 1 && n < 3 {
						gaps[i].Device = 0 // before NVML listed the process on its GPU
					}
					want++
					if n%3 == 1 {
						// Decided after the step: a wait on the other rank.
						gaps[i].Late = true
						late = append(late, gaps[i])
						continue
					}
					carried = append(carried, gaps[i])
				}
				deliver(x, st, carried...)
			}
			// The late gaps of this step come once the other rank's step
			// was emitted too.
			for _, g := range late {
				x.Gap(g)
			}
			late = late[:0]
		}
		shutdown(t, x)
		if d := x.Stats().GapsDropped; d != 0 {
			t.Errorf("job %q: %d gaps dropped", job, d)
		}
		spans := readSpansFile(t, path)
		byID := map[string]otel.FileSpan{}
		for _, s := range spans {
			byID[s.SpanID] = s
		}
		got := 0
		for _, s := range spans {
			if s.Name != otel.SpanGap {
				continue
			}
			got++
			p, ok := byID[s.ParentSpanID]
			if !ok {
				t.Errorf("job %q: gap of step %v (pid %v) has no parent span", job, s.Attributes["gpu.step.number"], s.Attributes["process.pid"])
				continue
			}
			if p.TraceID != s.TraceID || p.Attributes["gpu.step.number"] != s.Attributes["gpu.step.number"] ||
				p.Attributes["process.pid"] != s.Attributes["process.pid"] {
				t.Errorf("job %q: gap of pid %v step %v hangs under %s of pid %v step %v", job, s.Attributes["process.pid"],
					s.Attributes["gpu.step.number"], p.Name, p.Attributes["process.pid"], p.Attributes["gpu.step.number"])
			}
		}
		if got != want {
			t.Errorf("job %q: %d gap spans, want %d", job, got, want)
		}
	}
}
