package accuracy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

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
