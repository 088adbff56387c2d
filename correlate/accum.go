package correlate

import (
	"sort"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

// Gradient accumulation: an iteration of the loop runs several
// micro-batches, each copying its batch and running a forward and a
// backward, then one optimizer step and one loss read. The batch copy
// clocks the micro-batches; the loop's iteration is a group of them. What
// tells the two apart is what comes once per group: the optimizer's
// kernels and the sync. The sync alone does not: a loop that reads its
// loss only every g-th iteration makes the same copies and syncs, and its
// iterations are the batch copy's steps. So the grouping is learnt only
// where launches are seen (full, and the windows of auto): the step of
// the group that holds its sync launches clearly more than the others.
// Lite, blind to launches, counts the batch copy's steps (the micro-batches)
// unless auto's windows learnt the grouping, which its lite stretches
// keep while the sync still comes once per group at the same place.
//
// A loop that reads its loss only at its logging steps (Hugging Face's
// Trainer: eight micro-batches, clipping and the optimizer, no sync, the
// loss read every fifth optimizer step) has no sync to mark the group:
// there the launches by position alone may (launchSlot), and the grouping
// is kept through auto's lite stretches and an evaluation that copies its
// batches as the training does (keepGroup, realign, clockTick).

const (
	// groupMax: the most clock steps one iteration is made of.
	groupMax = 16
	// groupMin: whole groups compared at least.
	groupMin = 4
)

// fineSeg is what one step of a clock held: its launches, its syncs, and
// whether every launch in it was seen.
type fineSeg struct {
	launches uint64
	// exact: the launches made in the step by position (token.pos),
	// where launches counts what was flushed in it.
	exact uint64
	syncs int
	seen  bool
}

// fineSegs cuts the ring into the clock's steps (key, m occurrences a
// step, starting at phase), oldest first: the first starts at the ring's
// first occurrence at phase.
func fineSegs(toks []stepclock.Token, key stepclock.Key, m, phase int) []fineSeg {
	var idx int64
	var segs []fineSeg
	var cur fineSeg
	var from uint64
	open := false
	for i := range toks {
		tk := &toks[i]
		if open {
			cur.launches += tk.Launches
			cur.syncs += tk.Syncs
			cur.seen = cur.seen && tk.Seen
		}
		if tk.Key != key {
			continue
		}
		idx++
		if int((idx-1)%int64(m)) != phase {
			continue
		}
		if open {
			cur.exact = tk.Pos - min(tk.Pos, from)
			segs = append(segs, cur)
		}
		cur, open, from = fineSeg{seen: true}, true, tk.Pos
	}
	return segs
}

// syncSlot is the position mod g of the step that holds the group's sync:
// in every group but one in five a sync comes in that step, and in the
// other steps nearly never. ok is false when no position does (syncs in
// every step, or none, or scattered). The steps before the group of the
// ring's first sync say nothing of where a group syncs (the ring may begin
// mid-group, the loop's first syncs may come late): they are left out,
// and groupMin groups are judged from that one on.
func syncSlot(segs []fineSeg, g int) (r int, ok bool) {
	lo := syncedFrom(segs, g)
	if len(segs)-lo < groupMin*g {
		return 0, false
	}
	n := make([]int, g)
	with := make([]int, g)
	for j := lo; j < len(segs); j++ {
		n[j%g]++
		if segs[j].syncs > 0 {
			with[j%g]++
		}
	}
	best := -1
	for k := 0; k < g; k++ {
		if float64(with[k]) >= stepclock.MatchMin*float64(n[k]) {
			if best >= 0 {
				return 0, false // two positions sync every time: not one per group
			}
			best = k
		}
	}
	if best < 0 {
		return 0, false
	}
	return best, syncsOnlyAt(with, n, best)
}

// syncsOnlyAt says whether no place of a group but r syncs in more than
// a fifth of its steps (with: the steps that synced at each place, n: the
// steps at each place).
func syncsOnlyAt(with, n []int, r int) bool {
	for k := range with {
		if k != r && float64(with[k]) > (1-stepclock.MatchMin)*float64(n[k]) {
			return false
		}
	}
	return true
}

// syncedFrom is the first step of the group that holds the ring's first
// sync, for a group of g steps ending with it at the latest.
func syncedFrom(segs []fineSeg, g int) int {
	for j := range segs {
		if segs[j].syncs > 0 {
			return max(0, j-g+1)
		}
	}
	return len(segs)
}

// groupLaunches says, from the steps where every launch was seen, whether
// the step holding the sync launches clearly more than the others (the
// optimizer's kernels), or (still) at least somewhat more; known: enough
// steps were seen to tell. Launches reach the tracer late, in batches
// (stepclock.LagFit), so a step's count swings by a third around its own: medians
// of a group that launches 40% more in its last step come out anywhere
// from equal to 60% apart, for several groups in a row. A grouping learnt
// is dropped only when its last step launches no more than the others for
// longer than that (groupMisses).
//
// Counted where they were flushed, the step holding the sync always
// launches more: the sync flushes the step's tail, which the next step's
// first launch would have flushed into that one. A loop on one thread
// that reads its loss every tenth iteration shows twice its launches in
// that step and next to none in the next. So the step must also launch
// more by position (fineSeg.exact): that lag is gone there, while the
// optimizer's kernels stay (on the H200, 300 against 282 by position for
// 359 against 270 by flush; positions are exact only for the thread that
// made the token's event, so a backward thread's lag shrinks the
// difference but does not make it).
func groupLaunches(segs []fineSeg, g, r int) (more, still, known bool) {
	var at, other, xat, xother []uint64
	for j := range segs {
		if !segs[j].seen {
			continue
		}
		if j%g == r {
			at = append(at, segs[j].launches)
			xat = append(xat, segs[j].exact)
		} else {
			other = append(other, segs[j].launches)
			xother = append(xother, segs[j].exact)
		}
	}
	if len(at) < groupMin || len(other) < groupMin*(g-1) {
		return false, false, false
	}
	med := func(v []uint64) float64 {
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		return float64(v[len(v)/2])
	}
	a, o := med(at), med(other)
	xa, xo := med(xat), med(xother)
	byPos := xa-xo > max(stepclock.LaunchJitter, exactMore*xo)
	return a > (1+stepclock.JitterRel)*o && a-o > stepclock.LaunchJitter && byPos, a-o > stepclock.LaunchJitter, true
}

// exactMore: how much more, by position, the step holding the sync must
// launch than the others to be an optimizer's (a fused AdamW with
// clip_grad_norm_ launched 18 kernels more than a 282-launch micro-batch
// on the H200).
const exactMore = 0.02

// accumGroup is a grouping learnt where launches were seen: g steps of
// the clock (key, m) make one iteration.
type accumGroup struct {
	key stepclock.Key
	m   int
	g   int
	// misses: checks in a row whose launches refuted the grouping; the
	// lag's swings refute it for a few groups at times (groupLaunches).
	misses int
	// byLaunch: launches alone showed the group (launchSlot), no sync.
	byLaunch bool
}

// groupMisses: refuting checks in a row, per step of a group, that drop
// a grouping learnt (checks come with every enqueued token).
const groupMisses = 2 * groupMin

// group coarsens a clock found to the loop's iterations where its steps
// are micro-batches of gradient accumulation: g of them to one sync, the
// one holding the sync launching clearly more than the others, as seen
// now or learnt in an earlier window while the sync still comes once per
// g steps at one place. Otherwise cf is returned as found, and a grouping
// that the launches now refute is forgotten. A marked function's steps
// are grouped by launches alone (launchSlot): the tracer marks the
// functions a micro-batch launches once where nothing rarer is launched
// often enough, and a loop's syncs say nothing of their group.
func (s *stepper) group(toks []stepclock.Token, cf stepclock.Found) stepclock.Found {
	if c := s.clock; s.mode == modeClock && c != nil && cf.Key != c.key && s.accum != nil && s.accum.key == c.key {
		// Another operation's grouping (a marked function's, where the
		// running clock is the batch copy's, or another marked one's)
		// is learnt aside: it must not replace the running clock's,
		// which keepGroup and the running clock's checks go on asking
		// for. It becomes the clock's own if that operation takes over.
		own := s.accum
		s.accum = s.rival
		f := s.groupOf(toks, cf)
		s.rival, s.accum = s.accum, own
		return f
	}
	return s.groupOf(toks, cf)
}

// groupOf is group for a clock found with no grouping of another
// operation's running clock to keep aside.
func (s *stepper) groupOf(toks []stepclock.Token, cf stepclock.Found) stepclock.Found {
	segs := fineSegs(toks, cf.Key, cf.M, cf.Phase)
	bySync := false
	for g := 2; g*cf.M <= groupMax && !bySync && !cf.Key.Marked(); g++ {
		_, bySync = syncSlot(segs, g)
	}
	for g := 2; g*cf.M <= groupMax; g++ {
		var r int
		var ok, more, still, known bool
		if bySync {
			if r, ok = syncSlot(segs, g); !ok {
				continue
			}
			more, still, known = groupLaunches(segs, g, r)
		} else {
			// No sync marks a group: the launches may.
			if r, ok = launchSlot(segs, g); !ok {
				continue
			}
			more, still, known = true, true, true
		}

		a := s.accum
		learnt := a != nil && a.key == cf.Key && a.m == cf.M && a.g == g
		switch {
		case known && more:
			s.accum = &accumGroup{key: cf.Key, m: cf.M, g: g, byLaunch: !bySync}
		case known && still && learnt:
			a.misses = 0
		case known && learnt && a.misses < groupMisses*g*cf.M:
			a.misses++
		case known:
			if a != nil && a.key == cf.Key && a.m == cf.M {
				s.accum = nil
			}
			return cf
		default:
			if !learnt {
				continue
			}
		}
		return coarsen(cf, segs, g, r, !bySync)
	}
	if f, ok := s.keepGroup(cf); ok {
		return f
	}
	return cf
}

// coarsen makes cf's clock one of g of its steps, starting at the step
// after the one at position r (mod g) that holds the sync.
//
// byPos: the group's launches are counted by position (launchSlot found
// it: the flushed counts of a loop that seldom syncs say nothing).
func coarsen(cf stepclock.Found, segs []fineSeg, g, r int, byPos bool) stepclock.Found {
	start := (r + 1) % g
	out := cf
	out.M = cf.M * g
	out.Phase = (cf.Phase + start*cf.M) % out.M
	out.SegLen = cf.SegLen * float64(g)
	var launches []uint64
	var syncs []int
	for j := start; j+g <= len(segs); j += g {
		var l uint64
		n := 0
		seen := true
		for k := j; k < j+g; k++ {
			if byPos {
				l += segs[k].exact
			} else {
				l += segs[k].launches
			}
			n += segs[k].syncs
			seen = seen && segs[k].seen
		}
		if seen {
			launches = append(launches, l)
		}
		syncs = append(syncs, n)
	}
	if len(launches) > 0 {
		sort.Slice(launches, func(a, b int) bool { return launches[a] < launches[b] })
		out.Launches = float64(launches[len(launches)/2])
	} else {
		out.Launches = cf.Launches * float64(g)
	}
	if len(syncs) > 0 {
		out.SyncCounts = syncs[max(0, len(syncs)-stepclock.SyncsRing):]
		sorted := append([]int(nil), syncs...)
		sort.Ints(sorted)
		out.MedSyncs = sorted[len(sorted)/2]
		out.SyncsPerStep = syncs[len(syncs)-1]
		out.SyncsVary = false
		for _, n := range syncs[1:] {
			if n != syncs[0] {
				out.SyncsVary = true
			}
		}
	}
	out.Work = cf.Work * float64(g)
	out.ByPosition = byPos
	return out
}

// mayGroup says whether cf's steps may still turn out to be micro-batches
// that the ring does not yet hold enough groups of to tell: launches are
// seen, syncs come in some steps and not in others, a second one may still
// come or they come evenly spaced, and the ring is not full yet.
func (s *stepper) mayGroup(toks []stepclock.Token, cf stepclock.Found) bool {
	other := 0
	for i := range toks {
		if !toks[i].Key.Marked() {
			other++
		}
	}
	if other >= stepclock.TokMax {
		return false
	}
	seen := false
	for i := range toks {
		seen = seen || toks[i].Seen
	}
	if !seen {
		return false
	}
	segs := fineSegs(toks, cf.Key, cf.M, cf.Phase)
	var at []int
	for j := range segs {
		if segs[j].syncs > 0 {
			at = append(at, j)
		}
	}
	switch {
	case len(at) == len(segs):
		return false
	case len(segs) < groupMin*groupMax/cf.M && launchHint(segs, groupMax/cf.M):
		// The launches begin to show a group that no sync marks: wait
		// until launchSlot can judge it.
		return true
	case !cf.Key.Marked() && len(segs) < 2*groupMax/cf.M && seenAll(segs):
		// Too few steps yet for the launches to show a group at all
		// (two of the largest): a loop that reads its loss every few
		// steps syncs once in a while whatever its grouping, and an
		// attach may come just before such a read.
		return true
	case len(at) == 0:
		return len(segs) < groupMax/cf.M
	case cf.Key.Marked():
		// A marked function's steps are grouped by launches alone
		// (group): a loop that reads its loss every few steps syncs
		// at no place of a group.
		return false
	case len(at) == 1:
		return len(segs)-1-at[0] < groupMax/cf.M
	}
	d := at[len(at)-1] - at[len(at)-2]
	for k := 1; k < len(at); k++ {
		if at[k]-at[k-1] != d {
			return false
		}
	}
	return d >= 2 && d*cf.M <= groupMax && len(segs)-syncedFrom(segs, d) < groupMin*d
}

// groupedBy says whether cf groups the running clock's steps into
// iterations: the same operation, a whole multiple of its occurrences.
func (c *clockState) groupedBy(cf stepclock.Found) bool {
	return cf.Key == c.key && cf.M > c.m && cf.M%c.m == 0
}

// seenAll says whether every launch of segs was seen.
func seenAll(segs []fineSeg) bool {
	for i := range segs {
		if !segs[i].seen {
			return false
		}
	}
	return len(segs) > 0
}
