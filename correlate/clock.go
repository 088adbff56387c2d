package correlate

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gaptrace/gaptrace/event"
)

// The work clock: a training loop enqueues the same data movement every
// iteration (the batch's copies, the gradients' all-reduces) and the same
// number of kernels, while host code adds synchronisations at will (a
// scalar read, a loss check, logging every so often, a checkpoint's
// per-tensor copies). Steps are counted by an enqueued operation that
// occurs a fixed number of times per step, between two of which everything
// else enqueued repeats; the step still ends at a sync. Where such an
// operation exists it wins over the sync period, which serves loops that
// enqueue nothing it can use.

const (
	tokMax = 256 // enqueue tokens remembered for clock detection
	// scalarBytes: copies and memsets this small are host code reading or
	// setting scalars, which it does at will; they neither clock steps nor
	// make two steps differ.
	scalarBytes = 4096
	clockMaxM   = 4 // most occurrences of the clock per step considered
	clockSegMin = 4 // segments compared at least before a clock is trusted
	clockKeys   = 16
	// clockEvery: tokens between detection attempts.
	clockEvery = 4
	// clockJitterRel: launch counts of two steps this close are the same
	// step (data-dependent control flow). Launches reach the tracer late
	// besides, in per-thread batches flushed at the thread's next CUDA
	// call: lagFit follows what that moves from one step to the next.
	clockJitterRel = 0.3
	// clockRecheck: tokens between checks that a running clock still
	// qualifies.
	clockRecheck = 16
)

// tokKey identifies an enqueued operation across steps. A copy's
// direction is part of it: a checkpoint's device-to-host copy of a tensor
// the size of the batch is not the batch's copy to the device.
type tokKey struct {
	kind   event.Kind
	dir    event.CUDA
	stream uint64
	bytes  uint64
	op     event.NCCLOp
	comm   uint64
	// fn: a marked launch's function (event.Event.Mark), 0 for copies,
	// memsets and collectives.
	fn uint64
}

// markRarer: how many times more rarely than a marked function another
// may be launched and still count in its steps' operations (rarerMarks):
// a layer's function launched four times an iteration is judged with the
// iteration's once-launched ones, a loop's once-launched function without
// a metric computed every fifth iteration;
// markMatch: the share of its steps that must match (matchMin for other
// operations).
// markWait: marked launches the ring holds at least before the sync
// period may lock while no step is decided: enough for a clock of
// clockMaxM occurrences a step to show 2*clockSegMin steps and the first.
const (
	markRarer = 4.5
	markMatch = 0.9
	markWait  = (2*clockSegMin + 2) * clockMaxM
)

// awaitMarks says whether marked launches have begun to arrive but are
// still too few for detectClock to judge them; the sync period waits for
// them (full probes), since the clock they make lays its steps over the
// ring, while the sync period's steps could not be taken back.
func (s *stepper) awaitMarks() bool {
	n := 0
	for i := range s.toks {
		if s.toks[i].key.marked() {
			n++
		}
	}
	return n > 0 && n < markWait
}

// marked says whether the operation is a marked launch. The tracer marks
// a few functions of each rarity it finds (tracer/marks.go), among them
// functions a loop launches every tenth iteration or once per checkpoint:
// such launches may clock steps, but like scalar reads they come as host
// code chooses, so they never make two steps differ.
func (k tokKey) marked() bool { return k.fn != 0 }

// token is one enqueued operation that can clock steps.
type token struct {
	key      tokKey
	t        int64
	launches uint64 // kernels launched since the previous token
	syncs    int    // syncs since the previous token
	// seen: every launch since the previous token was seen (full, or a
	// window of auto), so launches == 0 means none ran.
	seen bool
	// mlaunches (marked launches only): the process's kernels launched
	// since the previous marked launch, exactly: what its threads
	// flushed and what they reported unflushed (Event.Pending). A marked
	// launch amid a burst flushes nothing, so launches, counted at
	// flushes, may lag by a step; a clock on marked launches compares
	// steps by these.
	mlaunches uint64
	// pos: the process's launch position at the token, what its threads
	// flushed and reported unflushed; the difference between two tokens'
	// is the launches made between them, where launches counts what was
	// flushed between them (a sync flushes the step's tail early, which
	// the next step's first launch would have flushed).
	pos uint64
	// occ: for a collective on a communicator seen from its creation, how
	// many like it the communicator issued before; -1 otherwise.
	occ int64
	// from is the previous token's time. quiet: launches unseen, GPM read
	// no SM activity on the device from then to this one; gpmWait: its
	// verdict is not in yet (askGPM).
	from           int64
	quiet, gpmWait bool
}

// idle says whether the token is known to follow no compute: no launch
// since the previous token, all launches seen, and no collective itself;
// or, launches unseen, GPM saw no compute on the device meanwhile.
func (t *token) idle() bool {
	if t.key.marked() {
		return false // a launch itself
	}
	return t.key.kind != event.KindCollective && (t.quiet || t.seen && t.launches == 0)
}

// clockState is the clock a stepper counts steps by.
type clockState struct {
	key   tokKey
	m     int   // occurrences per step
	phase int   // which occurrence (mod m) starts a step
	occ   int64 // occurrences numbered so far
	syncs int   // syncs since the step's clock operation (comm baselines)
	// recent: the syncs of the last steps; where most held the same
	// number, a sync's position in the step names it (comm baselines).
	recent  [syncsRing]int
	nrecent int
	// stopAfter: this many syncs without any clock-able operation mean
	// the loop stopped enqueuing it (an evaluation phase, a new loop).
	stopAfter int
	// The live segment since the last boundary token, and the previous one,
	// to notice when the pattern is lost.
	seg, prev segFeat
	havePrev  bool
	// launches: a step's launches (the median at detection); lag follows
	// how many of them reach the tracer in the next step.
	launches float64
	lag      lagFit
	// lastAt: the previous boundary occurrence of the clock's operation;
	// deferred: where the step it closed ends, while a clock whose every
	// step syncs waits for the next occurrence to confirm it (a sync
	// between them): an evaluation's batches copy like the loop's batch
	// but do not sync each, so the first of them, which the loop's sync
	// precedes, ends no step (0: none waiting).
	lastAt   int64
	deferred int64
}

// flushDeferred places the boundary the clock still held back: the loop
// ended, or the clock is being replaced.
func (s *stepper) flushDeferred() {
	if c := s.clock; c != nil && c.deferred != 0 {
		d := c.deferred
		c.deferred = 0
		s.boundary(d, false)
	}
}

