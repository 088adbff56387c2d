package correlate_test

import (
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// Recordings of two cross-check trainers (test/crosscheck/jobs) on the
// simulated GPU with three busy loops beside them on this 2-core machine
// (load 10): mp_loader's loop waits on a slow multiprocessing worker,
// gil_gc's for the GIL a metrics thread holds. The loop thread waits for a
// CPU, then blocks on the worker (holder): that wait for a CPU is the
// loader's (the lock's), not cpu.contention; and a fast worker blocked
// writing its batch into the result pipe is no I/O, so the gap over the
// slow worker's batch is loader.wait.cpu.

type loadedStall struct {
	cause      correlate.Cause
	start, end int64
	runDelay   int64 // the loop thread's own wait for a CPU over the stall
}

// loadedStalls are the truth's loader and lock stalls; gil_gc's cpu
// stalls are the loop's own work.
func loadedStalls(truth []truthStall) []loadedStall {
	var out []loadedStall
	for _, r := range truth {
		switch r.cause {
		case "loader.wait.cpu":
			out = append(out, loadedStall{correlate.CauseLoaderWait, r.start, r.end, r.runDelay})
		case "lock":
			out = append(out, loadedStall{correlate.CauseLock, r.start, r.end, r.runDelay})
		}
	}
	return out
}

// loadedShare is the share of the gaps' time over the stalls given the
// stalls' cause (loader.wait in a gap whose workers computed), each gap's
// breakdown spread evenly over it, less the cpu.contention up to each
// stall's own run-queue wait.
func loadedShare(stalls []loadedStall, gaps []correlate.Gap) float64 {
	var right, seen float64
	for _, s := range stalls {
		var contention float64
		for _, g := range gaps {
			ov := min(g.End, s.end) - max(g.Start, s.start)
			if ov <= 0 || g.Duration <= 0 {
				continue
			}
			f := float64(ov) / float64(g.Duration)
			for c, ns := range g.Breakdown {
				seen += float64(ns) * f
				switch c {
				case s.cause:
					if c != correlate.CauseLoaderWait || workersComputed(g) {
						right += float64(ns) * f
					}
				case correlate.CauseCPUContention:
					contention += float64(ns) * f
				}
			}
		}
		seen -= min(contention, float64(s.runDelay))
	}
	return right / seen
}

// workersComputed says whether a gap is loader.wait with more of its
// workers computing than reading: loader.wait.cpu, as the trainer's
// slow worker computes.
func workersComputed(g correlate.Gap) bool {
	n := 0
	for _, w := range g.Evidence.Workers {
		switch w.Activity {
		case "cpu":
			n++
		case "io":
			n--
		}
	}
	return g.Cause == correlate.CauseLoaderWait && n > 0
}

func TestLoadedHostWaits(t *testing.T) {
	floors := map[string]float64{"sim-mp_loader-3loops-full": 0.8, "sim-gil_gc-3loops-full": 0.85}
	for name, floor := range floors {
		for _, as := range []string{"full", "lite", "auto"} {
			t.Run(name+"/"+as, func(t *testing.T) {
				dir := filepath.Join("testdata", "loaded")
				gaps := replayCrossCheck(t, filepath.Join(dir, name+".rec.gz"), as)
				stalls := loadedStalls(readStalls(t, filepath.Join(dir, name+".truth.jsonl")))
				if len(stalls) == 0 {
					t.Fatal("no stalls in the truth")
				}
				share := loadedShare(stalls, gaps)
				t.Logf("%d stalls, %.3f of the time over them given their cause", len(stalls), share)
				if share < floor {
					t.Errorf("%.3f of the stalls' time given their cause, want ≥ %.2f", share, floor)
				}
			})
		}
	}
}
