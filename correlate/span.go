package correlate

import "sort"

// span is a half-open interval [a,b) of Unix ns.
type span struct{ a, b int64 }

// addSpan inserts s into the sorted, disjoint list l, merging overlaps.
func addSpan(l []span, s span) []span {
	if s.b <= s.a {
		return l
	}
	i := sort.Search(len(l), func(i int) bool { return l[i].b >= s.a })
	j := i
	for j < len(l) && l[j].a <= s.b {
		s.a = min(s.a, l[j].a)
		s.b = max(s.b, l[j].b)
		j++
	}
	if j == i {
		l = append(l, span{})
		copy(l[i+1:], l[i:])
		l[i] = s
		return l
	}
	l[i] = s
	return append(l[:i+1], l[j:]...)
}

// overlapLen is how much of [a,b) the sorted disjoint list l covers.
func overlapLen(l []span, a, b int64) int64 {
	var n int64
	i := sort.Search(len(l), func(i int) bool { return l[i].b > a })
	for ; i < len(l) && l[i].a < b; i++ {
		n += min(b, l[i].b) - max(a, l[i].a)
	}
	return n
}

func trimSpans(l []span, keep int64) []span {
	k := 0
	for k < len(l) && l[k].b < keep {
		k++
	}
	if k == 0 {
		return l
	}
	n := copy(l, l[k:])
	return l[:n]
}

// clip returns the part of the sorted list l that overlaps [a,b) (spans
// are not cut: overlapLen clips them anyway).
func clip(l []span, a, b int64) []span {
	i := sort.Search(len(l), func(i int) bool { return l[i].b > a })
	j := i
	for j < len(l) && l[j].a < b {
		j++
	}
	return l[i:j]
}

// mergeSpans unions two sorted disjoint lists into a new one.
func mergeSpans(x, y []span) []span {
	out := make([]span, 0, len(x)+len(y))
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		var s span
		if j >= len(y) || (i < len(x) && x[i].a <= y[j].a) {
			s = x[i]
			i++
		} else {
			s = y[j]
			j++
		}
		if n := len(out); n > 0 && s.a <= out[n-1].b {
			out[n-1].b = max(out[n-1].b, s.b)
			continue
		}
		out = append(out, s)
	}
	return out
}
