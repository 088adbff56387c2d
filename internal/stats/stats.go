// Package stats holds the few statistics gaptrace's schedule and its
// benchmark share.
package stats

import "slices"

// Median of v (v is not modified); 0 for an empty slice. NaN-free input is
// assumed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// MedianInPlace is Median without the copy: it sorts v.
func MedianInPlace(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
