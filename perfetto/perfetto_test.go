package perfetto_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/perfetto"
)

const ms = int64(1_000_000)

// base is a 2020s timestamp: its microseconds need 16 digits, more than a
// float64 keeps with nanosecond decimals.
const base = int64(1_760_000_000_123_456_789)

// session is two ranks on GPUs 0 and 1, three steps each, with gaps of
// several causes, host operations and a collective that names the rank.
func session() ([]correlate.Gap, []correlate.Step) {
	var gaps []correlate.Gap
	var steps []correlate.Step
	rank1 := int32(1)
	for r, pid := range []uint32{100, 200} {
		for n := int64(0); n < 3; n++ {
			s0 := base + n*50*ms
			g1 := correlate.Gap{PID: pid, TID: pid + 1, Device: r, Step: n, Kind: correlate.GapIdle,
				Start: s0 + 10*ms, End: s0 + 22*ms, Duration: 12*ms + 7, Cause: correlate.CauseIORead,
				Breakdown: map[correlate.Cause]int64{correlate.CauseIORead: 12 * ms},
				Evidence:  correlate.Evidence{Source: "host", Files: []correlate.FileEvidence{{Path: "/data/shard-0", Op: "read", Bytes: 4096, Calls: 2, NS: 11 * ms}}},
				Ops: []correlate.HostOp{{Name: "read", TID: pid + 1, Start: s0 + 10*ms + 500, End: s0 + 21*ms,
					Attrs: map[string]string{"file.path": "/data/shard-0"}}}}
			g2 := correlate.Gap{PID: pid, TID: pid + 1, Device: r, Step: n, Kind: correlate.GapStall,
				Start: s0 + 30*ms, End: s0 + 35*ms, Duration: 5 * ms, Cause: correlate.CauseComm,
				Evidence: correlate.Evidence{Source: "host", CUDACall: "cuStreamSynchronize",
					Collective: &correlate.CollectiveEvidence{Op: "ncclAllReduce", Bytes: 1 << 20, Comm: "0xabc", Ranks: 2}}}
			if pid == 200 {
				g2.Evidence.Collective.Rank = &rank1
			}
			g3 := correlate.Gap{PID: pid, TID: pid + 2, Device: r, Step: n, Start: s0 + 40*ms, End: s0 + 43*ms,
				Duration: 3 * ms, Cause: correlate.CauseCPU, Evidence: correlate.Evidence{Source: "host"}}
			gaps = append(gaps, g1, g2, g3)
			steps = append(steps, correlate.Step{PID: pid, Device: r, Number: n, Start: s0, End: s0 + 50*ms,
				IdleNS: 15 * ms, BoundedIdleNS: 15 * ms, StallNS: 5 * ms, IdleRatio: 0.3, Gaps: 3, Launches: 40,
				ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 12 * ms, correlate.CauseComm: 5 * ms, correlate.CauseCPU: 3 * ms}})
		}
	}
	return gaps, steps
}

// feed sends a step's gaps before the step, as the engine does.
func feed(sink correlate.Sink, gaps []correlate.Gap, steps []correlate.Step) {
	for _, s := range steps {
		r := correlate.StepResult{Step: s}
		for _, g := range gaps {
			if g.PID == s.PID && g.Step == s.Number {
				sink.Gap(g)
				r.GapList = append(r.GapList, g)
			}
		}
		sink.Step(r)
	}
}

func parse(t *testing.T, b []byte) perfetto.File {
	t.Helper()
	var f perfetto.File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("trace is not trace-event JSON: %v\n%.2000s", err, b)
	}
	if len(f.TraceEvents) == 0 {
		t.Fatal("no traceEvents")
	}
	for _, e := range f.TraceEvents {
		switch e.Ph {
		case "X":
			if e.TS == "" || e.Dur == "" {
				t.Errorf("complete event without ts/dur: %+v", e)
			}
		case "M":
		default:
			t.Errorf("unexpected phase %q", e.Ph)
		}
	}
	return f
}

