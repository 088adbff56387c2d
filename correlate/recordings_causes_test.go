package correlate_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// Recordings of real PyTorch runs on an H200 (testdata/recordings, made
// with test/gpu/run.sh and RECORD=1) replay here in every CI run: the
// engine's input is what the tracer saw on real hardware, and the
// trainer's truth file says when each injected stall ran.

// trainerCause maps test/gpu/trainer.py's stall names to causes.
var trainerCause = map[string]correlate.Cause{
	"io.read": correlate.CauseIORead, "io.write": correlate.CauseIOWrite, "net": correlate.CauseNet, "cpu": correlate.CauseCPU,
	"loader.wait": correlate.CauseLoaderWait, "checkpoint": correlate.CauseIOWrite, "lock": correlate.CauseLock, "pageable": correlate.CauseCUDAMemcpy,
}

type truthStall struct {
	cause      string
	start, end int64 // Unix ns
	runDelay   int64 // the stalling thread's wait for a CPU over it, where the job measured it
}

// readStalls returns the stalls of a trainer truth file in Unix ns (the
// trainer's CLOCK_MONOTONIC times moved by its meta's offset; the
// simulated jobs' are Unix ns already, with none).
func readStalls(t *testing.T, path string) []truthStall {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var off int64
	var out []truthStall
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Type       string `json:"type"`
			Cause      string `json:"cause"`
			Start, End int64
			Off        int64 `json:"realtime_minus_monotonic_ns"`
			RunDelay   int64 `json:"run_delay_ns"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch r.Type {
		case "meta":
			off = r.Off
		case "stall":
			out = append(out, truthStall{r.Cause, r.Start + off, r.End + off, r.RunDelay})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// replayGaps replays a committed recording and returns its gaps.
func replayGaps(t *testing.T, path string) []correlate.Gap {
	t.Helper()
	c := &gapSink{}
	replayFile(t, path, c)
	return c.gaps
}

// causeShare is, per trainer stall kind, the share of the idle time that
// gaps found inside its stalls that they attributed to its cause. One gap
// can hold several stalls (a step's pre-step work ran a net post, then a
// CPU burst): its breakdown credits each stall kind with at most the time
// the gap overlapped stalls of that kind. (The stall's own length would
// count time the GPU was still busy draining its queue; the recording
// holds no GPU truth.)
func causeShare(stalls []truthStall, gaps []correlate.Gap) map[string]float64 {
	got, total := map[string]float64{}, map[string]float64{}
	for _, g := range gaps {
		over := map[string]int64{}
		for _, s := range stalls {
			if a, b := max(g.Start, s.start), min(g.End, s.end); b > a {
				over[s.cause] += b - a
			}
		}
		for kind, ns := range over {
			c, ok := trainerCause[kind]
			if !ok {
				continue
			}
			total[kind] += float64(ns)
			got[kind] += float64(min(ns, g.Breakdown[c]))
		}
	}
	for k := range total {
		got[k] /= total[k]
	}
	return got
}

// TestRecordedH200Causes holds the engine to what it reaches on the real
// runs. A floor is set for every stall kind that is measurable in that run
// (the pageable copy of the loops runs leaves ~5 ms of idle and is only
// logged).
func TestRecordedH200Causes(t *testing.T) {
	floors := map[string]map[string]float64{
		"h200-acc-full":    {"io.read": 0.95, "io.write": 0.95, "net": 0.95, "cpu": 0.95, "loader.wait": 0.95},
		"h200-acc-lite":    {"io.read": 0.95, "io.write": 0.95, "net": 0.95, "cpu": 0.95, "loader.wait": 0.95},
		"h200-loops-eager": {"lock": 0.9},
	}
	for name, floor := range floors {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "recordings")
			share := causeShare(readStalls(t, filepath.Join(dir, name+".truth.jsonl")), replayGaps(t, filepath.Join(dir, name+".rec.gz")))
			t.Logf("share of each stall's time attributed to its cause: %v", share)
			for k, min := range floor {
				if share[k] < min {
					t.Errorf("%s: %.3f of the stalls' time attributed to %s, want ≥ %.2f", k, share[k], trainerCause[k], min)
				}
			}
		})
	}
}
