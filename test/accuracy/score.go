// Package accuracy measures how well gaptrace finds and explains GPU idle
// time, against the ground truth the simulated trainer writes.
//
// This file is the scoring library: it reads simtrain's truth file
// (CLOCK_MONOTONIC, converted once to Unix ns with the meta record's
// realtime_minus_monotonic_ns), gaptrace's gaps (--gaps-out) and step spans
// (--spans-out), and compares them as sets of time intervals. It has no
// dependency on the tracer and is unit-tested on hand-made truth and gap
// sets; accuracy_test.go runs the real tracer and applies it.
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
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
)

// Interval is a half-open time interval [Start, End) in Unix nanoseconds.
type Interval struct {
	Start int64 `json:"start_unix_nano"`
	End   int64 `json:"end_unix_nano"`
}

// Len is the interval's length, 0 when empty.
func (iv Interval) Len() int64 { return max(0, iv.End-iv.Start) }

// Set is a sorted list of disjoint, non-empty, non-touching intervals.
// Build one with NewSet; the operations below keep the invariant.
type Set []Interval

// NewSet normalizes arbitrary intervals: empty ones are dropped, the rest
// sorted and merged where they overlap or touch.
func NewSet(ivs ...Interval) Set {
	v := make([]Interval, 0, len(ivs))
	for _, iv := range ivs {
		if iv.End > iv.Start {
			v = append(v, iv)
		}
	}
	slices.SortFunc(v, func(a, b Interval) int { return cmp.Compare(a.Start, b.Start) })
	out := v[:0]
	for _, iv := range v {
		if n := len(out); n > 0 && iv.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, iv.End)
			continue
		}
		out = append(out, iv)
	}
	return Set(out)
}

// Total is the summed length of the set.
func (s Set) Total() int64 {
	var t int64
	for _, iv := range s {
		t += iv.Len()
	}
	return t
}

// Intersect returns a ∩ b.
func Intersect(a, b Set) Set {
	var out Set
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].Start, b[j].Start), min(a[i].End, b[j].End)
		if hi > lo {
			out = append(out, Interval{lo, hi})
		}
		if a[i].End < b[j].End {
			i++
		} else {
			j++
		}
	}
	return out
}

// Complement returns within \ s.
func Complement(s Set, within Interval) Set {
	var out Set
	cur := within.Start
	for _, iv := range s {
		if iv.End <= cur {
			continue
		}
		if iv.Start >= within.End {
			break
		}
		if iv.Start > cur {
			out = append(out, Interval{cur, iv.Start})
		}
		cur = max(cur, iv.End)
	}
	if cur < within.End {
		out = append(out, Interval{cur, within.End})
	}
	return out
}

// Clip returns s ∩ [within].
func (s Set) Clip(within Interval) Set { return Intersect(s, Set{within}) }

// Ratio is a fraction that knows when it is undefined (nothing to divide
// by): a scenario without true gaps has no recall, rather than a perfect one.
type Ratio struct {
	Num int64 `json:"num_ns"`
	Den int64 `json:"den_ns"`
}

// Defined reports whether the ratio has a denominator.
func (r Ratio) Defined() bool { return r.Den > 0 }

// Value is Num/Den, NaN when undefined.
func (r Ratio) Value() float64 {
	if r.Den <= 0 {
		return math.NaN()
	}
	return float64(r.Num) / float64(r.Den)
}

// String is the value with three decimals, "-" when undefined.
func (r Ratio) String() string {
	if !r.Defined() {
		return "-"
	}
	return fmt.Sprintf("%.3f", r.Value())
}

// MarshalJSON adds the value (null when undefined) to the parts.
func (r Ratio) MarshalJSON() ([]byte, error) {
	type parts Ratio
	v := struct {
		Value *float64 `json:"value"`
		parts
	}{parts: parts(r)}
	if r.Defined() {
		x := r.Value()
		v.Value = &x
	}
	return json.Marshal(v)
}

// Truth is what simtrain says happened, in Unix nanoseconds.
type Truth struct {
	PID    int
	Offset int64 // realtime - monotonic, ns
	Steps  []TruthStep
	Stalls []TruthStall
	// Busy holds the intervals during which the device was busy in
	// utilization terms (kernels and collectives).
	Busy Set
	// Ended is true when the file held its end record (a complete run).
	Ended bool
}

// TruthStep is one step: from just before its first launch to the return
// of its final sync.
type TruthStep struct {
	Number int64
	Interval
	// RunDelayNS is the feeder's run-queue wait during the step (the
	// machine's own load), from schedstat; 0 when not recorded.
	RunDelayNS int64
}

