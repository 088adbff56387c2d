// Package whatif estimates, per cause, the step time a training job would
// save if that cause were gone: a checkpoint written asynchronously, more
// data-loader workers, pinned memory for host-to-device copies.
//
// The estimate is computed from the gap model only (the steps and gaps the
// correlation engine emits), never from a second run:
//
//   - Idle time (bounded gaps and micro idle) that a step's ByCause
//     charges to cause c disappears with c. Only the GPU's idle time
//     counts, not the host's time in c: the part of a 30 ms write during
//     which the GPU still drained its queue was hidden and saves nothing.
//   - A stall (kind "stall": the GPU busy spinning on a late peer) may
//     overlap kernels that do useful work on other streams; that work
//     still has to run. When GPM measured the stall's mean SM activity a,
//     only the stall's (1 − a) share is saved; without GPM all of it.
//   - loader.wait is saved only as far as more workers keep up. With the
//     fix "twice the workers" and the consumer's own step time C (the
//     step without the wait w), a pool that left the feeder waiting w
//     produces a batch every w + C; twice the workers, every (w + C)/2.
//     The wait disappears when (w + C)/2 ≤ C, i.e. w ≤ C; otherwise the
//     step shrinks to (w + C)/2 and (w + C)/2 is saved.
//   - Per step means amortized: a checkpoint every 50 steps saves its
//     idle once in 50 steps, and the per-step figure is the total saved
//     divided by the steps seen. Steps and MaxNS say how it was spread.
//
// Limits: each cause is removed alone (savings of two causes do not add
// when one would then wait for the other); the host work after the removed
// cause is assumed not to become the new bottleneck; a gap the engine
// delivered after its step was emitted is in no step and is not counted
// here (the engine counts such gaps: Losses.GapsAfterStep);
// in a job without a step period the "steps" are fixed windows.
package whatif

import (
	"cmp"
	"slices"
	"sync"

	"github.com/gaptrace/gaptrace/correlate"
)

// fixes says, per cause, what removes it.
var fixes = map[correlate.Cause]string{
	correlate.CauseIORead:        "prefetch input in data-loader workers",
	correlate.CauseLoaderWait:    "more data-loader workers (estimated for twice as many)",
	correlate.CauseIOWrite:       "write checkpoints and logs asynchronously",
	correlate.CauseNet:           "send metrics and logs from a background thread",
	correlate.CauseComm:          "balance the ranks: the gaps name the late rank (late_rank, or waiting_on_ranks)",
	correlate.CauseCUDAMemcpy:    "pinned host memory (pin_memory=True) and non_blocking copies",
	correlate.CauseCUDAAlloc:     "keep the caching allocator warm: no empty_cache, stable shapes",
	correlate.CauseCPU:           "cut launch overhead: CUDA graphs, torch.compile, fused kernels",
	correlate.CauseCPUContention: "give the trainer its own cores (fewer threads, CPU pinning)",
	correlate.CauseSleep:         "remove sleeps from the training loop",
	correlate.CauseLock:          "move work off threads that hold the GIL or the lock",
	correlate.CauseSubprocess:    "run the subprocess in the background (Popen) or off the training loop",
	correlate.CauseOther:         "unattributed: read the gaps' evidence",
}

// Fix names the change that would remove cause c.
func Fix(c correlate.Cause) string {
	if f, ok := fixes[c]; ok {
		return f
	}
	return "unknown cause"
}

// ForStep returns, per cause, the nanoseconds step s would lose if that
// cause were gone. gaps may hold any gaps; only the stalls of s are used
// (for their SM activity). Causes that would save nothing are left out.
func ForStep(s correlate.Step, gaps []correlate.Gap) map[correlate.Cause]int64 {
	stall := map[correlate.Cause]int64{}
	stallSaved := map[correlate.Cause]int64{}
	for i := range gaps {
		g := &gaps[i]
		if g.Kind != correlate.GapStall || g.PID != s.PID || g.Device != s.Device || g.Step != s.Number {
			continue
		}
		keep := 1.0
		if a := g.Evidence.SMActivity; a != nil {
			keep = 1 - min(1, max(0, *a))
		}
		for c, ns := range g.Breakdown {
			stall[c] += ns
			stallSaved[c] += int64(float64(ns) * keep)
		}
	}
	dur := s.End - s.Start
	out := map[correlate.Cause]int64{}
	for c, total := range s.ByCause {
		if total <= 0 {
			continue
		}
		st := min(stall[c], total)
		saved := total - st + min(stallSaved[c], st)
		if c == correlate.CauseLoaderWait {
			saved = loaderSaved(saved, dur-saved)
		}
		if saved = min(saved, dur); saved > 0 {
			out[c] = saved
		}
	}
	return out
}

