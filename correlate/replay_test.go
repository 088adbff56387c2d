package correlate_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
	"github.com/gaptrace/gaptrace/event"
)

// The replay tier pins the engine's exact output: recorded call sequences
// (Event, Window, Advance, Close, in the order a sidecar made them) are
// replayed and every emitted gap and step, and the summary, must equal the
// golden file byte for byte. A refactoring that changes one nanosecond of
// one gap fails here even when every tolerance-based test still passes.
//
// -update-replay re-records the sequences from the simulated scenarios
// below and rewrites the goldens; only do that for an intended change of
// behaviour, and say so in the commit.
var updateReplay = flag.Bool("update-replay", false, "re-record testdata/replay and rewrite its golden outputs")

// -update-golden rewrites the golden outputs from the recorded sequences as
// they are: an engine change, the calls kept.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/replay's golden outputs from its recorded calls")

// replayOut is what the engine said, in emission order.
type replayOut struct {
	Gap  *correlate.Gap     `json:"gap,omitempty"`
	Step *correlate.Step    `json:"step,omitempty"`
	Sum  *correlate.Summary `json:"summary,omitempty"`
}

// recordCalls drives the engine like feed does and returns the calls it made.
func recordCalls(evs []event.Event, wins []event.GPUWindow, until, tick, winLate int64) []record.Call {
	evs = append([]event.Event(nil), evs...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].End < evs[j].End })
	wins = append([]event.GPUWindow(nil), wins...)
	sort.SliceStable(wins, func(i, j int) bool { return wins[i].End < wins[j].End })
	var calls []record.Call
	i, j := 0, 0
	for now := correlate.T0; now <= until; now += tick {
		for i < len(evs) && evs[i].End <= now {
			calls = append(calls, record.Call{Ev: &evs[i]})
			i++
		}
		for j < len(wins) && wins[j].End+winLate <= now {
			calls = append(calls, record.Call{Win: &wins[j]})
			j++
		}
		calls = append(calls, record.Call{Advance: now})
	}
	for ; i < len(evs); i++ {
		calls = append(calls, record.Call{Ev: &evs[i]})
	}
	for ; j < len(wins); j++ {
		calls = append(calls, record.Call{Win: &wins[j]})
	}
	return append(calls, record.Call{Close: until})
}

type replaySink struct{ out []replayOut }

func (r *replaySink) Gap(g correlate.Gap)         { r.out = append(r.out, replayOut{Gap: &g}) }
func (r *replaySink) Step(s correlate.StepResult) { r.out = append(r.out, replayOut{Step: &s.Step}) }

// replay runs calls through a fresh engine and returns its output as JSON
// lines.
func replay(t *testing.T, lite bool, calls []record.Call) []byte {
	t.Helper()
	r := &replaySink{}
	cfg := correlate.Config{Logger: correlate.Quiet()}
	if lite {
		cfg.Probes = correlate.ProbesLite
	}
	sum := record.Replay(cfg, r, calls)
	r.out = append(r.out, replayOut{Sum: &sum})
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, o := range r.out {
		if err := enc.Encode(o); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestReplayGolden(t *testing.T) {
	for _, sc := range correlate.ReplayScenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			in := filepath.Join("testdata", "replay", sc.Name+".calls.jsonl.gz")
			golden := filepath.Join("testdata", "replay", sc.Name+".golden.jsonl")
			if *updateReplay {
				evs, wins, until := sc.Gen()
				writeCalls(t, in, recordCalls(evs, wins, until, 20*correlate.Ms, 250*correlate.Ms))
			}
			calls := readCalls(t, in)
			got := replay(t, sc.Lite, calls)
			if *updateReplay || *updateGolden {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update-replay to record)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("output differs from %s:\n%s", golden, firstDiff(want, got))
			}
			if n := bytes.Count(got, []byte(`{"gap"`)); n < 10 {
				t.Errorf("scenario emits only %d gaps: it pins too little", n)
			}
		})
	}
}

func writeCalls(t *testing.T, path string, calls []record.Call) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	enc := json.NewEncoder(zw)
	for _, c := range calls {
		if err := enc.Encode(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readCalls(t *testing.T, path string) []record.Call {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (run with -update-replay to record)", err)
	}
	defer f.Close()
	_, calls, err := record.Read(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return calls
}

// firstDiff shows the first differing line of two JSON-lines outputs.
func firstDiff(want, got []byte) string {
	w, g := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b []byte
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if !bytes.Equal(a, b) {
			return fmt.Sprintf("line %d\nwant %s\ngot  %s", i+1, a, b)
		}
	}
	return "(same lines)"
}
