// Package accuracy measures how well gaptrace finds and explains GPU idle
// time, against the ground truth the simulated trainer writes.
//
// The scoring library is split by job: truth.go reads simtrain's truth
// file, intervals.go holds the interval sets and ratios, stepcount.go
// scores step counts and per-step idle, and score.go scores gaps and
// causes. Together they read simtrain's truth file
// (CLOCK_MONOTONIC, converted once to Unix ns with the meta record's
// realtime_minus_monotonic_ns), gaptrace's gaps (--gaps-out) and step spans
// (--spans-out), and compare them as sets of time intervals. They have no
// dependency on the tracer and are unit-tested on hand-made truth and gap
// sets; accuracy_test.go runs the real tracer and applies them.
//
// Running it: `make accuracy` (root: the tracer loads eBPF) builds
// bin/gaptrace and the simulated GPU, runs TestAccuracy, prints the table
// and writes out/accuracy/accuracy.{txt,json}, with every run's inputs and
// outputs (command, truth, gaps, spans, summary, gaptrace's debug log)
// under out/accuracy/runs/<scenario>-<probes>/. GAPTRACE_ACCURACY_ONLY, a
// regular expression on "scenario/probes", selects runs. The test fails on
// every missed target; `go test ./...` runs it too (it skips when not root).
//
// Definitions (all time-weighted, all clipped to the scored range, from the
// first truth step's start to the last truth step's end):
//   - True GPU idle: the complement of the device's busy intervals of kind
//     kernel or collective. Copies and memsets do not make the GPU busy
//     (utilization.gpu does not count them either).
//   - True gaps: maximal intervals of true idle at least MinGap long.
//   - Detection recall: true-gap time covered by reported gaps of kind idle,
//     over true-gap time. Precision: reported idle-gap time that is truly
//     idle, over reported idle-gap time.
//   - Attribution accuracy of a cause: over the truth stalls of that cause,
//     the time of stall ∩ true idle covered by reported gaps whose dominant
//     cause is right, over the same time covered by any reported gap;
//     coverage is the covered time over stall ∩ true idle. Where the truth
//     says the trainer spent at least 45% of a stall in the run queue (the
//     machine's own load), cpu.contention is right too. A comm stall is
//     busy-but-waiting (the collective spins on a late peer), so it is
//     scored on its whole interval against gaps of kind stall.
//   - Per-step idle: gaptrace's train.step idle (bounded + micro) against
//     the truth's idle over the matching sync-to-sync interval.
package accuracy

import (
	"math"
	"slices"

	"github.com/gaptrace/gaptrace/correlate"
)

// ExpectedCause maps a simtrain stall cause to the gaptrace cause that
// explains it, plus what the data-loader evidence must say the workers did
// ("" when the cause has no worker evidence). simtrain's loader.wait.io and
// loader.wait.cpu are one gaptrace cause, loader.wait, whose evidence tells
// them apart.
func ExpectedCause(truthCause string) (cause correlate.Cause, worker string) {
	switch truthCause {
	case "loader.wait", "loader.wait.io":
		return correlate.CauseLoaderWait, "io"
	case "loader.wait.cpu":
		return correlate.CauseLoaderWait, "cpu"
	}
	return correlate.Cause(truthCause), ""
}

// ReportedCause is a gap's cause as the scorer compares it: the dominant
// cause, refined for loader.wait by what the workers in its evidence did
// (loader.wait.io, loader.wait.cpu; plain loader.wait without evidence).
func ReportedCause(g correlate.Gap) string {
	if g.Cause != correlate.CauseLoaderWait {
		return string(g.Cause)
	}
	var io, cpu int
	for _, w := range g.Evidence.Workers {
		switch w.Activity {
		case "io":
			io++
		case "cpu":
			cpu++
		}
	}
	switch {
	case io > cpu:
		return "loader.wait.io"
	case cpu > io:
		return "loader.wait.cpu"
	}
	return string(correlate.CauseLoaderWait)
}

// TruthCauseName is the name a truth cause is scored under: simtrain's
// alias loader.wait is its default, loader.wait.io.
func TruthCauseName(truthCause string) string {
	if truthCause == "loader.wait" {
		return "loader.wait.io"
	}
	return truthCause
}