// TruthStall is one injected stall.
type TruthStall struct {
	Step  int64
	Cause string // as given to simtrain: io.read, loader.wait.io, ...
	Interval
	// Ahead is true for a CPU-ahead stall (inside its step, after the
	// launches, before the sync).
	Ahead bool
	// WorkerDid is "io" or "cpu" for loader stalls.
	WorkerDid string
	// RunDelayNS is the main thread's run-queue wait during the stall (the
	// machine's own CPU contention), from schedstat.
	RunDelayNS int64
	// Peer and ServerPID name a net stall's server (ServerPID 0 when it is
	// not simtrain's own log server).
	Peer      string
	ServerPID uint32
}

// contentionShare: a stall whose run-queue wait was at least this share of
// it was, by the truth's own measurement, as much cpu.contention as its
// injected cause (on a loaded machine a 30 ms busy loop can spend half its
// time preempted). Either cause is then right. Slightly under one half:
// schedstat is sampled around the stall, the tracer counts waits from its
// threshold up.
const contentionShare = 0.45

// Accepts reports whether a gap's dominant cause (refined by worker
// evidence) is a right explanation of stall s.
func (s TruthStall) Accepts(g correlate.Gap) bool {
	want, worker := ExpectedCause(s.Cause)
	if g.Cause == want && (worker == "" || ReportedCause(g) == "loader.wait."+worker) {
		return true
	}
	return g.Cause == correlate.CauseCPUContention && s.Len() > 0 &&
		float64(s.RunDelayNS) >= contentionShare*float64(s.Len())
}

// TracedFrom restricts the truth to what a tracer that attached at from
// (Unix ns) can be judged on: the steps that start after it, less the first
// of them, whose queue state the tracer could not know (the untraced
// launches before it), and the stalls inside the remaining range.
func (t *Truth) TracedFrom(from int64) {
	i := slices.IndexFunc(t.Steps, func(s TruthStep) bool { return s.Start >= from })
	if i < 0 {
		t.Steps, t.Stalls = nil, nil
		return
	}
	t.Steps = t.Steps[min(i+1, len(t.Steps)):]
	rng := t.Range()
	t.Stalls = slices.DeleteFunc(t.Stalls, func(s TruthStall) bool {
		return s.Start < rng.Start || s.End > rng.End
	})
}

// Until restricts the truth to the steps that ended by until (Unix ns; 0
// keeps everything) and the stalls inside them.
func (t *Truth) Until(until int64) {
	if until == 0 {
		return
	}
	t.Steps = slices.DeleteFunc(t.Steps, func(s TruthStep) bool { return s.End > until })
	rng := t.Range()
	t.Stalls = slices.DeleteFunc(t.Stalls, func(s TruthStall) bool {
		return s.Start < rng.Start || s.End > rng.End
	})
}

// Range is the scored range: first step start to last step end.
func (t *Truth) Range() Interval {
	if len(t.Steps) == 0 {
		return Interval{}
	}
	return Interval{t.Steps[0].Start, t.Steps[len(t.Steps)-1].End}
}

// Idle is the true GPU idle inside the scored range.
func (t *Truth) Idle() Set { return Complement(t.Busy, t.Range()) }