// segFeat is what one step enqueued, for comparing steps.
type segFeat struct {
	launches uint64
	counts   map[tokKey]int
	syncs    int
}

// sameOps says whether two steps enqueued the same operations.
func (a *segFeat) sameOps(b *segFeat) bool {
	if len(a.counts) != len(b.counts) {
		return false
	}
	for k, n := range a.counts {
		if b.counts[k] != n {
			return false
		}
	}
	return true
}

// lagFit says whether a sequence of steps' launch counts is that of steps
// of ref launches each, given that launches reach the tracer late: the
// BPF side emits the first launch after a blocking call as an event and
// counts the rest, flushing the count at the thread's next sync or at its
// first launch after its next blocking call. A step's launches after the
// last such point before its closing operation (a copy or collective,
// which flush nothing) are counted in the next step: on a busy host,
// where a preemption mid-step re-arms the event, a step of 8 counts 15
// and the next 1. The lag, launches of a step counted in the next, lies
// between none and all of a step's; lagFit keeps the lags consistent with
// every count so far and refuses a count that none makes fit. A count
// that is simply wrong (alternating 100 and 20 for a median of 100) runs
// the lag out of that range within a step or two.
type lagFit struct {
	lo, hi float64
	set    bool
}

func (f *lagFit) reset() { f.set = false }

// fit takes a step's launch count n; it reports whether n is a step of ref
// launches give or take what the neighbouring steps lent and borrowed.
func (f *lagFit) fit(n uint64, ref float64) bool {
	if !f.set {
		// The lag before the first step is unknown.
		f.lo, f.hi, f.set = 0, ref, true
	}
	tol := max(launchJitter, clockJitterRel*ref)
	lo, hi := f.lo+ref-float64(n), f.hi+ref-float64(n)
	if hi < -tol || lo > ref+tol {
		f.lo, f.hi = 0, ref
		return false
	}
	// Jitter of the step's own count is absorbed here, not accumulated:
	// the lag stays within a step's launches.
	f.lo, f.hi = min(max(lo, 0), ref), max(min(hi, ref), 0)
	return true
}

func launchesClose(x, y uint64) bool {
	if x < y {
		x, y = y, x
	}
	return x-y <= launchJitter || float64(x-y) <= clockJitterRel*float64(x)
}

// tokenOf is the clock token of an enqueue, if it can be one.
func tokenOf(ev *event.Event) (tokKey, bool) {
	switch ev.Kind {
	case event.KindMemcpyAsync, event.KindMemset, event.KindMemcpy:
		if ev.Bytes <= scalarBytes {
			return tokKey{}, false
		}
		return tokKey{kind: ev.Kind, dir: ev.CopyDir, stream: ev.Stream, bytes: ev.Bytes}, true
	case event.KindCollective:
		return tokKey{kind: ev.Kind, stream: ev.Stream, bytes: ev.Bytes, op: ev.Op, comm: ev.Comm}, true
	case event.KindEnqueue:
		if ev.Mark != 0 {
			return tokKey{kind: ev.Kind, stream: ev.Stream, fn: ev.Mark}, true
		}
	}
	return tokKey{}, false
}

// clockFound is a detected clock and how steps look under it.
type clockFound struct {
	key      tokKey
	m, phase int
	segLen   float64 // tokens per step
	// span: time per step, to compare a marked launch's clock with a
	// copy's (stepLens).
	span         float64
	syncsVary    bool    // the syncs per step differ between steps
	syncsPerStep int     // when they do not
	launches     float64 // a step's launches (median), where seen
	occ          int64   // occurrences of key in the ring, numbered from 0
	// work is the median work of a step (launches where they are seen,
	// else its duration); concentrated: the median step holds far less
	// than the mean (the work happens in a few of them).
	work         float64
	concentrated bool
	medSyncs     int // median syncs per step
	// unproven: no sync came between its first and last occurrence, and
	// they span less time than the ring held before the first.
	unproven   bool
	syncCounts []int // syncs of the last steps, oldest first
}

// syncsRing: steps whose sync counts say whether positions name syncs.
const syncsRing = 8

func (c *clockState) pushSyncs(n int) {
	c.recent[c.nrecent%syncsRing] = n
	c.nrecent++
}

// rarelySyncs says whether fewer than half of the recent steps (four at
// least) held a sync: a loop that reads its loss every N-th iteration.
func (c *clockState) rarelySyncs() bool {
	k := min(c.nrecent, syncsRing)
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
	k := min(c.nrecent, syncsRing)
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
		if h := &s.hist[i]; h.end > lo && h.end <= hi {
			return true
		}
	}
	return false
}