// CauseResult scores one injected cause.
type CauseResult struct {
	Stalls int `json:"stalls"`
	// TruthNS is the time to explain: stall ∩ true idle (comm: the stall).
	TruthNS int64 `json:"truth_ns"`
	// Accuracy: right-cause time over covered time. Coverage: covered time
	// over TruthNS.
	Accuracy Ratio `json:"accuracy"`
	Coverage Ratio `json:"coverage"`
	// Confusion is how the covered time was labelled, by reported cause.
	Confusion map[string]int64 `json:"confusion_ns"`
}

// Result scores one traced run.
type Result struct {
	Range      Interval `json:"range"`
	TrueIdleNS int64    `json:"true_idle_ns"`
	// TrueGapNS is the true idle in gaps ≥ MinGap, TrueGaps their count.
	TrueGapNS      int64 `json:"true_gap_ns"`
	TrueGaps       int   `json:"true_gaps"`
	ReportedIdleNS int64 `json:"reported_idle_ns"`
	ReportedGaps   int   `json:"reported_gaps"`
	Recall         Ratio `json:"recall"`
	Precision      Ratio `json:"precision"`
	// StallRecall / StallPrecision compare gaps of kind stall with the
	// truth's comm stalls.
	StallRecall    Ratio                   `json:"stall_recall"`
	StallPrecision Ratio                   `json:"stall_precision"`
	Causes         map[string]*CauseResult `json:"causes"`
	// BoundaryErrNS: for every true gap ≥ MinGap that a reported idle gap
	// overlaps, |start error| and |end error| against the reported gap
	// that overlaps it most. P50/P90 over all of them.
	BoundaryP50NS int64   `json:"boundary_p50_ns"`
	BoundaryP90NS int64   `json:"boundary_p90_ns"`
	BoundaryErrNS []int64 `json:"-"`
	// Missed lists the true gaps ≥ MinGap less than half covered, for the
	// findings.
	Missed []Interval `json:"missed,omitempty"`
}

// Evaluate scores gaps against the truth; minGap is the reporting
// threshold (1 ms by default in gaptrace).
func Evaluate(tr *Truth, gaps []correlate.Gap, minGap int64) *Result {
	rng := tr.Range()
	idle := tr.Idle()
	r := &Result{Range: rng, TrueIdleNS: idle.Total(), Causes: map[string]*CauseResult{}}

	var trueGaps Set
	for _, iv := range idle {
		if iv.Len() >= minGap {
			trueGaps = append(trueGaps, iv)
		}
	}
	r.TrueGaps, r.TrueGapNS = len(trueGaps), trueGaps.Total()

	var idleIvs, stallIvs, anyIvs []Interval
	for _, g := range gaps {
		iv := Interval{g.Start, g.End}
		anyIvs = append(anyIvs, iv)
		if g.Kind == correlate.GapStall {
			stallIvs = append(stallIvs, iv)
			continue
		}
		idleIvs = append(idleIvs, iv)
	}
	reportedIdle := NewSet(idleIvs...).Clip(rng)
	reportedStall := NewSet(stallIvs...).Clip(rng)
	reportedAny := NewSet(anyIvs...).Clip(rng)
	r.ReportedIdleNS = reportedIdle.Total()
	for _, g := range gaps {
		if g.Kind != correlate.GapStall && g.End > rng.Start && g.Start < rng.End {
			r.ReportedGaps++
		}
	}

	r.Recall = Ratio{Intersect(trueGaps, reportedIdle).Total(), r.TrueGapNS}
	r.Precision = Ratio{Intersect(reportedIdle, idle).Total(), r.ReportedIdleNS}

	var comm []Interval
	for _, s := range tr.Stalls {
		if s.Cause == "comm" {
			comm = append(comm, s.Interval)
		}
	}
	commSet := NewSet(comm...).Clip(rng)
	r.StallRecall = Ratio{Intersect(commSet, reportedStall).Total(), commSet.Total()}
	r.StallPrecision = Ratio{Intersect(reportedStall, commSet).Total(), reportedStall.Total()}

	// Attribution: each stall's region against the gaps, by reported cause.
	// Overlapping reported gaps are taken in order; the first one that
	// covers a nanosecond labels it.
	for _, s := range tr.Stalls {
		name := TruthCauseName(s.Cause)
		cr := r.Causes[name]
		if cr == nil {
			cr = &CauseResult{Confusion: map[string]int64{}}
			r.Causes[name] = cr
		}
		cr.Stalls++
		region := NewSet(s.Interval).Clip(rng)
		if s.Cause != "comm" {
			region = Intersect(region, idle)
		}
		cr.TruthNS += region.Total()
		remaining := region
		for _, g := range gaps {
			if s.Cause == "comm" && g.Kind != correlate.GapStall {
				continue // an idle gap is not the right kind of report for a stall
			}
			got := Intersect(remaining, Set{{g.Start, g.End}})
			ns := got.Total()
			if ns == 0 {
				continue
			}
			remaining = subtract(remaining, got)
			rc := ReportedCause(g)
			cr.Confusion[rc] += ns
			cr.Coverage.Num += ns
			if s.Accepts(g) {
				cr.Accuracy.Num += ns
			}
		}
		// Time covered only by gaps of the wrong kind still counts as covered
		// (and wrong) for comm: the user saw idle, not a stall.
		if s.Cause == "comm" {
			wrongKind := Intersect(remaining, reportedAny).Total()
			if wrongKind > 0 {
				cr.Confusion["idle-kind"] += wrongKind
				cr.Coverage.Num += wrongKind
			}
		}
	}
	for _, cr := range r.Causes {
		cr.Accuracy.Den = cr.Coverage.Num
		cr.Coverage.Den = cr.TruthNS
	}

	// Boundaries and misses.
	for _, tg := range trueGaps {
		best := bestIdleGap(gaps, tg.Start, tg.End)
		if covered := Intersect(Set{tg}, reportedIdle).Total(); covered*2 < tg.Len() {
			r.Missed = append(r.Missed, tg)
		}
		if best == nil {
			continue
		}
		r.BoundaryErrNS = append(r.BoundaryErrNS, abs(best.Start-tg.Start), abs(best.End-tg.End))
	}
	r.BoundaryP50NS = Percentile(r.BoundaryErrNS, 0.5)
	r.BoundaryP90NS = Percentile(r.BoundaryErrNS, 0.9)
	return r
}

