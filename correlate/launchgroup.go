package correlate

import (
	"slices"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

// Gradient accumulation that no sync marks (accum.go): a loop that reads
// its loss only at its logging steps lets the host run ahead through
// several optimizer steps, and the launches by position alone show the
// group (launchSlot). Such a grouping is kept where launches are not seen
// and over finer clocks of its operation (keepGroup), realigned when the
// heavier step shows its place moved (realign), refuted by launches
// alone (tryClock), and a call site called more often than its steps does
// not take them (withinGroup). A marked function's steps are grouped so
// too (a hand-written update has no optimizer marker), and the batch
// copy's clock keeps the steps against them while the loop still copies
// (keepOverMarks).

// launchSlot is the position mod g of the step that launches the
// optimizer's kernels where no sync tells the group: a loop that reads its
// loss only at its logging steps (Hugging Face's Trainer, every few
// optimizer steps) lets the host run ahead through several groups, and
// syncs in one group of several or in none the ring holds. Launches by
// position decide (fineSeg.exact: the flush lag is gone there, and a loop
// that syncs rarely flushes rarely): in nearly every group the step at r
// launches clearly more than the others, and the others launch alike (an
// accumulation's micro-batches repeat one forward and backward). Syncs
// may come at r (the logging step's read), seldom elsewhere (an
// evaluation's batches in the ring); a loop that syncs in every step
// reads each iteration's loss and groups nothing here. Only steps whose
// every launch was seen count: lite and auto's lite stretches tell
// nothing, and keep a grouping learnt (keepGroup).
func launchSlot(segs []fineSeg, g int) (int, bool) { return launchSlotOver(segs, g, groupMin) }

// launchSlotOver is launchSlot judged over groups whole groups at least.
func launchSlotOver(segs []fineSeg, g, groups int) (int, bool) {
	// The latest groups only: an insertion of the same operation (an
	// evaluation's batches) shifts the group's place among the
	// occurrences, and the groups before it say nothing of the place now.
	from := max(0, len(segs)-groupTail*g)
	from -= from % g
	// The whole groups after the latest insertion only.
	if c := afterInsertion(segs); c > from {
		from = c + (g-c%g)%g
	}
	if from >= len(segs) {
		return 0, false
	}
	segs = segs[from:]
	n := make([]int, g)
	with := make([]int, g)
	seen := 0
	for j := range segs {
		n[j%g]++
		if segs[j].syncs > 0 {
			with[j%g]++
		}
		if segs[j].seen {
			seen++
		}
	}
	if seen < groups*g {
		return 0, false
	}
	syncing := 0 // places that sync in more than a fifth of their steps
	for k := range g {
		if float64(with[k]) > (1-stepclock.MatchMin)*float64(n[k]) {
			syncing++
		}
	}
	if syncing > 1 {
		return 0, false // only the group's place may sync
	}
	best := -1
	at, other := make([]uint64, 0, seen), make([]uint64, 0, seen)
	for r := 0; r < g; r++ {
		at, other = at[:0], other[:0]
		for j := range segs {
			if !segs[j].seen {
				continue
			}
			if j%g == r {
				at = append(at, segs[j].exact)
			} else {
				other = append(other, segs[j].exact)
			}
		}
		if len(at) < groups || len(other) < groups*(g-1) {
			continue
		}
		slices.Sort(other)
		lo := other[len(other)/2]
		if lo == 0 {
			continue // the steps between launch nothing: no micro-batches
		}
		// The micro-batches' spread: the optimizer's step must launch
		// more than nearly all of them, not only more than their median
		// (a backward thread's lag moves a micro-batch's count by as
		// much as the optimizer adds).
		top := other[min(len(other)-1, int(groupShare*float64(len(other))))]
		alike := uint64(max(float64(stepclock.LaunchJitter), groupAlike*float64(lo)))
		more := uint64(max(float64(stepclock.LaunchJitter), exactMore*float64(lo)))
		nAlike := 0
		for _, x := range other {
			if x+alike >= lo && x <= lo+alike {
				nAlike++
			}
		}
		nMore := 0
		for _, x := range at {
			if x > top+more {
				nMore++
			}
		}
		if float64(nAlike) < groupShare*float64(len(other)) || float64(nMore) < groupShare*float64(len(at)) {
			continue
		}
		if best >= 0 {
			return 0, false // two positions heavier: not one optimizer step a group
		}
		best = r
	}
	if best < 0 {
		return 0, false
	}
	return best, syncsOnlyAt(with, n, best)
}

// afterInsertion is where segs stop holding the latest run of steps that
// sync one after another: an insertion of the clock's operation (an
// evaluation's batches, each read back), 0 where none. A loop that syncs
// only at its group's place never syncs in two steps in a row, and one
// that syncs in every step groups nothing.
func afterInsertion(segs []fineSeg) int {
	for j := len(segs) - 1; j > 0; j-- {
		if segs[j].syncs > 0 && segs[j-1].syncs > 0 {
			return j + 1
		}
	}
	return 0
}

// groupShare: the share of a position's steps that must show what
// launchSlot asks; groupAlike: how far (relative) the micro-batches'
// launches may stray from their median.
// groupTail: the latest groups launchSlot judges.
const (
	groupShare = 0.9
	groupAlike = 0.1
	groupTail  = 2 * groupMin
)

// launchHint says whether the seen steps so far show what launchSlot
// asks of a group of up to gmax steps, over two groups: one that no sync
// marks may be coming.
func launchHint(segs []fineSeg, gmax int) bool {
	for g := 2; g <= gmax; g++ {
		if _, ok := launchSlotOver(segs, g, 2); ok {
			return true
		}
	}
	return false
}

// launchGrouped says whether the running clock is a grouping that
// launches showed without a sync (launchSlot).
func (s *stepper) launchGrouped() bool {
	a, c := s.accum, s.clock
	return a != nil && a.byLaunch && c != nil && s.mode == modeClock && c.key == a.key && c.m == a.m*a.g
}

// keepGroup is the running clock where it is a grouping that launches
// showed without a sync (launchSlot) and cf is its ungrouped clock: the
// ring cannot tell the group now (lite, an auto's lite stretch, or an
// insertion of the same operation, an evaluation's batches, that moved
// the positions), and nothing refutes it (a clearly different clock
// replaces it in tryClock, and a lost step pattern forgets it). f's
// phase is the running clock's, as the ring counts it.
func (s *stepper) keepGroup(cf stepclock.Found) (stepclock.Found, bool) {
	if !s.groupsClock(cf) {
		return cf, false
	}
	c := s.clock
	// cf may count finer than the grouping learnt (one of the batch's
	// two copies, where an evaluation copied one tensor of each batch
	// and shifted the pairs): the group is still c.m occurrences.
	g := float64(c.m / cf.M)
	f := cf
	f.M = c.m
	f.Phase = s.ringPhase()
	f.SegLen = cf.SegLen * g
	f.Launches, f.ByPosition = c.launches, c.byPos
	f.Work = cf.Work * g
	return f, true
}

// groupsClock says whether the running clock is a launch-learnt
// grouping of f's clock: the same operation, a whole multiple of its
// occurrences a step.
func (s *stepper) groupsClock(f stepclock.Found) bool {
	c := s.clock
	return s.launchGrouped() && c.key == f.Key && f.M <= c.m && c.m%f.M == 0
}

// ringPhase is the running clock's phase counted as Detect counts it:
// from the ring's first occurrence of its operation, where the clock
// counts from its own first.
//
// The clock skips occurrences that a byPos grouping calls an insertion's
// (clockTick), Detect counts every one: the phase is measured from the
// latest boundary, counted among all occurrences since the clock began.
func (s *stepper) ringPhase() int {
	c := s.clock
	n := int64(0)
	for i := range s.toks {
		if s.toks[i].Key == c.key {
			n++
		}
	}
	m := int64(c.m)
	if c.lastAll == 0 {
		// No boundary yet: the clock's own count.
		first := c.occ - n // the clock's count at the ring's first occurrence
		return int(((int64(c.phase)-first)%m + m) % m)
	}
	first := c.all - n // the ring's first occurrence, among all
	// lastAll counts the boundary itself; the ring's phase counts
	// from 0 at its first occurrence.
	return int(((c.lastAll-1-first)%m + m) % m)
}

// realign moves the running clock's phase to the one f found in the
// ring, where the clock is a grouping launches showed (launchSlot): an
// insertion of the clock's operation (an evaluation's batches copied as
// the training's are) shifts the group's place among the occurrences,
// and the heavier step shows the new place once the ring holds enough
// groups after it. The step open now ends at the new place. A place
// within one step of the finer clock moves nothing: the finer clock's
// phase (which of a batch's two copies starts a micro-batch, alike in
// launches) is found either way from check to check.
func (s *stepper) realign(f stepclock.Found) {
	a, c := s.accum, s.clock
	if a == nil || !a.byLaunch || c == nil || f.Key != c.key || f.M != c.m {
		return
	}
	if p := s.ringPhase(); p != f.Phase {
		m := int64(c.m)
		d := ((int64(f.Phase-p))%m + m) % m
		if d%int64(a.m) != 0 {
			return
		}
		c.phase = int((int64(c.phase) + d) % m)
		// The ring's phase counts from the latest boundary: move it
		// too, or the next check, before the clock passes the new
		// place, finds the same difference and moves the phase again.
		if c.lastAll != 0 {
			c.lastAll += d
		}
	}
}

// withinGroup says whether the running clock is a grouping that launches
// showed without a sync (accum.go, launchSlot) and p's calls come more
// often than its steps do: most intervals between them hold fewer of the
// clock's operations than one step holds (one batch copy where a step of
// eight micro-batches holds eight). Such a site reads a micro-batch's or
// an evaluation batch's result; it ends no step of the loop.
func (s *stepper) withinGroup(p stepclock.Pick) bool {
	if !s.launchGrouped() {
		return false
	}
	c := s.clock
	items := s.sites.items
	n, fewer, open := 0, 0, false
	ops := 0
	for i := range items {
		it := &items[i]
		if it.Site.Key == "" {
			if it.Key == c.key {
				ops++
			}
			continue
		}
		if it.Site.Key != p.Site.Key || it.TID != p.TID {
			continue
		}
		if open {
			n++
			if ops < c.m {
				fewer++
			}
		}
		open, ops = true, 0
	}
	return n > 0 && 2*fewer > n
}

// occursLate says whether k occurs in the latter half of toks: the loop
// still enqueues it.
func occursLate(toks []stepclock.Token, k stepclock.Key) bool {
	for i := len(toks) / 2; i < len(toks); i++ {
		if toks[i].Key == k {
			return true
		}
	}
	return false
}

// keepOverMarks says whether the running clock, a copy's or a
// collective's, keeps the steps against cf, a marked function's clock,
// while its own operation still occurs: a copy or collective that clocks
// the loop wins over marked launches (stepclock's pick), and an insertion
// of its operation (an evaluation's batches) that disqualifies it for a
// check or two hands the steps to no function's launches.
func (s *stepper) keepOverMarks(toks []stepclock.Token, cf stepclock.Found) bool {
	c := s.clock
	return s.mode == modeClock && c != nil && !c.key.Marked() && cf.Key.Marked() && occursLate(toks, c.key)
}
