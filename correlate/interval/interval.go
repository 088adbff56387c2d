// Package interval holds sorted lists of disjoint half-open intervals of
// Unix ns: adding one merges what it overlaps, and a list answers how much
// of an interval it covers.
//
// # Rule
//
// Pure functions over values the caller owns; no state, only the standard
// library. The engine keeps such lists per device (gaps and stalls
// decided, window idle) and per process.
package interval

import "sort"

// Span is a half-open interval [A,B) of Unix ns.
type Span struct{ A, B int64 }

// Add inserts s into the sorted, disjoint list l, merging overlaps.
func Add(l []Span, s Span) []Span {
	if s.B <= s.A {
		return l
	}
	i := sort.Search(len(l), func(i int) bool { return l[i].B >= s.A })
	j := i
	for j < len(l) && l[j].A <= s.B {
		s.A = min(s.A, l[j].A)
		s.B = max(s.B, l[j].B)
		j++
	}
	if j == i {
		l = append(l, Span{})
		copy(l[i+1:], l[i:])
		l[i] = s
		return l
	}
	l[i] = s
	return append(l[:i+1], l[j:]...)
}

// Overlap is how much of [a,b) the sorted disjoint list l covers.
func Overlap(l []Span, a, b int64) int64 {
	var n int64
	i := sort.Search(len(l), func(i int) bool { return l[i].B > a })
	for ; i < len(l) && l[i].A < b; i++ {
		n += min(b, l[i].B) - max(a, l[i].A)
	}
	return n
}

// Trim drops the spans that end before keep.
func Trim(l []Span, keep int64) []Span {
	k := 0
	for k < len(l) && l[k].B < keep {
		k++
	}
	if k == 0 {
		return l
	}
	n := copy(l, l[k:])
	return l[:n]
}

// Clip returns the part of the sorted list l that overlaps [a,b) (spans
// are not cut: Overlap clips them anyway).
func Clip(l []Span, a, b int64) []Span {
	i := sort.Search(len(l), func(i int) bool { return l[i].B > a })
	j := i
	for j < len(l) && l[j].A < b {
		j++
	}
	return l[i:j]
}

// Merge unions two sorted disjoint lists into a new one.
func Merge(x, y []Span) []Span { return MergeAppend(make([]Span, 0, len(x)+len(y)), x, y) }

// MergeAppend is Merge appending to dst[:0] (a caller's scratch, which
// must not share memory with x or y).
func MergeAppend(dst, x, y []Span) []Span {
	out := dst[:0]
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		var s Span
		if j >= len(y) || (i < len(x) && x[i].A <= y[j].A) {
			s = x[i]
			i++
		} else {
			s = y[j]
			j++
		}
		if n := len(out); n > 0 && s.A <= out[n-1].B {
			out[n-1].B = max(out[n-1].B, s.B)
			continue
		}
		out = append(out, s)
	}
	return out
}