// bestIdleGap is the idle gap (not a stall) that overlaps [a, b] most,
// nil when none does.
func bestIdleGap(gaps []correlate.Gap, a, b int64) *correlate.Gap {
	var best *correlate.Gap
	var bestNS int64
	for i := range gaps {
		g := &gaps[i]
		if g.Kind == correlate.GapStall {
			continue
		}
		if ov := min(b, g.End) - max(a, g.Start); ov > bestNS {
			best, bestNS = g, ov
		}
	}
	return best
}

// NetResult judges the gaps of net stalls on more than their dominant
// cause: how much of them the breakdown gives the network, and whether
// their evidence names the server.
type NetResult struct {
	// Share: over the idle gap that covers most of each net stall, the
	// breakdown's net time over the gaps' durations less their
	// cpu.contention. Waiting for a CPU is the machine's own load (on two
	// shared cores a few ms of a 30 ms stall), which the attribution score
	// accepts too; every other cause counts against the network.
	Share Ratio `json:"share"`
	// Stalls is how many net stalls a gap covers; Named, of those gaps,
	// how many name the stall's server among their peers (its address and,
	// for simtrain's own server, its pid).
	Stalls int `json:"stalls"`
	Named  int `json:"named"`
}

// NetShare scores the truth's net stalls against the gaps (nil when the
// truth has none).
func NetShare(tr *Truth, gaps []correlate.Gap) *NetResult {
	var r *NetResult
	for _, s := range tr.Stalls {
		if s.Cause != "net" {
			continue
		}
		if r == nil {
			r = &NetResult{}
		}
		best := bestIdleGap(gaps, s.Start, s.End)
		if best == nil {
			continue
		}
		r.Stalls++
		r.Share.Num += best.Breakdown[correlate.CauseNet]
		r.Share.Den += best.Duration - best.Breakdown[correlate.CauseCPUContention]
		for _, p := range best.Evidence.Peers {
			if p.Address == s.Peer && (s.ServerPID == 0 || p.PID == s.ServerPID) {
				r.Named++
				break
			}
		}
	}
	return r
}

// subtract returns a \ b.
func subtract(a, b Set) Set {
	var out Set
	for _, iv := range a {
		out = append(out, Complement(b, iv)...)
	}
	return out
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// Percentile is the nearest-rank percentile (p in [0,1]) of v, 0 when v is
// empty. v is not modified.
func Percentile(v []int64, p float64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
