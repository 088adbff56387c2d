package correlate

import (
	"math"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

// Giving steps back: the steps a weaker clock laid before a call site was
// found, where the site shows they were micro-batches of its iterations,
// are laid again by its calls while nothing refers to them yet.

// giveBack takes back the steps the work pattern (or another call site)
// laid over the site's calls in the stream (ends) where they cut each of
// its iterations into the same number of steps, two or more:
// micro-batches, which the batch copy's clock or the micro-batch read's
// site counted until the optimizer step's site was known. Only
// steps that nothing refers to yet go: not emitted (still pending), no
// gap delivered with their number, no fixed window. The earliest of them
// is open again from its start, and the site's calls end it and the
// steps after it (enterSite). Where the stream still holds the process's
// first calls, the steps before the site's first call are its first
// iteration's, unless they cut it more often than the site's iterations
// are cut. Steps numbered by collectives (anchor) keep their numbers.
func (s *stepper) giveBack(ends []int64) {
	n := len(s.steps)
	if n < 2 || s.steps[n-1].closed || s.steps[n-1].Gaps > 0 {
		return
	}
	varied := stepclock.Varied(s.sites.items, s.sites.key, s.sites.tid)
	first := ends[0]
	if !s.sites.trimmed {
		first = s.origin
	}
	j, ok := s.giveFrom(first, ends, varied)
	if !ok && first != ends[0] {
		// The stream holds the process's first calls, but the steps
		// before the site's first call cut it more often than the site's
		// iterations are cut: more than one iteration went by there,
		// their site calls unseen (attached mid-run, stacks not captured
		// yet). Those steps stay as laid; the ones from the site's first
		// call on are judged alone.
		j, ok = s.giveFrom(ends[0], ends, varied)
	}
	if !ok {
		return
	}
	o := s.steps[j]
	o.End, o.closed, o.ClockSource, o.ClockSite = 0, false, "", ""
	for i := j + 1; i < n; i++ {
		s.steps[i] = nil
	}
	s.steps = s.steps[:j+1]
	s.next = o.Number + 1
}

// giveFrom is the first of the latest steps that end after first and may
// be given back (givable sources, no fixed window, no gap delivered to
// the step after it), and whether their ends subdivide the site's
// iterations (ends).
func (s *stepper) giveFrom(first int64, ends []int64, varied bool) (int, bool) {
	n := len(s.steps)
	j := n - 1
	for j > 0 {
		p := s.steps[j-1]
		if p.End <= first || p.Window || !givable(p.ClockSource) || s.steps[j].Gaps > 0 {
			break
		}
		j--
	}
	cuts := make([]int64, 0, n-1-j)
	for _, st := range s.steps[j : n-1] {
		cuts = append(cuts, st.End)
	}
	return j, subdivides(s.steps[j].Start, cuts, ends, varied)
}

// givable says whether steps ended by source may be laid again by a
// call site: the work pattern's, or another call site's (the
// micro-batch read's, picked before the launches showed the grouping);
// never a declared site's or a framework marker's.
func givable(source string) bool {
	return source == stepclock.SourceWork || source == stepclock.SourceCallSite
}

// subdivides says whether the step ends cuts (ascending, of steps from
// from on) fall g times, g >= 2 the same throughout, into each interval
// between consecutive site calls (ends) that they span, and at most g
// times into those that begin before from (the process's first, or one
// whose first steps were emitted already). Where the site's iterations
// hold a varying number of micro-batches (varied), each interval holds
// one cut at least and some two or more, and g is the most.
func subdivides(from int64, cuts, ends []int64, varied bool) bool {
	if len(cuts) == 0 {
		return false
	}
	k, g, whole, most := 0, 0, 0, 0
	var partial []int
	prev := int64(math.MinInt64)
	for _, e := range ends {
		if e > cuts[len(cuts)-1] {
			break
		}
		m := 0
		for k < len(cuts) && cuts[k] <= e {
			m++
			k++
		}
		switch {
		case prev < from:
			partial = append(partial, m)
		case varied:
			if m == 0 {
				return false
			}
			g, most = 1, max(most, m)
			whole++
		case g == 0:
			g = m
			fallthrough
		default:
			if m != g {
				return false
			}
			whole++
		}
		prev = e
	}
	if varied {
		g = most
	}
	if whole == 0 || g < 2 {
		return false
	}
	for _, m := range partial {
		if m > g {
			return false
		}
	}
	return true
}
