package accuracy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
)

// Time intervals, sets of them, and the ratios the scores are.

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
