package regress

import (
	"math"

	"github.com/gaptrace/gaptrace/correlate"
)

// Moments summarize one cause's per-step idle over a run: the steps, and
// the mean and standard deviation of the cause's idle per step in
// nanoseconds (steps without the cause count as 0). Enough for Welch's
// interval, and of a fixed size however long the run.
type Moments struct {
	Steps  int64   `json:"steps"`
	MeanNS float64 `json:"mean_ns"`
	SDNS   float64 `json:"sd_ns"`
}

func momentsOf(xs []float64) Moments {
	m, v := meanVar(xs)
	return Moments{Steps: int64(len(xs)), MeanNS: m, SDNS: math.Sqrt(v)}
}

// StepIdle is a correlate.Sink that keeps each cause's per-step idle
// moments (fixed windows are no steps and are left out): the summary file
// carries them as step_idle, so that two runs' summaries can be compared
// step by step.
type StepIdle struct {
	steps int64
	sum   map[string]float64
	sumSq map[string]float64
}

// Gap implements correlate.Sink: a step carries its gaps' idle by cause.
func (s *StepIdle) Gap(correlate.Gap) {}

// Step implements correlate.Sink.
func (s *StepIdle) Step(r correlate.StepResult) {
	st := r.Step
	if st.Window {
		return
	}
	if s.sum == nil {
		s.sum, s.sumSq = map[string]float64{}, map[string]float64{}
	}
	s.steps++
	total := 0.0
	for c, ns := range st.ByCause {
		x := float64(ns)
		s.sum[string(c)] += x
		s.sumSq[string(c)] += x * x
		total += x
	}
	s.sum[Total] += total
	s.sumSq[Total] += total * total
}

// Summary returns the moments by cause, Total included; nil before any
// step.
func (s *StepIdle) Summary() map[string]Moments {
	if s == nil || s.steps == 0 {
		return nil
	}
	n := float64(s.steps)
	out := make(map[string]Moments, len(s.sum))
	for c, sum := range s.sum {
		m := sum / n
		v := 0.0
		if n > 1 {
			v = math.Max(0, (s.sumSq[c]-sum*m)/(n-1))
		}
		out[c] = Moments{Steps: s.steps, MeanNS: m, SDNS: math.Sqrt(v)}
	}
	return out
}
