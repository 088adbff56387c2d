package correlate

import (
	"slices"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

// The running work clock: which operation it counts, how recent steps
// looked under it, and whether a pause of it is only an insertion.

// clockState is the clock a stepper counts steps by.
type clockState struct {
	key   stepclock.Key
	m     int   // occurrences per step
	phase int   // which occurrence (mod m) starts a step
	occ   int64 // occurrences numbered so far
	syncs int   // syncs since the step's clock operation (comm baselines)
	// recent: the syncs of the last steps; where most held the same
	// number, a sync's position in the step names it (comm baselines).
	recent  [stepclock.SyncsRing]int
	nrecent int
	// stopAfter: this many syncs without any clock-able operation mean
	// the loop stopped enqueuing it (an evaluation phase, a new loop).
	stopAfter int
	// The live segment since the last boundary token, and the previous one,
	// to notice when the pattern is lost.
	seg, prev stepclock.Seg
	havePrev  bool
	// launches: a step's launches (the median at detection); lag follows
	// how many of them reach the tracer in the next step.
	launches float64
	lag      stepclock.LagFit
	// byPos: launches and the steps' counts are by launch position
	// (stepclock.Found.ByPosition).
	byPos bool
	// occSyncs: syncs since the previous occurrence of key; all: occ
	// with the occurrences it did not count (byPos) included; lastAll:
	// all at its latest boundary, that one counted (0: none yet).
	occSyncs     int
	all, lastAll int64
	// lastAt: the previous boundary occurrence of the clock's operation;
	// deferred: where the step it closed ends, while a clock whose every
	// step syncs waits for the next occurrence to confirm it (a sync
	// between them): an evaluation's batches copy like the loop's batch
	// but do not sync each, so the first of them, which the loop's sync
	// precedes, ends no step (0: none waiting).
	lastAt   int64
	deferred int64
}

func (c *clockState) pushSyncs(n int) {
	c.recent[c.nrecent%stepclock.SyncsRing] = n
	c.nrecent++
}

// rarelySyncs says whether fewer than half of the recent steps (four at
// least) held a sync: a loop that reads its loss every N-th iteration.
func (c *clockState) rarelySyncs() bool {
	k := min(c.nrecent, stepclock.SyncsRing)
	if k < 4 {
		return false
	}
	n := 0
	for i := 0; i < k; i++ {
		if c.recent[i] > 0 {
			n++
		}
	}
	return 2*n < k
}

// alwaysSyncs says whether every recent step (four at least) held a sync.
func (c *clockState) alwaysSyncs() bool {
	k := min(c.nrecent, stepclock.SyncsRing)
	if k < 4 {
		return false
	}
	for i := 0; i < k; i++ {
		if c.recent[i] == 0 {
			return false
		}
	}
	return true
}

// syncIn says whether a sync returned in (lo, hi].
func (s *stepper) syncIn(lo, hi int64) bool {
	for i := range s.hist {
		if h := &s.hist[i]; h.End > lo && h.End <= hi {
			return true
		}
	}
	return false
}

// fixedSyncs says whether at least three quarters of the recent steps
// (four at least) held the same number of syncs.
func (c *clockState) fixedSyncs() bool {
	k := min(c.nrecent, stepclock.SyncsRing)
	if k < 4 {
		return false
	}
	best := 0
	for i := 0; i < k; i++ {
		n := 0
		for j := 0; j < k; j++ {
			if c.recent[j] == c.recent[i] {
				n++
			}
		}
		best = max(best, n)
	}
	return 4*best >= 3*k
}

// insertion says whether the running clock only paused for an insertion
// into its loop (an evaluation's batches every N steps, a burst of copies):
// it no longer qualifies because it has not occurred for a while (more
// than two of its steps), and that while is shorter than the time it ran
// for in the ring. A clock that still occurs but no longer qualifies (its
// steps stopped matching) gives way as before. The clock stays:
// when the loop resumes it goes on, where a switch would count the
// insertion's iterations as steps and then lose the loop's until it
// switched back. A loop that really moved on syncs without its clock and
// falls back to fixed windows (stopAfter), from which the new clock splits
// them, or its clock leaves the ring.
func insertion(toks []stepclock.Token, c *clockState, valid []stepclock.Found) bool {
	if c.occ < 4*stepclock.SegMin*int64(c.m) {
		return false // not established: a warm-up's burst gives way
	}
	for _, v := range valid {
		if v.Key == c.key {
			return false // it still repeats: a finer clock's turn
		}
	}
	var at []int64
	for i := range toks {
		if toks[i].Key == c.key {
			at = append(at, toks[i].T)
		}
	}
	if len(at) < 3 {
		return false
	}
	steps := make([]int64, 0, len(at)-1)
	for i := 1; i < len(at); i++ {
		steps = append(steps, at[i]-at[i-1])
	}
	slices.Sort(steps)
	silent := toks[len(toks)-1].T - at[len(at)-1]
	return silent > 2*int64(c.m)*steps[len(steps)/2] && silent < at[len(at)-1]-at[0]
}

// settledToks settles the tokens waiting for GPM (gpmVerdict) and returns
// the ring up to the first still waiting.
func (s *stepper) settledToks() []stepclock.Token {
	if len(s.toks) == 0 {
		return s.toks
	}
	last := s.toks[len(s.toks)-1].T
	n := len(s.toks)
	for i := range s.toks {
		tok := &s.toks[i]
		if !tok.GPMWait {
			continue
		}
		if quiet, done := s.gpmVerdict(tok.From, tok.T, last); done {
			tok.Quiet, tok.GPMWait = quiet, false
		} else if i < n {
			n = i
		}
	}
	return s.toks[:n]
}