// ReadTruth parses a simtrain --truth file.
func ReadTruth(path string) (*Truth, error) {
	t := &Truth{}
	var busy []Interval
	meta := false
	err := readLines(path, func(line []byte) error {
		var r struct {
			Type      string `json:"type"`
			Offset    int64  `json:"realtime_minus_monotonic_ns"`
			PID       int    `json:"pid"`
			Step      int64  `json:"step"`
			Cause     string `json:"cause"`
			Start     int64  `json:"start"`
			End       int64  `json:"end"`
			Kind      string `json:"kind"`
			At        string `json:"at"`
			WorkerDid string `json:"worker_did"`
			RunDelay  int64  `json:"run_delay_ns"`
			Peer      string `json:"peer"`
			ServerPID uint32 `json:"server_pid"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			return err
		}
		if !meta && r.Type != "meta" {
			return fmt.Errorf("record of type %q before the meta record", r.Type)
		}
		iv := Interval{r.Start + t.Offset, r.End + t.Offset}
		switch r.Type {
		case "meta":
			meta = true
			t.PID, t.Offset = r.PID, r.Offset
		case "step":
			t.Steps = append(t.Steps, TruthStep{Number: r.Step, Interval: iv, RunDelayNS: r.RunDelay})
		case "stall":
			t.Stalls = append(t.Stalls, TruthStall{Step: r.Step, Cause: r.Cause, Interval: iv,
				Ahead: r.At == "ahead", WorkerDid: r.WorkerDid, RunDelayNS: r.RunDelay, Peer: r.Peer, ServerPID: r.ServerPID})
		case "busy":
			if r.Kind == "kernel" || r.Kind == "collective" {
				busy = append(busy, iv)
			}
		case "end":
			t.Ended = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read truth %s: %w", path, err)
	}
	if !meta {
		return nil, fmt.Errorf("read truth %s: no meta record", path)
	}
	slices.SortFunc(t.Steps, func(a, b TruthStep) int { return cmp.Compare(a.Number, b.Number) })
	slices.SortFunc(t.Stalls, func(a, b TruthStall) int { return cmp.Compare(a.Start, b.Start) })
	t.Busy = NewSet(busy...)
	return t, nil
}

// ReadGaps parses a --gaps-out file.
func ReadGaps(path string) ([]correlate.Gap, error) {
	var gaps []correlate.Gap
	err := readLines(path, func(line []byte) error {
		var g correlate.Gap
		if err := json.Unmarshal(line, &g); err != nil {
			return err
		}
		gaps = append(gaps, g)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read gaps %s: %w", path, err)
	}
	return gaps, nil
}

// StepSpan is one train.step span of the spans file.
type StepSpan struct {
	PID       int64
	Number    int64
	Interval        // the span's own start and end
	IdleNS    int64 // gpu.step.idle_ms
	BoundedNS int64 // gpu.step.bounded_idle_ms
	MicroNS   int64 // gpu.step.micro_idle_ms
	StallNS   int64 // gpu.step.stall_ms
	Window    bool  // a fixed window, not a detected step
}

// StepCountResult compares how many steps gaptrace counted with how many
// the trainer ran over the same time.
type StepCountResult struct {
	True    int `json:"true"`
	Counted int `json:"counted"`
	Windows int `json:"windows"` // of Counted, fixed windows
}

// SignedErr is (counted - true) / true.
func (c *StepCountResult) SignedErr() float64 {
	if c.True == 0 {
		return 0
	}
	return float64(c.Counted-c.True) / float64(c.True)
}

// RelErr is |SignedErr|, and 1 when nothing was counted against a truth.
func (c *StepCountResult) RelErr() float64 {
	if c.True == 0 {
		return 0
	}
	return math.Abs(c.SignedErr())
}

// CountSteps counts pid's train.step spans that end within the truth's
// steps (from the first's start to the last's end): gaptrace ends a step
// at the return of its last sync, the trainer once it has returned, so a
// margin far shorter than a step covers the difference. The margin is a
// quarter of the median step, not of the mean: a loop whose steps are
// 1 ms apart but for the one that syncs for 110 ms every tenth would let
// three short steps past the range into a quarter of its mean.
func CountSteps(tr *Truth, spans []StepSpan, pid int) *StepCountResult {
	r := &StepCountResult{True: len(tr.Steps)}
	if len(tr.Steps) == 0 {
		return r
	}
	lo, hi := tr.Steps[0].Start, tr.Steps[len(tr.Steps)-1].End
	d := make([]int64, len(tr.Steps))
	for i, st := range tr.Steps {
		d[i] = st.End - st.Start
	}
	slices.Sort(d)
	margin := d[len(d)/2] / 4
	for _, sp := range spans {
		if sp.PID != int64(pid) || sp.End <= lo || sp.End > hi+margin {
			continue
		}
		r.Counted++
		if sp.Window {
			r.Windows++
		}
	}
	return r
}

// ReadStepSpans returns the train.step spans of a --spans-out file, in
// start order.
func ReadStepSpans(path string) ([]StepSpan, error) {
	return readStepSpans(path, func(name string) bool { return name == "train.step" })
}

// ReadRankSpans returns the "rank N" spans of a --spans-out file, in start
// order: a sidecar that traces rank N > 0 of a job hangs its steps under
// the trace rank 0's sidecar roots, and emits no train.step of its own.
func ReadRankSpans(path string) ([]StepSpan, error) {
	return readStepSpans(path, func(name string) bool { return strings.HasPrefix(name, "rank ") })
}

func readStepSpans(path string, want func(name string) bool) ([]StepSpan, error) {
	var out []StepSpan
	err := readLines(path, func(line []byte) error {
		var sp struct {
			Name  string         `json:"name"`
			Start int64          `json:"start_unix_nano"`
			End   int64          `json:"end_unix_nano"`
			Attrs map[string]any `json:"attributes"`
		}
		if err := json.Unmarshal(line, &sp); err != nil {
			return err
		}
		if !want(sp.Name) {
			return nil
		}
		num := func(k string) (float64, error) {
			v, ok := sp.Attrs[k].(float64)
			if !ok {
				return 0, fmt.Errorf("%s span without numeric %s", sp.Name, k)
			}
			return v, nil
		}
		ms := func(k string) (int64, error) {
			v, err := num(k)
			return int64(math.Round(v * 1e6)), err
		}
		s := StepSpan{Interval: Interval{sp.Start, sp.End}}
		var errs [6]error
		var n, pid float64
		n, errs[0] = num("gpu.step.number")
		s.IdleNS, errs[1] = ms("gpu.step.idle_ms")
		s.BoundedNS, errs[2] = ms("gpu.step.bounded_idle_ms")
		s.MicroNS, errs[3] = ms("gpu.step.micro_idle_ms")
		s.StallNS, errs[4] = ms("gpu.step.stall_ms")
		pid, errs[5] = num("process.pid")
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		s.Number, s.PID = int64(n), int64(pid)
		s.Window, _ = sp.Attrs["gpu.step.window"].(bool)
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read spans %s: %w", path, err)
	}
	slices.SortFunc(out, func(a, b StepSpan) int { return cmp.Compare(a.Start, b.Start) })
	return out, nil
}

func readLines(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}

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

// StepIdleResult compares gaptrace's per-step idle with the truth's.
type StepIdleResult struct {
	Steps   int `json:"steps"`   // train.step spans of the traced process
	Matched int `json:"matched"` // of them, matched to a truth step
	// RelErr per matched step: |reported - true| / true.
	MedianRelErr float64 `json:"median_rel_err"`
	P90RelErr    float64 `json:"p90_rel_err"`
	TrueNS       int64   `json:"true_ns"`
	ReportedNS   int64   `json:"reported_ns"`
	// TotalRelErr is |ΣReported - ΣTrue| / ΣTrue over the matched steps.
	TotalRelErr float64 `json:"total_rel_err"`
	// Offset is the most common gaptrace number - truth number.
	Offset int64 `json:"number_offset"`
	// Preempted matched steps are left out of the relative errors: the
	// feeder waited for a CPU for at least preemptedShare of them, so the
	// machine's load decided where their idle fell, finer than the GPU's
	// windows (100-200 ms, a dozen steps) can place it. Their idle still
	// counts in the totals.
	Preempted int `json:"preempted"`
}

// preemptedShare: a step whose feeder spent this share of it waiting for a
// CPU is judged in the totals only (StepIdleResult.Preempted).
const preemptedShare = 0.05

// StepIdle matches gaptrace's steps of pid to truth steps by time overlap
// and compares their idle. A truth step is taken sync to sync, from the
// previous step's final sync to its own (the first from its first launch):
// gaptrace delimits steps by syncs, and whatever simtrain did before a
// step's first launch is part of that interval. A gaptrace step matches the
// truth step that overlaps it most, if that covers at least half of both;
// each truth step matches once.
func StepIdle(tr *Truth, steps []StepSpan, pid int) *StepIdleResult {
	res := &StepIdleResult{}
	type tstep struct {
		iv   Interval
		num  int64
		used bool
	}
	ts := make([]tstep, len(tr.Steps))
	for i, s := range tr.Steps {
		iv := s.Interval
		if i > 0 {
			iv.Start = tr.Steps[i-1].End
		}
		ts[i] = tstep{iv: iv, num: s.Number}
	}
	var errs []float64
	offsets := map[int64]int{}
	for _, sp := range steps {
		if sp.PID != int64(pid) {
			continue
		}
		res.Steps++
		best, bestNS := -1, int64(0)
		for i := range ts {
			if ov := min(ts[i].iv.End, sp.End) - max(ts[i].iv.Start, sp.Start); ov > bestNS && !ts[i].used {
				best, bestNS = i, ov
			}
		}
		if best < 0 || bestNS*2 < sp.Len() || bestNS*2 < ts[best].iv.Len() {
			continue
		}
		ts[best].used = true
		trueNS := Complement(tr.Busy, ts[best].iv).Total()
		if trueNS <= 0 {
			continue
		}
		res.Matched++
		offsets[sp.Number-ts[best].num]++
		res.TrueNS += trueNS
		res.ReportedNS += sp.IdleNS
		if float64(tr.Steps[best].RunDelayNS) >= preemptedShare*float64(ts[best].iv.Len()) {
			res.Preempted++
			continue
		}
		errs = append(errs, math.Abs(float64(sp.IdleNS-trueNS))/float64(trueNS))
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		res.MedianRelErr = errs[(len(errs)-1)/2]
		res.P90RelErr = errs[min(len(errs)-1, int(math.Ceil(0.9*float64(len(errs))))-1)]
		res.TotalRelErr = math.Abs(float64(res.ReportedNS-res.TrueNS)) / float64(res.TrueNS)
	}
	for off, n := range offsets {
		if n > offsets[res.Offset] || (n == offsets[res.Offset] && off < res.Offset) {
			res.Offset = off
		}
	}
	return res
}
