package correlate

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

// replayCall is one recorded call to the Engine (record.go).
type replayCall = Call

// replayOut is what the engine said, in emission order.
type replayOut struct {
	Gap  *Gap     `json:"gap,omitempty"`
	Step *Step    `json:"step,omitempty"`
	Sum  *Summary `json:"summary,omitempty"`
}

type replayScenario struct {
	name string
	lite bool
	gen  func() ([]event.Event, []event.GPUWindow, int64)
}

// replayScenarios mix every mechanism the engine has: all host causes,
// loader workers, two feeder threads, side streams, CPU-ahead read loops,
// comm stalls confirmed and rejected by GPM, lite probes, fixed windows.
func replayScenarios() []replayScenario {
	return []replayScenario{
		{"mixed-full", false, func() ([]event.Event, []event.GPUWindow, int64) {
			s := mixedTrainer(false)
			return s.evs, mixedWindows(s), s.t + 2e9
		}},
		{"mixed-lite", true, func() ([]event.Event, []event.GPUWindow, int64) {
			s := mixedTrainer(true)
			return s.evs, mixedWindows(s), s.t + 2e9
		}},
		{"irregular-windows", false, func() ([]event.Event, []event.GPUWindow, int64) {
			s := newSim()
			// Syncs with no repeating signature: fixed windows, then a
			// period, then an evaluation phase without syncs.
			for i := 0; i < 40; i++ {
				s.launches(5+(i*7)%13, 1*ms, 80*us)
				if i%3 == 0 {
					s.copyAsync(500*us, 9)
				}
				s.sync()
				if i%4 == 1 {
					readStall(s, int64(2+i%5)*ms)
				}
			}
			for i := 0; i < 30; i++ {
				s.step(12, 2*ms, 100*us)
			}
			s.launches(400, 2*ms, 3*ms) // an eval loop: no sync for ~2 s
			for i := 0; i < 20; i++ {
				s.step(12, 2*ms, 100*us)
			}
			return s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t + 3e9
		}},
	}
}

// mixedTrainer is a two-stream trainer with a loader worker, a second
// feeder thread and every stall kind in turn.
func mixedTrainer(lite bool) *gpuSim {
	s := newSim()
	s.lite = lite
	s.evs = append(s.evs, event.Event{Kind: event.KindFork, PID: s.pid, TID: s.pid, Start: s.t, End: s.t, ChildPID: workerPID})
	s.evs = append(s.evs, event.Event{Kind: event.KindCommInit, PID: s.pid, TID: s.pid, Start: s.t, End: s.t,
		Comm: 0xc0ffee, Count: 2, PeerRank: 0})
	s.t += ms
	step := func(late int64, coll bool) {
		for i := 0; i < 8; i++ {
			if i%2 == 0 {
				s.stream = 1
			} else {
				s.stream = 0x5a00
			}
			s.launches(3, 600*us, 90*us)
		}
		s.stream = 1
		s.copyAsync(400*us, 7)
		if coll {
			s.collective(event.NCCLAllReduce, 2*ms+late)
		}
		s.sync()
	}
	cases := stallCases()
	for n := 0; n < 90; n++ {
		late := int64(0)
		if n%11 == 10 {
			late = 25 * ms
		}
		step(late, true)
		switch {
		case n%6 == 5:
			cases[(n/6)%len(cases)].inject(s)
		case n%17 == 8:
			// CPU ahead: the queue still holds a step's work while the
			// feeder reads in a loop.
			s.launches(10, 3*ms, 50*us)
			for i := 0; i < 60; i++ {
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "pread64",
					FDKind: event.FDFile, Path: "/data/shard-1"}, 450*us)
				s.t += 50 * us
			}
		case n%23 == 12:
			// A second feeder reads and launches while the first sleeps.
			at := s.t
			s.tid = 101
			readStall(s, 20*ms)
			s.kernel(2 * ms)
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: at, End: at + 24*ms,
				Syscall: event.SysSleep, Name: "clock_nanosleep"})
			s.tid = 100
			s.t = at + 24*ms
		case n%13 == 3:
			// A futex on a sibling that was reading.
			at := s.t
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 102, Start: at, End: at + 8*ms,
				Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/sib"})
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: 100, WakerTID: 102}, 9*ms)
		}
	}
	return s
}

// mixedWindows are NVML windows and GPM windows whose SM activity drops
// during late collectives (confirming some stalls) but not all of them.
func mixedWindows(s *gpuSim) []event.GPUWindow {
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	k := 0
	gpm := s.windows(t0+30*ms, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 {
		k++
		idle := float64(s.idle(a, b)) / float64(b-a)
		if k%3 == 0 {
			return 0.9 * (1 - idle)
		}
		return 0.45*idle + 0.2
	})
	return append(wins, gpm...)
}

// record drives the engine like feed does and returns the calls it made.
func record(evs []event.Event, wins []event.GPUWindow, until, tick, winLate int64) []replayCall {
	evs = append([]event.Event(nil), evs...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].End < evs[j].End })
	wins = append([]event.GPUWindow(nil), wins...)
	sort.SliceStable(wins, func(i, j int) bool { return wins[i].End < wins[j].End })
	var calls []replayCall
	i, j := 0, 0
	for now := t0; now <= until; now += tick {
		for i < len(evs) && evs[i].End <= now {
			calls = append(calls, replayCall{Ev: &evs[i]})
			i++
		}
		for j < len(wins) && wins[j].End+winLate <= now {
			calls = append(calls, replayCall{Win: &wins[j]})
			j++
		}
		calls = append(calls, replayCall{Advance: now})
	}
	for ; i < len(evs); i++ {
		calls = append(calls, replayCall{Ev: &evs[i]})
	}
	for ; j < len(wins); j++ {
		calls = append(calls, replayCall{Win: &wins[j]})
	}
	return append(calls, replayCall{Close: until})
}

type replaySink struct{ out []replayOut }

func (r *replaySink) Gap(g Gap)         { r.out = append(r.out, replayOut{Gap: &g}) }
func (r *replaySink) Step(s StepResult) { r.out = append(r.out, replayOut{Step: &s.Step}) }

// replay runs calls through a fresh engine and returns its output as JSON
// lines.
func replay(t *testing.T, lite bool, calls []replayCall) []byte {
	t.Helper()
	r := &replaySink{}
	cfg := Config{Logger: quiet()}
	if lite {
		cfg.Probes = ProbesLite
	}
	sum := Replay(cfg, r, calls)
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
	for _, sc := range replayScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			in := filepath.Join("testdata", "replay", sc.name+".calls.jsonl.gz")
			golden := filepath.Join("testdata", "replay", sc.name+".golden.jsonl")
			if *updateReplay {
				evs, wins, until := sc.gen()
				writeCalls(t, in, record(evs, wins, until, 20*ms, 250*ms))
			}
			calls := readCalls(t, in)
			got := replay(t, sc.lite, calls)
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

func writeCalls(t *testing.T, path string, calls []replayCall) {
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

func readCalls(t *testing.T, path string) []replayCall {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (run with -update-replay to record)", err)
	}
	defer f.Close()
	_, calls, err := ReadRecording(f)
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