// fixedSyncs says whether at least three quarters of the recent steps
// (four at least) held the same number of syncs.
func (c *clockState) fixedSyncs() bool {
	k := min(c.nrecent, syncsRing)
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

// detectClock finds the loop's clock in the token ring: an operation that
// occurs a fixed number of times per step with the same work between. Of
// the operations that qualify, three rules pick the one that counts loop
// iterations rather than a slice of one or a burst inside one:
//   - it still occurs: not long ago in tokens (a checkpoint's copies
//     repeat among themselves but only within their burst) nor in syncs
//     (an evaluation phase enqueues other work);
//   - its steps share the work: a per-parameter copy of the optimizer
//     repeats with identical (empty) segments between, but the forward
//     and backward all fall into one segment of every dozen; where a
//     coarser clock qualifies too, a finer one whose median step holds
//     less than half its share of the coarser one's (a quarter in time:
//     stalls lengthen the coarser steps) is a slice of it, and
//     a clock whose median step holds under a quarter of the mean is one
//     on its own (work is launches where they are seen, else time: lite
//     would otherwise lock onto the optimizer's copies during warm-up,
//     before the batch copy has repeated often enough to compare). While
//     the ring still holds the run's first token (fromStart), the first
//     step is left out of the mean: the loop's first iteration does
//     one-off work (compiling, autotuning, allocating) however long, which
//     says nothing of where the loop's work recurs, and would make the
//     loop's own clock look concentrated for as many steps as the first
//     iteration is longer than the others;
//   - while nothing is decided yet (needSync: no period, no clock, gaps
//     held), it is proven: a sync came between its first and last
//     occurrence, or they span at least the time the ring held before the
//     first. Operations that repeat alike before the loop's first sync may
//     be a burst inside the first iteration (the backward's per-layer
//     copies, after the forward and its compiling), which shows once the
//     iteration's sync falls into one of their steps and makes it the one
//     holding the work; the operation that starts every iteration, the
//     first of the loop, has no such stretch of work before it, so that a
//     loop that never syncs is clocked from its first iterations. Waiting
//     loses no step (the clock lays its steps over the ring when found);
//   - of the rest, the finest wins (a checkpoint or an evaluation every N
//     steps makes a coarser period that also repeats).
func detectClock(toks []token, syncsSince int, launchesSeen, needSync, fromStart bool, posts func(lo, hi int64) int64) (best clockFound, valid []clockFound) {
	occ := map[tokKey][]int{}
	var keys []tokKey
	var launches uint64
	// Prefix sums over the ring make every segment's content O(1): the
	// operations it holds as a sum of per-operation hashes (a multiset),
	// its launches and its syncs.
	n := len(toks)
	ph := make([]uint64, n+1)
	pl := make([]uint64, n+1)
	pm := make([]uint64, n+1) // marked launches' exact counts
	ps := make([]int, n+1)
	pi := make([]int, n+1) // tokens known to follow no compute
	for i := range toks {
		k := toks[i].key
		if _, ok := occ[k]; !ok {
			keys = append(keys, k)
		}
		occ[k] = append(occ[k], i)
		launches += toks[i].launches
		ph[i+1] = ph[i]
		if !k.marked() {
			ph[i+1] += k.hash()
		}
		pl[i+1] = pl[i] + toks[i].launches
		pm[i+1] = pm[i] + toks[i].mlaunches
		ps[i+1] = ps[i] + toks[i].syncs
		pi[i+1] = pi[i]
		if toks[i].idle() {
			pi[i+1]++
		}
	}
	opsOf, launchOf := ph, pl
	segOf := func(a, b int) segSum { // tokens a+1..b
		return segSum{ops: opsOf[b+1] - opsOf[a+1], launches: launchOf[b+1] - launchOf[a+1], syncs: ps[b+1] - ps[a+1], dur: toks[b].t - toks[a].t}
	}
	useLaunches := launchesSeen && launches > 0
	// The most frequent operations first: a run's start (loading weights,
	// capturing a graph) enqueues many one-off sizes.
	sort.SliceStable(keys, func(i, j int) bool { return len(occ[keys[i]]) > len(occ[keys[j]]) })
	if len(keys) > clockKeys {
		keys = keys[:clockKeys]
	}
	var cands []clockFound
	for _, k := range keys {
		o := occ[k]
		opsOf, launchOf = ph, pl
		if k.marked() {
			launchOf = pm
			// A marked function's steps hold the other marked functions
			// launched as rarely or more rarely than it: a function the
			// loop launches three times an iteration repeats with the same
			// launches between, but the rarer ones (the iteration's last
			// kernel) fall into one of its three segments. Until those
			// have repeated as often as a clock must, it is not judged.
			var wait bool
			if opsOf, wait = rarerMarks(toks, occ, k); wait {
				continue
			}

		}
		unit := make([]segSum, max(len(o)-1, 0)) // the segments between consecutive occurrences
		for i := range unit {
			unit[i] = segOf(o[i], o[i+1])
		}
		segMin, minMatch := clockSegMin, matchMin
		if k.marked() {
			// A function launched at several places of an iteration
			// repeats alike at all but the one before the iteration's
			// rarer launches (three of four, for a layer's function): a
			// few segments may all miss that one, and four in five
			// matching is no proof. Insertions of host code's choice
			// launch more rarely than markRarer allows for.
			segMin, minMatch = 2*clockSegMin, markMatch
		}
		for m := 1; m <= clockMaxM; m++ {
			nseg := (len(o) - 1) / m
			if nseg < segMin {
				break
			}
			if m > 1 && !phasesDiffer(unit, m, launchesSeen) {
				// The occurrences are alike: m of them per step is only
				// a coarsening of a clock that does not match yet.
				continue
			}
			if m == 1 && !launchesSeen && slicedByTime(unit) {
				// Without launches a step's two copies (the batch's, then
				// into a graph's input) hold the same operations between
				// them as the step does: the host time between them says
				// they are slices of one step.
				continue
			}
			feats := make([]segSum, nseg)
			work := make([]float64, nseg)
			var workSum float64
			nwork := nseg
			idleSegs := 0
			for s := 0; s < nseg; s++ {
				a, b := o[s*m], o[(s+1)*m]
				f := segOf(a, b)
				feats[s] = f
				if pi[b+1]-pi[a+1] == b-a {
					idleSegs++
				}
				if k.marked() && pm[b+1]-pm[a+1] <= uint64(b-a) {
					// Nothing launched between but marked launches
					// themselves: one function launched back to back
					// (initialising each parameter, an optimizer's
					// first step creating its state) is a burst.
					idleSegs++
				}
				if useLaunches {
					work[s] = float64(f.launches)
				} else {
					work[s] = float64(toks[o[(s+1)*m]].t - toks[o[s*m]].t)
				}
				if s == 0 && fromStart {
					// The run's first iteration: one-off work.
					nwork--
					continue
				}
				workSum += work[s]
			}
			syncSame := 0
			for s := 1; s < nseg; s++ {
				if feats[s].syncs == feats[s-1].syncs {
					syncSame++
				}
			}
			match, ref := modalMatch(feats, launchesSeen)
			if float64(match) < minMatch*float64(nseg) {
				continue
			}
			segLen := float64(o[nseg*m]-o[0]) / float64(nseg)
			span := float64(toks[o[nseg*m]].t-toks[o[0]].t) / float64(nseg)
			ns := make([]int, nseg)
			for i := range feats {
				ns[i] = feats[i].syncs
			}
			sort.Ints(ns)
			// Tokens since the last occurrence against tokens per step
			// as the ring holds them now: the median of the last steps,
			// where more than over the ring. Marked launches may begin
			// to arrive after the copies did, and the ring keeps older
			// copies longer than marked launches (trimToks). Where the
			// marks arrive only now, or the loop's data picks how many
			// kernels (each a marked launch) a step runs, a step may
			// hold many more tokens than those before it: it stopped
			// only if as long in time, against the longest of the steps
			// but one in ten.
			stepToks, after := segLen, len(toks)-1-o[len(o)-1]
			durs := make([]int64, nseg)
			for s := range durs {
				durs[s] = toks[o[(s+1)*m]].t - toks[o[s*m]].t
			}
			slices.Sort(durs)
			longAgo := toks[len(toks)-1].t-toks[o[len(o)-1]].t > 2*durs[(nseg-1)*9/10]
			if nseg >= 3 {
				last := []int{o[nseg*m] - o[(nseg-1)*m], o[(nseg-1)*m] - o[(nseg-2)*m], o[(nseg-2)*m] - o[(nseg-3)*m]}
				sort.Ints(last)
				stepToks = max(stepToks, float64(last[1]))
			}
			if after > int(2*stepToks)+2 && longAgo || syncsSince > 4*max(ns[nseg/2], 1)+4 {
				// It stopped: a burst (a warm-up's, a checkpoint's), or
				// the loop moved on to work without it.
				continue
			}
			sort.Float64s(work)
			med := work[nseg/2]
			if 2*idleSegs > nseg {
				// Every iteration launches kernels (a graph replay counts)
				// or issues collectives: copies known to have none between
				// them are a burst inside one (a warm-up's, a
				// checkpoint's) or no loop at all (a model's setup copying
				// its parameters, before any kernel ran). Likewise a
				// marked function whose steps hold no launch but marked
				// ones: an iteration runs more than its rarest kernels.
				continue
			}
			cands = append(cands, clockFound{key: k, m: m, segLen: segLen, span: span, launches: ref,
				syncsVary:    syncSame < nseg-1,
				syncsPerStep: feats[nseg-1].syncs, occ: int64(len(o)),
				unproven: ps[o[len(o)-1]+1]-ps[o[0]+1] == 0 && toks[o[len(o)-1]].t-toks[o[0]].t < toks[o[0]].t-toks[0].t,
				work:     med, concentrated: med < workSum/float64(nwork)/4, medSyncs: ns[nseg/2], syncCounts: segSyncs(feats[max(0, nseg-syncsRing):]),
				phase: clockPhase(toks, o, m, posts)})
			break
		}
	}
	// Where work is time, a coarser clock's steps also hold the stalls of
	// the iterations in them (a checkpoint every dozen, a lock, a huge
	// copy every ten), which may well be most of the time: a finer clock
	// is a slice only when its median step holds next to none of it.
	sliceShare := 0.5
	if !useLaunches {
		sliceShare = 0.25
	}
	found, unmarked := false, false
	for i := range cands {
		f := &cands[i]
		if f.concentrated || needSync && f.unproven {
			continue
		}
		slice := false
		for j := range cands {
			c := &cands[j]
			fl, cl := stepLens(f, c)
			if cl >= 1.5*fl && !c.concentrated && f.work < sliceShare*c.work*fl/cl {
				slice = true
				break
			}
		}
		if slice {
			continue
		}
		valid = append(valid, *f)
		// A copy or collective that clocks the loop wins over marked
		// launches: it is the loop's own data movement, while the marks
		// are the functions the tracer found rarest.
		if found && unmarked && f.key.marked() {
			continue
		}
		// At equal step length the one that occurs once per step, whose
		// occurrence needs no phase.
		if !found || !f.key.marked() && !unmarked || f.segLen < best.segLen*0.99 || (f.segLen <= best.segLen*1.01 && f.m < best.m) {
			best, found = *f, true
			unmarked = unmarked || !f.key.marked()
		}
	}
	return best, valid
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
func insertion(toks []token, c *clockState, valid []clockFound) bool {
	if c.occ < 4*clockSegMin*int64(c.m) {
		return false // not established: a warm-up's burst gives way
	}
	for _, v := range valid {
		if v.key == c.key {
			return false // it still repeats: a finer clock's turn
		}
	}
	var at []int64
	for i := range toks {
		if toks[i].key == c.key {
			at = append(at, toks[i].t)
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
	silent := toks[len(toks)-1].t - at[len(at)-1]
	return silent > 2*int64(c.m)*steps[len(steps)/2] && silent < at[len(at)-1]-at[0]
}

// stepLens are f's and g's step lengths in a unit both are measured in:
// tokens, or time where one is a marked launch's clock and the other not
// (the ring keeps marked launches at their own density).
func stepLens(f, g *clockFound) (float64, float64) {
	if f.key.marked() != g.key.marked() {
		return f.span, g.span
	}
	return f.segLen, g.segLen
}

// rarerMarks is the prefix sum of operation hashes over toks that counts
// the operations that are not marked launches, and the marked launches
// that occur as often as k or up to markRarer times more rarely between
// k's first and last occurrence (occ: each key's positions). Rarer still
// is host code's choice (a metric computed every tenth iteration, an
// evaluation), which makes steps no more different than a scalar read
// does. A function first launched after 2*markRarer of k's occurrences is
// left out: the tracer may mark one later, and the steps before it would
// differ from those after. wait: a rarer one counted has not repeated
// often enough to tell whether k's steps are slices of its own.
func rarerMarks(toks []token, occ map[tokKey][]int, k tokKey) (ph []uint64, wait bool) {
	o := occ[k]
	lo, hi := o[0], o[len(o)-1]
	n := len(o) - 1
	rarer := map[tokKey]bool{k: true}
	for j, oj := range occ {
		if !j.marked() || j == k || float64(sort.SearchInts(o, oj[0])) > 2*markRarer {
			continue
		}
		c := 0
		for _, i := range oj {
			if i > lo && i <= hi {
				c++
			}
		}
		if float64(c) <= 1.1*float64(n) && float64(c)*markRarer >= float64(n) {
			rarer[j] = true
		}
		// A function launched as often or up to markRarer times more
		// rarely, seen a few times yet: where the span cut its first and
		// last iteration short, it may be either.
		wait = wait || c < n && len(oj) <= 2*clockSegMin && float64(c+2)*markRarer >= float64(n)
	}
	ph = make([]uint64, len(toks)+1)
	for i := range toks {
		j := toks[i].key
		ph[i+1] = ph[i]
		if !j.marked() || rarer[j] {
			ph[i+1] += j.hash()
		}
	}
	return ph, wait
}

// segSum is what one candidate step enqueued: its operations as a
// multiset hash, its launches and syncs, and the host time it spanned.
type segSum struct {
	ops      uint64
	launches uint64
	syncs    int
	dur      int64
}

// phaseTimeRatio: the segments between an operation's occurrences at one
// position mod m are a slice of a step when nearly all of them are this
// many times shorter than nearly all the others. Stalls only lengthen
// segments (a few steps each), so they never make a position short.
const phaseTimeRatio = 4

// slicedByTime says whether an operation occurring m > 1 times per step
// explains unit, the segments between its consecutive occurrences, better
// than once per step does: their host time differs by their position mod m.
func slicedByTime(unit []segSum) bool {
	for m := 2; m <= clockMaxM; m++ {
		if len(unit)/m >= clockSegMin && phasesDifferInTime(unit, m) {
			return true
		}
	}
	return false
}

// phasesDifferInTime says whether the segments at one position mod m are
// short: their upper quartile phaseTimeRatio times below the lower
// quartile of the segments at the other positions.
func phasesDifferInTime(unit []segSum, m int) bool {
	quart := func(d []int64, q int) int64 {
		sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
		return d[min(len(d)-1, len(d)*q/4)]
	}
	for r := 0; r < m; r++ {
		var in, out []int64
		for i := range unit {
			if i%m == r {
				in = append(in, unit[i].dur)
			} else {
				out = append(out, unit[i].dur)
			}
		}
		if len(in) == 0 || len(out) == 0 {
			return false
		}
		if phaseTimeRatio*max(quart(in, 3), 1) < quart(out, 1) {
			return true
		}
	}
	return false
}

// hash is the operation's term in a segment's multiset hash.
func (k tokKey) hash() uint64 {
	h := uint64(k.kind) + 1
	for _, v := range [...]uint64{uint64(k.dir), k.stream, k.bytes, uint64(k.op), k.comm, k.fn} {
		h = mix64(h ^ v)
	}
	return h
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func segSyncs(f []segSum) []int {
	n := make([]int, len(f))
	for i := range f {
		n[i] = f[i].syncs
	}
	return n
}

// modalMatch is how many steps hold the same operations as the most
// common step, with launch counts that fit its median given the launches
// neighbouring steps lend each other (lagFit), and that median. Comparing
// with the mode rather than the previous step charges an inserted
// checkpoint or evaluation one mismatch, not two.
func modalMatch(feats []segSum, launchesSeen bool) (int, float64) {
	groups := map[uint64][]int{}
	var mode uint64
	for i := range feats {
		k := feats[i].ops
		groups[k] = append(groups[k], i)
		if len(groups[k]) > len(groups[mode]) {
			mode = k
		}
	}
	g := groups[mode]
	l := make([]uint64, len(g))
	for i, s := range g {
		l[i] = feats[s].launches
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	ref := float64(l[len(l)/2])
	if !launchesSeen || !fewCounts(l) {
		// Without launches, or where the loop's data picks how many
		// kernels a step launches (a router, sequence-length buckets):
		// no count is the step's, and the operations alone say which
		// steps are alike.
		return len(g), ref
	}
	n := 0
	var lag lagFit
	for i := range feats {
		if feats[i].ops != mode {
			// What an inserted step lent or borrowed is unknown.
			lag.reset()
			continue
		}
		if lag.fit(feats[i].launches, ref) {
			n++
		}
	}
	return n, ref
}

// phasesDiffer says whether the segments between consecutive occurrences
// of an operation differ by their position mod m: a step holding m
// occurrences has its own work between each (a batch copy, then a copy
// into a graph's input, then the replay).
func phasesDiffer(unit []segSum, m int, launchesSeen bool) bool {
	var first, firstL uint64
	var firstLs []uint64
	for r := 0; r < m; r++ {
		var ph []segSum
		for i := r; i < len(unit); i += m {
			ph = append(ph, unit[i])
		}
		if len(ph) == 0 {
			return false
		}
		groups := map[uint64]int{}
		var mode uint64
		for i := range ph {
			k := ph[i].ops
			groups[k]++
			if groups[k] > groups[mode] {
				mode = k
			}
		}
		l := make([]uint64, len(ph))
		for i := range ph {
			l[i] = ph[i].launches
		}
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		med := l[len(l)/2]
		if r == 0 {
			first, firstL, firstLs = mode, med, l
			continue
		}
		if mode != first {
			return true
		}
		// Launch counts tell phases apart when their medians differ and
		// both positions launch one of few counts: a loop runs the same
		// kernels at the same place of every iteration (an occurrence
		// missed or inserted by a checkpoint mixes two of them into a
		// position), while a loop whose data picks how many kernels a
		// step launches spreads each position's counts, and their
		// medians differ by chance.
		if launchesSeen && !launchesClose(med, firstL) && (fewCounts(l) || fewCounts(firstLs)) {
			return true
		}
	}
	return !launchesSeen && phasesDifferInTime(unit, m)
}

// fewCounts says whether sorted launch counts are mostly one or two
// counts (give or take countSlack of each): at least three in four.
func fewCounts(l []uint64) bool {
	taken := make([]bool, len(l))
	covered := 0
	for pick := 0; pick < 2; pick++ {
		best, bestLo, bestHi := 0, 0, 0
		lo := 0
		for hi := range l {
			for l[hi]-l[lo] > 2*countSlack(l[hi]) {
				lo++
			}
			n := 0
			for k := lo; k <= hi; k++ {
				if !taken[k] {
					n++
				}
			}
			if n > best {
				best, bestLo, bestHi = n, lo, hi
			}
		}
		for k := bestLo; k <= bestHi; k++ {
			taken[k] = true
		}
		covered += best
	}
	return 4*covered >= 3*len(l)
}

// countSlack is how far a loop's launch count at one place may stray
// between iterations: none for a few launches, a twentieth of many (what
// a lagging flush moves across a boundary).
func countSlack(n uint64) uint64 { return n / 20 }

// clockPhase picks which occurrence (mod m) starts a step. A step ends at
// syncs it always makes (the final loss read, one per stream), while
// scalar reads come and go: the start is the occurrence whose preceding
// stretch held a sync in every step (the most syncs at least), and among
// those the one before which the host paused longest after a sync
// (fetching the next batch).
func clockPhase(toks []token, o []int, m int, posts func(lo, hi int64) int64) int {
	if m == 1 {
		return 0
	}
	bestR, bestMin, bestV := 0, -1, int64(-1)
	for r := 0; r < m; r++ {
		var v []int64
		least := -1
		for i := r; i < len(o); i += m {
			if i == 0 {
				continue
			}
			n := 0
			for j := o[i-1] + 1; j <= o[i]; j++ {
				n += toks[j].syncs
			}
			if least < 0 || n < least {
				least = n
			}
			v = append(v, posts(toks[o[i-1]].t, toks[o[i]].t))
		}
		if len(v) == 0 {
			continue
		}
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		med := v[len(v)/2]
		if least > bestMin || (least == bestMin && med > bestV) {
			bestR, bestMin, bestV = r, least, med
		}
	}
	return bestR
}

// onLaunches counts kernels launched, for the clock's step comparison.
func (s *stepper) onLaunches(n uint64) {
	s.pendL += n
	s.flushedAll += n
}

// notePending takes what a thread's CUDA event says of its launches not
// flushed yet: none (flush: it flushed them, or its count carried them)
// or pending; marked launches count positions by them (token.mlaunches).
func (s *stepper) notePending(tid uint32, pending uint64, flush bool) {
	if flush {
		pending = 0
	}
	if s.pend == nil {
		s.pend = map[uint32]uint64{}
	}
	old := s.pend[tid]
	if pending < old && !flush {
		// A later event cannot report fewer unflushed launches without a
		// flush in between: one was lost; keep the larger.
		return
	}
	s.pendSum += pending - old
	if pending == 0 {
		delete(s.pend, tid)
		return
	}
	s.pend[tid] = pending
}

// onToken feeds one enqueue that can clock steps; it reports whether a
// step ended.
func (s *stepper) onToken(set settings, key tokKey, occ, t int64) bool {
	from := t
	if n := len(s.toks); n > 0 {
		from = s.toks[n-1].t
	}
	pos := s.flushedAll + s.pendSum
	tok := token{key: key, t: t, launches: s.pendL, syncs: s.pendSyncs, seen: set.launchesSeen(from, t), occ: occ, from: from, pos: pos}
	if key.marked() {
		tok.mlaunches = pos - min(pos, s.markPos)
		s.markPos = pos
	}
	tok.gpmWait = !tok.seen && key.kind != event.KindCollective && s.askGPM(s.dev)
	s.pendL, s.pendSyncs = 0, 0
	s.toks = append(s.toks, tok)
	s.trimToks()
	s.ntok++
	if s.mode == modeClock {
		ended := s.clockTick(set, &tok)
		if s.mode == modeClock && s.ntok%clockRecheck == 0 {
			s.tryClock(set)
		}
		return ended
	}
	if s.ntok%clockEvery != 0 {
		return false
	}
	return s.tryClock(set)
}

// copiesComing says whether an operation other than a marked launch
// repeats in toks, still, but too few times yet for detectClock to judge
// it as a clock of up to clockMaxM occurrences a step.
func copiesComing(toks []token) bool {
	n := map[tokKey]int{}
	last := map[tokKey]int{}
	for i := range toks {
		if k := toks[i].key; !k.marked() {
			n[k]++
			last[k] = i
		}
	}
	// Still occurring: among the latest tokens (a model's setup copies its
	// parameters, and that never becomes a clock).
	recent := len(toks) - 4*clockMaxM*(clockSegMin+1)
	for k, c := range n {
		if c >= 2 && c <= clockMaxM*(clockSegMin+1) && last[k] >= recent {
			return true
		}
	}
	return false
}

// trimToks keeps the ring within tokMax tokens of each class, marked
// launches and the rest: a loop's marked launches come several times as
// often as its batch copies, and would otherwise leave the ring too few
// copies to tell micro-batches from iterations (accum.go). A token
// dropped from inside the ring hands its launches and syncs to the next,
// so that every step still sums what it held.
func (s *stepper) trimToks() {
	marked, other := 0, 0
	for i := range s.toks {
		if s.toks[i].key.marked() {
			marked++
		} else {
			other++
		}
	}
	for marked > tokMax || other > tokMax {
		drop := marked > tokMax
		for i := range s.toks {
			if s.toks[i].key.marked() != drop {
				continue
			}
			if i+1 < len(s.toks) {
				s.toks[i+1].launches += s.toks[i].launches
				s.toks[i+1].syncs += s.toks[i].syncs
			}
			s.toks = append(s.toks[:i], s.toks[i+1:]...)
			break
		}
		if drop {
			marked--
		} else {
			other--
		}
		s.trimmed = true
	}
}

// clockTick advances the clock by one token: a step ends at every m-th
// occurrence of its operation.
func (s *stepper) clockTick(set settings, tok *token) bool {
	c := s.clock
	c.seg.add(tok, c.key.marked())
	if tok.key != c.key {
		return false
	}
	idx := c.occ
	c.occ++
	if int(idx%int64(c.m)) != c.phase {
		return false
	}
	synced := s.syncIn(c.lastAt, tok.t)
	c.lastAt = tok.t
	placed := false
	if d := c.deferred; d != 0 {
		c.deferred = 0
		if synced || !c.alwaysSyncs() {
			s.boundary(d, false)
			placed = true
		}
		// Else the previous occurrence began an insertion of the same
		// operation without the loop's sync (an evaluation's batches):
		// the step it would have closed goes on through it.
	}
	if c.alwaysSyncs() && (!synced || !s.syncIn(s.openStart(), tok.t)) {
		// Every step ends at a sync, and none came since the previous
		// occurrence (an insertion's), or the open step has none yet: it
		// was opened at the previous step's last sync by the sync period
		// or a fixed window the clock took over from, and this
		// occurrence is its own.
		c.seg = segFeat{counts: map[tokKey]int{}}
		c.syncs = 0
		return placed
	}
	same := true
	if !set.lite {
		same = c.lag.fit(c.seg.launches, c.launches)
	}
	if c.havePrev {
		if !c.seg.sameOps(&c.prev) {
			same = false
			c.lag.reset()
		}
		if s.lost.record(same) {
			set.log.Info("step pattern lost, falling back to fixed windows", "pid", s.pid)
			s.toWindows(s.stepEnd(tok.t))
			return true
		}
	}
	c.prev, c.havePrev = c.seg, true
	c.seg = segFeat{counts: map[tokKey]int{}}
	c.pushSyncs(c.syncs)
	c.syncs = 0
	if c.alwaysSyncs() {
		// Confirmed by the next occurrence's sync (above).
		c.deferred = s.stepEnd(tok.t)
		return placed
	}
	s.boundary(s.stepEnd(tok.t), false)
	return true
}

func (f *segFeat) add(tok *token, marked bool) {
	if marked {
		f.launches += tok.mlaunches
	} else {
		f.launches += tok.launches
	}
	f.syncs += tok.syncs
	if !tok.key.marked() {
		f.counts[tok.key]++
	}
}

// stepEnd is where the open step ends given that the next one's clock
// operation was enqueued at t: at the sync after which the host clearly
// paused longest (fetching the next batch), else at the last sync before
// t (loops move the batch first, then compute and read their scalars), or
// at t when the step held no sync. In lite the pause after a sync is
// measured to the next copy or sync, launches being invisible: a scalar
// read in the middle of the step looks followed by the longest pause, so
// only the last sync counts.
func (s *stepper) stepEnd(t int64) int64 {
	if c := s.clock; s.mode == modeClock && c != nil && (c.key.marked() && !c.alwaysSyncs() || c.rarelySyncs()) {
		// A marked launch may come anywhere in the iteration, the syncs
		// of a loop that reads its loss every tenth iteration after it:
		// moving the boundary back to such a sync would make that step
		// short and the next one two iterations long. So for any clock
		// whose steps mostly hold no sync: every other boundary is at the
		// clock's operation (after the host prepared the batch), and one
		// in ten at the sync would put two step ends into the iteration
		// that reads the loss and none into the next.
		return t
	}
	lo := s.openStart()
	var last, best, first, second int64 = 0, 0, -1, -1
	for i := range s.hist {
		h := &s.hist[i]
		if h.end <= lo || h.end > t || h.inOp {
			continue
		}
		last = max(last, h.end)
		switch {
		case h.post > first:
			best, first, second = h.end, h.post, first
		case h.post > second:
			second = h.post
		}
	}
	switch {
	case !s.lite && best > 0 && first >= batchFetchMin && first >= 2*max(second, 0):
		return best
	case last > 0:
		return last
	}
	return t
}

// maxPost is the longest post of the syncs in (lo, hi], -1 when none.
func (s *stepper) maxPost(lo, hi int64) int64 {
	v := int64(-1)
	for i := range s.hist {
		if h := &s.hist[i]; h.end > lo && h.end <= hi && h.post > v {
			v = h.post
		}
	}
	return v
}

// tryClock switches to the work clock when one is found. It wins over the
// sync period whenever there is one: host code adds syncs at will (a
// scalar read every third step, a checkpoint's copies), and a sync period
// of several iterations repeats as well as one of one; the enqueued work
// does not lie about what one iteration is.
func (s *stepper) tryClock(set settings) bool {
	// Under auto the clocks are compared by lite's rules throughout, so
	// that the clock found in a window still qualifies after it; the
	// tokens a window saw still say where no kernel ran (token.seen).
	// Tokens still waiting for GPM's verdict (whether the device computed
	// anything before them) are left out until it comes; the occurrences
	// of the clock among them count on.
	toks := s.settledToks()
	cf, valid := detectClock(toks, s.pendSyncs, !set.lite, s.mode == modeUnknown, !s.trimmed, s.maxPost)
	if len(valid) == 0 {
		return false
	}
	for i := len(toks); i < len(s.toks); i++ {
		if s.toks[i].key == cf.key {
			cf.occ++
		}
	}
	if cf.key.marked() && s.mode != modeClock && copiesComing(toks) {
		// A copy or collective that repeats may yet clock the loop: marked
		// launches decide only where none does.
		return false
	}
	cf = s.group(toks, cf)
	undecided := s.mode == modeUnknown || s.mode == modeWindow
	if c := s.clock; s.mode == modeClock && c != nil && c.key.marked() && !cf.key.marked() {
		// A copy or collective clock takes over from marked launches
		// once it is known whether its steps are micro-batches.
		undecided = true
	}
	if undecided && s.mayGroup(toks, cf) {
		// Gaps are held, or go to a fixed window that the clock will
		// split: wait until the ring holds the groups that say whether
		// these steps are micro-batches of one iteration.
		return false
	}
	if c := s.clock; s.mode == modeClock && c != nil && !c.groupedBy(cf) {
		// A running clock gives way, at two checks in a row, to a clearly
		// finer one or when it no longer qualifies itself (it was a
		// warm-up's burst, the loop changed); a long insertion (a
		// checkpoint) disqualifies the loop's clock for one check at most.
		// Its grouping into iterations (accum.go) takes over at once.
		if cf.key == c.key && cf.m == c.m {
			s.clockStrikes = 0
			// The loop's steps may grow or shrink (a schedule, a phase).
			c.launches = cf.launches
			if s.anchor == nil {
				s.anchor = s.findAnchor()
			}
			return false
		}
		still := false
		for _, v := range valid {
			if v.key == c.key && v.m == c.m {
				fl, vl := stepLens(&cf, &v)
				still = fl*1.5 > vl
			}
		}
		if still || insertion(toks, c, valid) {
			s.clockStrikes = 0
			return false
		}
		if s.clockStrikes++; s.clockStrikes < 2 {
			return false
		}
	}
	s.clockStrikes = 0
	prev := s.mode
	s.flushDeferred()
	s.lite = set.lite
	set.log.Debug("step period found", "pid", s.pid, "clock", cf.key.String(), "per_step", cf.m, "syncs_vary", cf.syncsVary)
	s.clock = &clockState{key: cf.key, m: cf.m, phase: cf.phase, occ: cf.occ, launches: cf.launches,
		seg: segFeat{counts: map[tokKey]int{}}, stopAfter: 4*max(cf.medSyncs, 1) + 4}
	for _, n := range cf.syncCounts {
		s.clock.pushSyncs(n)
	}
	s.mode = modeClock
	s.period, s.phase = 0, 0
	s.lost.reset()
	s.anchor = s.findAnchor()
	switch prev {
	case modeUnknown:
		s.retroClock()
		return true
	case modeWindow:
		s.splitWindowClock()
	}
	s.clock.seg, s.clock.syncs = s.openSeg()
	return true
}

// settledToks settles the tokens waiting for GPM (gpmVerdict) and returns
// the ring up to the first still waiting.
func (s *stepper) settledToks() []token {
	if len(s.toks) == 0 {
		return s.toks
	}
	last := s.toks[len(s.toks)-1].t
	n := len(s.toks)
	for i := range s.toks {
		tok := &s.toks[i]
		if !tok.gpmWait {
			continue
		}
		if quiet, done := s.gpmVerdict(tok.from, tok.t, last); done {
			tok.quiet, tok.gpmWait = quiet, false
		} else if i < n {
			n = i
		}
	}
	return s.toks[:n]
}

// openSeg is what the ring holds of the open step under the clock: the
// tokens after its last boundary occurrence, and the syncs since. A clock
// taking over from another clock, the sync period or fixed windows
// compares its first step with the next as a whole, not with the part
// of it enqueued after the takeover.
func (s *stepper) openSeg() (segFeat, int) {
	c := s.clock
	seg := segFeat{counts: map[tokKey]int{}}
	var idx int64
	for i := range s.toks {
		tok := &s.toks[i]
		seg.add(tok, c.key.marked())
		if tok.key != c.key {
			continue
		}
		idx++
		if int((idx-1)%int64(c.m)) == c.phase {
			seg = segFeat{counts: map[tokKey]int{}}
		}
	}
	return seg, seg.syncs + s.pendSyncs
}

// splitWindowClock is splitWindow (steps.go) under the clock: the clock's
// boundaries in the token ring split the open fixed window, after the
// last gap delivered to it. The window that the loop's first iteration
// ends in is that iteration, where the ring reaches back to the run's
// start: a first iteration that compiled for seconds ran the warm-up out
// into fixed windows, and the gaps already emitted with the window's
// number keep it from being cut at the iteration's start.
func (s *stepper) splitWindowClock() {
	if o := s.openStep(); o == nil || !o.Window {
		return
	}
	c := s.clock
	from := -1
	if !s.trimmed {
		from = max(s.loopStart(), 0)
	}
	var idx int64
	n := 0 // boundary occurrences from the loop's first
	for i := range s.toks {
		tok := &s.toks[i]
		if tok.key != c.key {
			continue
		}
		idx++
		if int((idx-1)%int64(c.m)) != c.phase {
			continue
		}
		if from >= 0 && i >= from {
			n++
		}
		o := s.openStep()
		if o == nil || tok.t <= o.Start {
			continue
		}
		if e := s.stepEnd(tok.t); e > o.Start && e > o.lastGap {
			if o.Window && n == 2 {
				o.Window = false
			}
			s.boundary(e, false)
		}
	}
}

// loopStart is the ring index of the clock's boundary occurrence that
// opens the loop's first iteration: the last one before the first token
// known to follow compute, whose work comes after it (a first iteration's
// batch copy has nothing before it but the setup); -1 when none comes
// before that token. The occurrences before it (a model's setup copying a
// parameter the size of the batch) are prologue.
func (s *stepper) loopStart() int {
	c := s.clock
	work := len(s.toks)
	for i := range s.toks {
		if !s.toks[i].idle() {
			work = i
			break
		}
	}
	var idx int64
	at := -1
	for i := 0; i < work; i++ {
		if s.toks[i].key == c.key {
			idx++
			if int((idx-1)%int64(c.m)) == c.phase {
				at = i
			}
		}
	}
	return at
}

// retroClock lays steps over the token history once a clock is found while
// gaps were held: a prologue window up to the first boundary, then one
// step per clock period.
func (s *stepper) retroClock() {
	c := s.clock
	var idx int64
	first := true
	// The first boundary is held until the second is known: a prologue
	// that is a sliver of the first iteration (the clock's operation comes
	// just after the loop's first work) is that iteration, not a window
	// of its own, so that step N is the loop's iteration N.
	pending := int64(-1)
	// No step ends before the loop's first iteration (loopStart).
	lastBefore := s.loopStart()
	for i := range s.toks {
		tok := &s.toks[i]
		c.seg.add(tok, c.key.marked())
		if tok.key != c.key {
			continue
		}
		idx++
		if int((idx-1)%int64(c.m)) != c.phase || i < lastBefore {
			continue
		}
		c.seg = segFeat{counts: map[tokKey]int{}}
		if first {
			first = false
			s.open(s.origin, true)
			pending = s.stepEnd(tok.t)
			continue
		}
		e := s.stepEnd(tok.t)
		if pending >= 0 {
			v := &prologueVote{sliver: pending-s.origin < (e-pending)/2, num: s.steps[len(s.steps)-1].Number, open: true}
			if s.anchor == nil {
				// Steps numbered by the collectives agree across ranks
				// whatever each rank's prologue: no verdict to share.
				s.vote = v
			}
			if v.sliver {
				s.steps[len(s.steps)-1].Window = false
			} else {
				s.boundary(pending, false)
				e = s.stepEnd(tok.t)
			}
			pending = -1
		}
		s.boundary(e, false)
	}
	if pending >= 0 {
		s.boundary(pending, false)
	}
	if s.anchor != nil {
		s.renumber(0)
	}
}

func (k tokKey) String() string {
	switch k.kind {
	case event.KindEnqueue:
		return fmt.Sprintf("launch of function %#x on stream %#x", k.fn, k.stream)
	case event.KindCollective:
		return fmt.Sprintf("%s %d bytes on stream %#x", k.op, k.bytes, k.stream)
	case event.KindMemset:
		return fmt.Sprintf("memset %d bytes on stream %#x", k.bytes, k.stream)
	}
	switch k.dir {
	case event.CUMemcpyHtoD:
		return fmt.Sprintf("copy %d bytes to the device on stream %#x", k.bytes, k.stream)
	case event.CUMemcpyDtoH:
		return fmt.Sprintf("copy %d bytes to the host on stream %#x", k.bytes, k.stream)
	}
	return fmt.Sprintf("copy %d bytes on stream %#x", k.bytes, k.stream)
}

// openStart is the start of the open step, 0 when none is open.
func (s *stepper) openStart() int64 {
	if n := len(s.steps); n > 0 && !s.steps[n-1].closed {
		return s.steps[n-1].Start
	}
	return 0
}

// undecided says whether a gap at midpoint t may still belong to a step
// the clock has not ended yet: under the clock a step's end is known only
// once the next step's operation is enqueued.
func (s *stepper) undecided(t int64) bool {
	if s.mode == modeUnknown || s.vote != nil && s.vote.open {
		return true
	}
	if s.warming {
		if o := s.openStep(); s.mode == modeWindow && o != nil && o.Window {
			// The warm-up ran out before any period was found (a long
			// first iteration, a model's setup): the period found in the
			// next iterations splits the open window after the last gap
			// it was given (splitWindow, splitWindowClock), so its gaps
			// are held as long as the emission promise allows.
			return t >= o.Start
		}
		s.warming = false
	}
	if s.mode != modeClock {
		return false
	}
	// Once no step is open (the process ended) every step is known.
	o := s.openStart()
	return o != 0 && t >= o
}
