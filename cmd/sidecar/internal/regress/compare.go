package regress

import (
	"encoding/json"
	"math"
	"sort"
)

// Row compares one cause's per-step idle between two runs, in ms per step.
type Row struct {
	Cause string `json:"cause"`
	// Means with their 95% confidence intervals.
	Base   Interval `json:"base_ms_per_step"`
	New    Interval `json:"new_ms_per_step"`
	Change Interval `json:"change_ms_per_step"`
	// ChangePct is the change over the base mean, in percent; +Inf when
	// the cause was absent before.
	ChangePct float64 `json:"change_pct"`
	// LowPct is the low end of the change's interval over the base mean:
	// the growth the data supports at 95% confidence.
	LowPct float64 `json:"change_low_pct"`
}

// Interval is a mean and its 95% confidence interval.
type Interval struct {
	Mean float64 `json:"mean"`
	Lo   float64 `json:"lo"`
	Hi   float64 `json:"hi"`
}

// meanVar returns the mean and the unbiased variance.
func meanVar(xs []float64) (float64, float64) {
	n := float64(len(xs))
	if n == 0 {
		return 0, 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	m := s / n
	if n < 2 {
		return m, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return m, ss / (n - 1)
}

// tQuantile975 is Student's t 97.5% quantile for df degrees of freedom
// (Cornish-Fisher expansion about the normal; within 0.5% for df >= 3).
func tQuantile975(df float64) float64 {
	const z = 1.959963984540054
	if math.IsInf(df, 1) || df > 1e7 {
		return z
	}
	if df < 1 {
		df = 1
	}
	z3, z5, z7 := z*z*z, math.Pow(z, 5), math.Pow(z, 7)
	return z + (z3+z)/(4*df) + (5*z5+16*z3+3*z)/(96*df*df) +
		(3*z7+19*z5+17*z3-15*z)/(384*df*df*df)
}

func meanCI(x Moments) Interval {
	m, v, n := x.MeanNS, x.SDNS*x.SDNS, float64(x.Steps)
	if n < 2 {
		return Interval{m, m, m}
	}
	// Idle time is never negative, nor is its mean.
	h := tQuantile975(n-1) * math.Sqrt(v/n)
	return Interval{m, math.Max(0, m-h), m + h}
}

// welch is the 95% interval of mean(b) - mean(a) by Welch's t.
func welch(a, b Moments) Interval {
	ma, va, na := a.MeanNS, a.SDNS*a.SDNS, float64(a.Steps)
	mb, vb, nb := b.MeanNS, b.SDNS*b.SDNS, float64(b.Steps)
	d := mb - ma
	sa, sb := va/na, vb/nb
	se2 := sa + sb
	if se2 == 0 {
		return Interval{d, d, d}
	}
	df := se2 * se2 / (sa*sa/math.Max(na-1, 1) + sb*sb/math.Max(nb-1, 1))
	h := tQuantile975(df) * math.Sqrt(se2)
	return Interval{d, d - h, d + h}
}

func scale(iv Interval, f float64) Interval { return Interval{iv.Mean * f, iv.Lo * f, iv.Hi * f} }

// Compare returns a row per cause either run has (Total last), in ms per
// step.
func Compare(base, cur Run) []Row {
	causes := map[string]bool{}
	for c := range base.ByCause {
		causes[c] = true
	}
	for c := range cur.ByCause {
		causes[c] = true
	}
	var names []string
	for c := range causes {
		if c != Total {
			names = append(names, c)
		}
	}
	sort.Strings(names)
	names = append(names, Total)
	zeros := func(r Run, c string) Moments {
		if m, ok := r.ByCause[c]; ok {
			return m
		}
		return Moments{Steps: int64(r.Steps)}
	}
	rows := make([]Row, 0, len(names))
	for _, c := range names {
		a, b := zeros(base, c), zeros(cur, c)
		row := Row{Cause: c, Base: scale(meanCI(a), 1e-6), New: scale(meanCI(b), 1e-6), Change: scale(welch(a, b), 1e-6)}
		switch {
		case row.Base.Mean > 0:
			row.ChangePct = 100 * row.Change.Mean / row.Base.Mean
			row.LowPct = 100 * row.Change.Lo / row.Base.Mean
		case row.Change.Mean > 0:
			row.ChangePct = math.Inf(1)
			if row.Change.Lo > 0 {
				row.LowPct = math.Inf(1)
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// Grew reports whether the row's cause grew by more than pct percent of
// its base at 95% confidence, and by at least minMS ms per step (so that
// a cause of a few microseconds cannot fail a build by doubling).
func (r Row) Grew(pct, minMS float64) bool {
	return r.Change.Lo > minMS && r.LowPct > pct
}

// MarshalJSON writes an infinite change (a cause absent before) as null.
func (r Row) MarshalJSON() ([]byte, error) {
	type plain Row
	finite := func(f float64) *float64 {
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil
		}
		return &f
	}
	return json.Marshal(struct {
		plain
		ChangePct *float64 `json:"change_pct"`
		LowPct    *float64 `json:"change_low_pct"`
	}{plain(r), finite(r.ChangePct), finite(r.LowPct)})
}
