package main

import (
	"math/rand/v2"
	"slices"

	"github.com/gaptrace/gaptrace/internal/stats"
)

// Interval is a statistic with its bootstrap confidence interval.
type Interval struct {
	Value, Lo, Hi float64
}

// BootstrapMedian is the median of v with a percentile bootstrap interval
// at level conf (0.95: the 2.5th and 97.5th percentiles of the medians of
// resamples of v). seed makes it repeatable.
func BootstrapMedian(v []float64, resamples int, conf float64, seed uint64) Interval {
	if len(v) == 0 {
		return Interval{}
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	meds := make([]float64, resamples)
	buf := make([]float64, len(v))
	for i := range meds {
		for j := range buf {
			buf[j] = v[r.IntN(len(v))]
		}
		meds[i] = stats.Median(buf)
	}
	slices.Sort(meds)
	alpha := (1 - conf) / 2
	return Interval{Value: stats.Median(v), Lo: quantile(meds, alpha), Hi: quantile(meds, 1-alpha)}
}

// quantile of sorted s by linear interpolation between order statistics.
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	f := pos - float64(i)
	return s[i]*(1-f) + s[i+1]*f
}
