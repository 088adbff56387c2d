package stepclock

import (
	"slices"
	"strconv"
)

// Gradient accumulation seen from the call sites: a site that reads each
// micro-batch's loss (microBatches tells it by the launches between its
// calls) never clocks; the site called once after each group of its
// calls, the optimizer step's, does (encloses).

// MicroSites lists the sites in items (as "TID|KEY") whose calls read
// each micro-batch's loss, as the launches between them show
// (microBatches): a stepper keeps them off the step clock once known,
// through stretches where launches are not seen (auto's lite ones).
func MicroSites(items []Item) []string { return Score(items).MicroSites() }

// MicroSites is the package's MicroSites over the scored stream.
func (sc *Scored) MicroSites() []string {
	var out []string
	for _, c := range sc.cands {
		if c.micro > 0 {
			out = append(out, SiteID(c.tid, c.site.Key))
		}
	}
	return out
}

// SiteID names a site on a thread, as MicroSites lists it.
func SiteID(tid uint32, key string) string {
	return strconv.FormatUint(uint64(tid), 10) + "|" + key
}

// encloses rescores c as the optimizer step of b's micro-batches where
// most of c's intervals hold exactly b.micro calls of b: the g
// micro-batches' tokens then come g times (their batch copies), which is
// one iteration, not a site read every g-th iteration (that one encloses
// no site that microBatches tells by the optimizer's launches).
func encloses(items []Item, c, b *siteCand) {
	good := 0
	var work []uint64
	var seen tally
	callsBetween(c.at, b.at, func(j, n int) {
		span := items[c.at[j-1]+1 : c.at[j]+1]
		if n == b.micro && oneIteration(span, c.tid, b.micro*SiteRepeat, &seen) {
			good++
			if l := threadLaunches(span, c.tid); l > 0 {
				work = append(work, l)
			}
		}
	})
	if good > c.good {
		// An optimizer step's iteration launches all its micro-batches.
		c.good, c.groups, c.work = good, good, work
	}
}

// microBatches is g where the launches between a site's calls show
// gradient accumulation: most g-th intervals (g from 2 to 8) launch more
// than most others (the optimizer step), over three groups at least; 0
// otherwise. Such a site reads each micro-batch's loss; a step
// is one optimizer step, which the site called once a group (encloses)
// or the work pattern groups (lite, blind to launches, cannot tell).
func microBatches(l []uint64) int {
	if len(l) < 6 {
		return 0
	}
	// One buffer for every (g, phase): a new one each time was a quarter
	// of all the sidecar allocated on a job of 8 ranks.
	rest := make([]uint64, 0, len(l))
	// Most loops launch about as much in every interval: then no phase
	// can hold an interval heavier than its rest's median, which is at
	// least the sorted l's floor(len/2)/2-th (a rest keeps half of l at
	// least, and dropping values only raises an order statistic).
	rest = append(rest, l...)
	slices.Sort(rest)
	if low := rest[len(l)/2/2]; low > 0 && rest[len(rest)-1] <= low+low/10 {
		return 0
	}
	for g := 2; g <= 8; g++ {
		if len(l) < 3*g {
			break
		}
		for ph := 0; ph < g; ph++ {
			rest = rest[:0]
			for i, n := range l {
				if i%g != ph {
					rest = append(rest, n)
				}
			}
			slices.Sort(rest)
			med := rest[len(rest)/2]
			if med == 0 {
				continue
			}
			// Most of the phase's intervals launch more than most
			// others: a stall, an evaluation or a lost launch count in
			// a few of them does not hide the optimizer's launches.
			// And most others launch alike: the micro-batches repeat one
			// forward and backward, where the iterations of a loop whose
			// data picks its work (2 to 6 micro-batches an optimizer
			// step) launch more and less than their median by chance,
			// and some phase of some g showed "heavy" groups in 1 attach
			// of 3 (its site then never clocked).
			heavy, over, under := 0, 0, 0
			for i, n := range l {
				switch {
				case n > med+med/10 && i%g == ph:
					heavy++
				case n > med+med/10:
					over++
				case n+med/10 < med && i%g != ph:
					under++
				}
			}
			groups := (len(l) - ph + g - 1) / g
			if float64(heavy) >= SiteGood*float64(groups) && float64(over+under) <= (1-SiteGood)*float64(len(rest)) {
				return g
			}
		}
	}
	return 0
}
