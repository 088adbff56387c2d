package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/test/accuracy"
)

func TestNames(t *testing.T) {
	raw := []byte(`{"evidence":{"stack":[{"function":"Trainer.append_metrics","file":"x.py"}],
		"lock_holders":[{"tid":3,"code":"summarize_metrics (gil_gc.py:60)"}]}}`)
	for _, c := range []struct {
		fns  []string
		want bool
	}{
		{[]string{"append_metrics"}, true},
		{[]string{"summarize_metrics"}, true},
		{[]string{"metrics"}, false}, // a fragment of a name is not the name
		{[]string{"nope", "append_metrics"}, true},
		{nil, false},
	} {
		if got := names(raw, c.fns); got != c.want {
			t.Errorf("names(%v) = %v, want %v", c.fns, got, c.want)
		}
	}
}

func TestScoreStalls(t *testing.T) {
	const ms = int64(time.Millisecond)
	tr := &JobTruth{Truth: accuracy.Truth{PID: 7}}
	tr.Stalls = []Stall{
		{Cause: "cpu", Code: "tokenize|tok2", Interval: accuracy.Interval{Start: 100 * ms, End: 200 * ms}, RunDelayNS: 10 * ms},
		{Cause: "loader.wait.cpu", Code: "next_batch", Interval: accuracy.Interval{Start: 300 * ms, End: 400 * ms}},
		{Cause: "sleep", Interval: accuracy.Interval{Start: 500 * ms, End: 600 * ms}},
		// The device busy throughout with work queued before it: no gap
		// over it, nothing to name it.
		{Cause: "cpu", Code: "tokenize", Interval: accuracy.Interval{Start: 800 * ms, End: 900 * ms}},
		// Shorter than any gap: counted apart, not judged.
		{Cause: "cpu", Code: "tokenize", Interval: accuracy.Interval{Start: 700 * ms, End: 700*ms + ms/2}},
	}
	gaps := []correlate.Gap{
		// Half over the cpu stall: 80 cpu, 20 contention over 200 ms.
		{PID: 7, Start: 100 * ms, End: 300 * ms, Duration: 200 * ms, Cause: correlate.CauseCPU,
			Breakdown: map[correlate.Cause]int64{correlate.CauseCPU: 160 * ms, correlate.CauseCPUContention: 40 * ms}},
		{PID: 7, Start: 300 * ms, End: 400 * ms, Duration: 100 * ms, Cause: correlate.CauseLoaderWait,
			Breakdown: map[correlate.Cause]int64{correlate.CauseLoaderWait: 100 * ms},
			Evidence:  correlate.Evidence{Workers: []correlate.WorkerEvidence{{PID: 9, Activity: "io"}}}},
		{PID: 8, Start: 500 * ms, End: 600 * ms, Duration: 100 * ms, Cause: correlate.CauseSleep, // another process
			Breakdown: map[correlate.Cause]int64{correlate.CauseSleep: 100 * ms}},
	}
	raws := [][]byte{[]byte(`{"evidence":{"stack":[{"function":"tok2"}]}}`), []byte(`{}`), []byte(`{}`)}
	ks := scoreStalls(tr, gaps, raws)
	if len(ks) != 3 || ks[0].Kind != "cpu/tokenize" || ks[1].Kind != "loader.wait.cpu/next_batch" || ks[2].Kind != "sleep" {
		t.Fatalf("kinds %+v", ks)
	}
	// cpu: seen 100, right 80, contention 20 of which 10 excused.
	if got := ks[0].Share(); got < 80.0/90-1e-9 || got > 80.0/90+1e-9 || ks[0].Named != 1 || ks[0].Gapped != 1 || ks[0].Stalls != 2 || ks[0].Short != 1 {
		t.Errorf("cpu share %v named %d of %d under a gap, %d stalls (%d short), want %v, 1 of 1, 2 (1)",
			got, ks[0].Named, ks[0].Gapped, ks[0].Stalls, ks[0].Short, 80.0/90)
	}
	// loader: the workers read, the truth says they computed.
	if ks[1].Share() != 0 || ks[1].Top() != "loader.wait.io" || ks[1].Named != 0 {
		t.Errorf("loader share %v top %s named %d", ks[1].Share(), ks[1].Top(), ks[1].Named)
	}
	if ks[2].Share() != -1 || ks[2].Nameable {
		t.Errorf("sleep (other pid's gap only) share %v nameable %v", ks[2].Share(), ks[2].Nameable)
	}
}

func TestReadTruthErrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"no meta":      `{"type":"step","n":1,"start":1,"end":2}`,
		"bad clock":    `{"type":"meta","pid":3,"clock":"monotonic"}`,
		"bad interval": "{\"type\":\"meta\",\"pid\":3,\"clock\":\"realtime\"}\n{\"type\":\"step\",\"n\":1,\"start\":5,\"end\":2}",
		"unknown type": "{\"type\":\"meta\",\"pid\":3,\"clock\":\"realtime\"}\n{\"type\":\"bogus\",\"start\":1,\"end\":2}",
		"causeless":    "{\"type\":\"meta\",\"pid\":3,\"clock\":\"realtime\"}\n{\"type\":\"stall\",\"start\":1,\"end\":2}",
		"not json":     "{",
		"empty at all": "",
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readTruth(p); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	p := filepath.Join(dir, "good")
	body := "{\"type\":\"meta\",\"pid\":3,\"clock\":\"realtime\",\"job\":\"j\"}\n" +
		"{\"type\":\"step\",\"n\":2,\"start\":30,\"end\":40}\n{\"type\":\"step\",\"n\":1,\"start\":10,\"end\":20}\n" +
		"{\"type\":\"stall\",\"cause\":\"sleep\",\"code\":\"f\",\"start\":21,\"end\":29}\n{\"type\":\"end\",\"steps\":2}\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := readTruth(p)
	if err != nil {
		t.Fatal(err)
	}
	if tr.PID != 3 || len(tr.Steps) != 2 || tr.Steps[0].Number != 1 || len(tr.Stalls) != 1 || !tr.Ended {
		t.Errorf("truth %+v", tr)
	}
	tr.tracedFrom(5) // the first step is dropped, and the stall before the second with it
	if len(tr.Steps) != 1 || len(tr.Stalls) != 0 {
		t.Errorf("after tracedFrom: %d steps %d stalls", len(tr.Steps), len(tr.Stalls))
	}
}