// nsOf turns the exact decimal microseconds back into nanoseconds.
func nsOf(t *testing.T, n json.Number) int64 {
	t.Helper()
	s := string(n)
	whole, frac, _ := strings.Cut(s, ".")
	frac = (frac + "000")[:3]
	var v int64
	for _, c := range whole + frac {
		v = v*10 + int64(c-'0')
	}
	return v
}

type gapKey struct {
	cause string
	start int64
	dur   int64
	ns    int64
}

func gapSlices(t *testing.T, f perfetto.File) []gapKey {
	var out []gapKey
	for _, e := range f.TraceEvents {
		if e.Cat != perfetto.CatIdle && e.Cat != perfetto.CatStall {
			continue
		}
		if e.Args["cause"] != e.Name {
			t.Errorf("gap slice %q has cause %v", e.Name, e.Args["cause"])
		}
		d, _ := e.Args["duration_ns"].(float64)
		out = append(out, gapKey{e.Name, nsOf(t, e.TS), nsOf(t, e.Dur), int64(d)})
	}
	slices.SortFunc(out, func(a, b gapKey) int { return int(min(max(a.start-b.start, -1), 1)) })
	return out
}

func wantGaps(gaps []correlate.Gap) []gapKey {
	var out []gapKey
	for _, g := range gaps {
		out = append(out, gapKey{string(g.Cause), g.Start, g.End - g.Start, g.Duration})
	}
	slices.SortFunc(out, func(a, b gapKey) int { return int(min(max(a.start-b.start, -1), 1)) })
	return out
}

func TestWriterTracks(t *testing.T) {
	gaps, steps := session()
	var buf bytes.Buffer
	w := perfetto.New(&buf, perfetto.Options{ProcessName: func(pid uint32) string { return "python3" }})
	feed(w, gaps, steps)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f := parse(t, buf.Bytes())
	if got, want := gapSlices(t, f), wantGaps(gaps); !slices.Equal(got, want) {
		t.Errorf("gap slices differ from the gaps:\n got %v\nwant %v", got, want)
	}

	names := map[[2]uint32]string{}
	var procNames []string
	for _, e := range f.TraceEvents {
		if e.Ph == "M" && e.Name == "thread_name" {
			names[[2]uint32{e.PID, e.TID}] = e.Args["name"].(string)
		}
		if e.Ph == "M" && e.Name == "process_name" {
			procNames = append(procNames, e.Args["name"].(string))
		}
	}
	slices.Sort(procNames)
	if want := []string{"python3 (pid 100)", "rank 1 · python3 (pid 200)"}; !slices.Equal(procNames, want) {
		t.Errorf("process names %q, want %q", procNames, want)
	}

	// Per GPU track: busy and idle tile every step exactly, without overlap.
	perStep := map[[2]int64]int64{}
	var stepSlices, hostSlices int
	for _, e := range f.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		track := names[[2]uint32{e.PID, e.TID}]
		switch e.Cat {
		case perfetto.CatBusy, perfetto.CatIdle, perfetto.CatStall:
			if !strings.HasPrefix(track, "GPU ") {
				t.Errorf("%s slice on track %q", e.Cat, track)
			}
			n, _ := e.Args["step"].(float64)
			perStep[[2]int64{int64(e.PID), int64(n)}] += nsOf(t, e.Dur)
		case perfetto.CatStep:
			stepSlices++
			if !strings.HasPrefix(track, "steps · GPU ") {
				t.Errorf("step slice on track %q", track)
			}
		case perfetto.CatHost:
			hostSlices++
			if !strings.HasPrefix(track, "thread ") {
				t.Errorf("host slice on track %q", track)
			}
		}
	}
	for _, s := range steps {
		if got := perStep[[2]int64{int64(s.PID), s.Number}]; got != s.End-s.Start {
			t.Errorf("pid %d step %d: busy+idle %d ns, step %d ns", s.PID, s.Number, got, s.End-s.Start)
		}
	}
	if stepSlices != len(steps) {
		t.Errorf("%d step slices, want %d", stepSlices, len(steps))
	}
	// Per gap: the read op (io.read), the sync (comm, no op of its own:
	// named by the CUDA call) and the CPU time (cpu) on its thread.
	if hostSlices != len(gaps) {
		t.Errorf("%d host slices, want %d", hostSlices, len(gaps))
	}
	if !bytes.Contains(buf.Bytes(), []byte(`"name":"cuStreamSynchronize"`)) || !bytes.Contains(buf.Bytes(), []byte(`"file.path":"/data/shard-0"`)) {
		t.Error("host tracks lack the sync or the read's file")
	}
}