// loaderSaved is what twice the loader workers save on a step that waited
// w for a batch and computed c without the wait (see the package doc).
func loaderSaved(w, c int64) int64 {
	if c < 0 {
		c = 0
	}
	if w <= c {
		return w
	}
	return (w + c) / 2
}

// Estimate is what removing one cause would save, per step on average.
type Estimate struct {
	Cause correlate.Cause
	// SavedNSPerStep is the total saved divided by the steps seen.
	SavedNSPerStep int64
	// SavedFraction is the total saved over the steps' total duration.
	SavedFraction float64
	Fix           string
	// Steps counts the steps that would have saved anything; MaxNS is the
	// most one step would have saved (a periodic checkpoint: few steps,
	// a large MaxNS).
	Steps int64
	MaxNS int64
}

// JSON is the --summary-json form of an Estimate (key what_if.<cause>).
type JSON struct {
	SavedNSPerStep int64   `json:"saved_ns_per_step"`
	SavedFraction  float64 `json:"saved_fraction"`
	Fix            string  `json:"fix"`
	Steps          int64   `json:"steps_with_saving"`
	MaxNS          int64   `json:"max_step_saved_ns"`
}

// Accumulator is a correlate.Sink that adds up ForStep over every step,
// each with the gaps its StepResult carries; it keeps nothing of a step
// once added. Safe for concurrent use.
type Accumulator struct {
	mu     sync.Mutex
	steps  int64
	wallNS int64
	saved  map[correlate.Cause]int64
	hits   map[correlate.Cause]int64
	maxNS  map[correlate.Cause]int64
}

// New returns an empty Accumulator.
func New() *Accumulator {
	return &Accumulator{saved: map[correlate.Cause]int64{},
		hits: map[correlate.Cause]int64{}, maxNS: map[correlate.Cause]int64{}}
}

// Gap implements correlate.Sink. A gap counts through the step that
// carries it; one no step carries (Late) is in no step's ByCause either.
func (a *Accumulator) Gap(correlate.Gap) {}

// Step implements correlate.Sink.
func (a *Accumulator) Step(s correlate.StepResult) {
	saved := ForStep(s.Step, s.GapList)
	a.mu.Lock()
	defer a.mu.Unlock()
	for c, ns := range saved {
		a.saved[c] += ns
		a.hits[c]++
		a.maxNS[c] = max(a.maxNS[c], ns)
	}
	a.steps++
	a.wallNS += s.End - s.Start
}

// Estimates returns what removing each cause would save, the largest
// saving first; causes that would save nothing are left out.
func (a *Accumulator) Estimates() []Estimate {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.steps == 0 {
		return nil
	}
	var out []Estimate
	for c, ns := range a.saved {
		if ns <= 0 {
			continue
		}
		e := Estimate{Cause: c, SavedNSPerStep: ns / a.steps, Fix: Fix(c), Steps: a.hits[c], MaxNS: a.maxNS[c]}
		if a.wallNS > 0 {
			e.SavedFraction = float64(ns) / float64(a.wallNS)
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(x, y Estimate) int {
		return cmp.Or(cmp.Compare(y.SavedNSPerStep, x.SavedNSPerStep), cmp.Compare(x.Cause, y.Cause))
	})
	return out
}

// MeanStepNS is the mean duration of the steps seen (0 before the first).
func (a *Accumulator) MeanStepNS() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.steps == 0 {
		return 0
	}
	return a.wallNS / a.steps
}

// JSONMap is the --summary-json what_if object.
func JSONMap(es []Estimate) map[correlate.Cause]JSON {
	if len(es) == 0 {
		return nil
	}
	m := make(map[correlate.Cause]JSON, len(es))
	for _, e := range es {
		m[e.Cause] = JSON{SavedNSPerStep: e.SavedNSPerStep, SavedFraction: e.SavedFraction, Fix: e.Fix, Steps: e.Steps, MaxNS: e.MaxNS}
	}
	return m
}