func TestConvertGapsFile(t *testing.T) {
	gaps, _ := session()
	var in bytes.Buffer
	j := correlate.WriteGapsJSONL(&in)
	for _, g := range gaps {
		j.Gap(g)
	}
	var out bytes.Buffer
	w := perfetto.New(&out, perfetto.Options{})
	format, err := perfetto.Convert(&in, w)
	if err != nil || format != perfetto.FormatGaps {
		t.Fatalf("convert: %q %v", format, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f := parse(t, out.Bytes())
	if got, want := gapSlices(t, f), wantGaps(gaps); !slices.Equal(got, want) {
		t.Errorf("gap slices differ from the gaps file:\n got %v\nwant %v", got, want)
	}
}

func TestConvertSpansFile(t *testing.T) {
	gaps, steps := session()
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, JobID: "job", Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	feed(x, gaps, steps)
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	w := perfetto.New(&out, perfetto.Options{})
	format, err := perfetto.Convert(in, w)
	if err != nil || format != perfetto.FormatSpans {
		t.Fatalf("convert: %q %v", format, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f := parse(t, out.Bytes())
	// Span durations are carried in milliseconds as floats; nanoseconds
	// come back exact at these magnitudes.
	if got, want := gapSlices(t, f), wantGaps(gaps); !slices.Equal(got, want) {
		t.Errorf("gap slices differ from the spans:\n got %v\nwant %v", got, want)
	}
	if g, s := w.Counts(); g != int64(len(gaps)) || s != int64(len(steps)) {
		t.Errorf("converted %d gaps, %d steps; want %d, %d", g, s, len(gaps), len(steps))
	}
}

func TestConvertRejectsOtherFiles(t *testing.T) {
	for name, in := range map[string]string{
		"empty":    "\n\n",
		"not json": "hello\n",
		"other":    `{"a":1}` + "\n",
		"bad gap":  `{"cause":"io.read","start_unix_nano":"x"}` + "\n",
	} {
		w := perfetto.New(&bytes.Buffer{}, perfetto.Options{})
		if _, err := perfetto.Convert(strings.NewReader(in), w); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestLockHolderArgs: a lock gap's slice names the thread its feeder
// waited on, from a gaps file and through a spans file alike.
func TestLockHolderArgs(t *testing.T) {
	_, steps := session()
	g := correlate.Gap{PID: 100, TID: 101, Step: 0, Kind: correlate.GapIdle, Start: base + 10*ms, End: base + 30*ms,
		Duration: 20 * ms, Cause: correlate.CauseLock, Breakdown: map[correlate.Cause]int64{correlate.CauseLock: 20 * ms},
		Evidence: correlate.Evidence{Source: "host", LockHolders: []correlate.LockHolderEvidence{
			{TID: 102, Comm: "metrics", NS: 20 * ms, Doing: correlate.CauseSleep}}}}
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	feed(x, []correlate.Gap{g}, steps[:1])
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var direct, converted bytes.Buffer
	w := perfetto.New(&direct, perfetto.Options{})
	feed(w, []correlate.Gap{g}, steps[:1])
	wc := perfetto.New(&converted, perfetto.Options{})
	if _, err := perfetto.Convert(in, wc); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]*bytes.Buffer{"direct": &direct, "from spans": &converted} {
		if err := map[string]*perfetto.Writer{"direct": w, "from spans": wc}[name].Close(); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range parse(t, out.Bytes()).TraceEvents {
			if e.Ph != "X" || e.Name != "lock" {
				continue
			}
			if hs, _ := e.Args["lock_holders"].([]any); len(hs) == 1 {
				h, _ := hs[0].(map[string]any)
				found = found || h["tid"] == 102.0 && h["comm"] == "metrics" && h["doing"] == "sleep"
			}
		}
		if !found {
			t.Errorf("%s: no lock slice naming thread 102 (metrics), which slept", name)
		}
	}
}
