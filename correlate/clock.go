package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/stepclock"
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

// awaitMarks says whether marked launches have begun to arrive but are
// still too few for stepclock.Detect to judge them; the sync period waits for
// them (full probes), since the clock they make lays its steps over the
// ring, while the sync period's steps could not be taken back.
func (s *stepper) awaitMarks() bool {
	n := 0
	for i := range s.toks {
		if s.toks[i].Key.Marked() {
			n++
		}
	}
	return n > 0 && n < stepclock.MarkWait
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

// unclocked says whether key's latest token makes a stretch with no
// sited call in which it came more than stepclock.UnclockedMax times
// (once per stretch): under a running call site, that stretch may show
// the loop iterating without it, which checkSite then decides.
func (c *siteClock) unclocked(key stepclock.Key) bool {
	if c.ran || c.source != stepclock.SourceCallSite || c.run[key] <= stepclock.UnclockedMax {
		return false
	}
	c.ran = true
	return true
}

// onToken feeds one enqueue that can clock steps; it reports whether a
// step ended.
func (s *stepper) onToken(set settings, key stepclock.Key, occ, t int64) bool {
	from := t
	pos := s.flushedAll + s.pendSum
	posFrom := pos
	if n := len(s.toks); n > 0 {
		from, posFrom = s.toks[n-1].T, s.toks[n-1].Pos
	}
	s.siteToken(set, key, t)
	tok := stepclock.Token{Key: key, T: t, Launches: s.pendL, Syncs: s.pendSyncs, Seen: set.launchesSeen(from, t), Occ: occ, From: from, Pos: pos, PosFrom: posFrom}
	if key.Marked() {
		tok.MLaunches = pos - min(pos, s.markPos)
		s.markPos = pos
	}
	tok.GPMWait = !tok.Seen && key.Kind != event.KindCollective && s.askGPM(s.dev)
	s.pendL, s.pendSyncs = 0, 0
	s.toks = append(s.toks, tok)
	s.trimToks()
	s.ntok++
	if s.mode == modeSite {
		return s.sites.unclocked(key) && s.checkSite(set)
	}
	if s.mode == modeClock {
		ended := s.clockTick(set, &tok)
		if s.mode == modeClock && s.ntok%stepclock.Recheck == 0 {
			s.tryClock(set)
		}
		return ended
	}
	if s.ntok%stepclock.Every != 0 {
		return false
	}
	return s.tryClock(set)
}

// trimToks keeps the ring within stepclock.TokMax tokens of each class, marked
// launches and the rest: a loop's marked launches come several times as
// often as its batch copies, and would otherwise leave the ring too few
// copies to tell micro-batches from iterations (accum.go). A token
// dropped from inside the ring hands its launches and syncs to the next,
// so that every step still sums what it held.
func (s *stepper) trimToks() {
	marked, other := 0, 0
	for i := range s.toks {
		if s.toks[i].Key.Marked() {
			marked++
		} else {
			other++
		}
	}
	for marked > stepclock.TokMax || other > stepclock.TokMax {
		drop := marked > stepclock.TokMax
		for i := range s.toks {
			if s.toks[i].Key.Marked() != drop {
				continue
			}
			if i+1 < len(s.toks) {
				s.toks[i+1].Launches += s.toks[i].Launches
				s.toks[i+1].Syncs += s.toks[i].Syncs
				s.toks[i+1].PosFrom = s.toks[i].PosFrom
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
func (s *stepper) clockTick(set settings, tok *stepclock.Token) bool {
	c := s.clock
	c.occSyncs += tok.Syncs
	if tok.Key != c.key {
		c.seg.Add(tok, c.key.Marked())
		return false
	}
	synced := c.occSyncs > 0
	c.occSyncs = 0
	c.all++
	if c.byPos && synced && int(c.occ%int64(c.m)) != c.phase {
		// A grouping that launches showed without a sync: its
		// micro-batches follow no sync, and an occurrence after one
		// inside a group is an insertion's (an evaluation's batches,
		// each read back), which counts no micro-batch and is no
		// operation of the step.
		c.seg.Syncs += tok.Syncs
		return false
	}
	c.seg.Add(tok, c.key.Marked())
	idx := c.occ
	c.occ++
	if int(idx%int64(c.m)) != c.phase {
		return false
	}
	c.lastAll = c.all
	synced = s.syncIn(c.lastAt, tok.T)
	c.lastAt = tok.T
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
	if c.alwaysSyncs() && (!synced || !s.syncIn(s.openStart(), tok.T)) {
		// Every step ends at a sync, and none came since the previous
		// occurrence (an insertion's), or the open step has none yet: it
		// was opened at the previous step's last sync by the sync period
		// or a fixed window the clock took over from, and this
		// occurrence is its own.
		c.seg = stepclock.Seg{Counts: map[stepclock.Key]int{}}
		c.syncs = 0
		return placed
	}
	same := true
	switch {
	case set.lite:
	case c.byPos:
		same = c.lag.Fit(c.seg.ByPos, c.launches)
	default:
		same = c.lag.Fit(c.seg.Launches, c.launches)
	}
	if c.havePrev {
		if !c.seg.SameOps(&c.prev) {
			same = false
			c.lag.Reset()
		}
		if s.lost.record(same) {
			set.log.Info("step pattern lost, falling back to fixed windows", "pid", s.pid)
			s.toWindows(s.stepEnd(tok.T))
			return true
		}
	}
	c.prev, c.havePrev = c.seg, true
	c.seg = stepclock.Seg{Counts: map[stepclock.Key]int{}}
	c.pushSyncs(c.syncs)
	c.syncs = 0
	if c.alwaysSyncs() {
		// Confirmed by the next occurrence's sync (above).
		c.deferred = s.stepEnd(tok.T)
		return placed
	}
	s.boundary(s.stepEnd(tok.T), false)
	return true
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
	if c := s.clock; s.mode == modeClock && c != nil && (c.key.Marked() && !c.alwaysSyncs() || c.rarelySyncs()) {
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
		if h.End <= lo || h.End > t || h.InOp {
			continue
		}
		last = max(last, h.End)
		switch {
		case h.Post > first:
			best, first, second = h.End, h.Post, first
		case h.Post > second:
			second = h.Post
		}
	}
	switch {
	case !s.lite && best > 0 && first >= stepclock.BatchFetchMin && first >= 2*max(second, 0):
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
		if h := &s.hist[i]; h.End > lo && h.End <= hi && h.Post > v {
			v = h.Post
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
	cf, valid := stepclock.Detect(toks, stepclock.Input{SyncsSince: s.pendSyncs, LaunchesSeen: !set.lite,
		NeedSync: s.mode == modeUnknown, FromStart: !s.trimmed, Posts: s.maxPost})
	if len(valid) == 0 {
		return false
	}
	for i := len(toks); i < len(s.toks); i++ {
		if s.toks[i].Key == cf.Key {
			cf.Occ++
		}
	}
	if cf.Key.Marked() && s.mode != modeClock && stepclock.CopiesComing(toks) {
		// A copy or collective that repeats may yet clock the loop: marked
		// launches decide only where none does.
		return false
	}
	cf = s.group(toks, cf)
	if s.keepOverMarks(toks, cf) {
		s.clockStrikes = 0
		return false
	}
	undecided := s.mode == modeUnknown || s.mode == modeWindow
	if c := s.clock; s.mode == modeClock && c != nil && c.key.Marked() && !cf.Key.Marked() {
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
		if cf.Key == c.key && cf.M == c.m {
			s.realign(cf)
			s.clockStrikes = 0
			// The loop's steps may grow or shrink (a schedule, a phase).
			c.launches, c.byPos = cf.Launches, cf.ByPosition
			if s.anchor == nil {
				s.anchor = s.findAnchor()
			}
			return false
		}
		still := false
		for _, v := range valid {
			// Where the running clock is a launch-learnt grouping of
			// v's operation, v still qualifying is the clock still
			// qualifying, and a clock is clearly finer only against v
			// (a checkpoint's per-tensor copies, one a step, against
			// the eight micro-batches' copies of the group).
			if v.Key == c.key && v.M == c.m || s.groupsClock(v) {
				fl, vl := stepclock.StepLens(&cf, &v)
				still = fl*1.5 > vl
			}
		}
		if still || insertion(toks, c, valid) || set.lite && s.launchGrouped() {
			// A grouping that launches showed is refuted by launches
			// alone: blind to them, a checkpoint's per-tensor copies
			// that the host issues while the device still runs the
			// steps queued before look like a finer clock (no compute
			// is seen to come between them). A loop that really moved
			// on loses the clock's pattern (toWindows) or its
			// operation leaves the ring.
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
	set.log.Debug("step period found", "pid", s.pid, "clock", cf.Key.String(), "per_step", cf.M, "syncs_vary", cf.SyncsVary)
	if a := s.rival; a != nil && a.key == cf.Key {
		s.accum, s.rival = a, nil
	}
	s.clock = &clockState{key: cf.Key, m: cf.M, phase: cf.Phase, occ: cf.Occ, all: cf.Occ, launches: cf.Launches, byPos: cf.ByPosition,
		seg: stepclock.Seg{Counts: map[stepclock.Key]int{}}, stopAfter: 4*max(cf.MedSyncs, 1) + 4}
	for _, n := range cf.SyncCounts {
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

// openSeg is what the ring holds of the open step under the clock: the
// tokens after its last boundary occurrence, and the syncs since. A clock
// taking over from another clock, the sync period or fixed windows
// compares its first step with the next as a whole, not with the part
// of it enqueued after the takeover.
func (s *stepper) openSeg() (stepclock.Seg, int) {
	c := s.clock
	seg := stepclock.Seg{Counts: map[stepclock.Key]int{}}
	var idx int64
	for i := range s.toks {
		tok := &s.toks[i]
		seg.Add(tok, c.key.Marked())
		if tok.Key != c.key {
			continue
		}
		idx++
		if int((idx-1)%int64(c.m)) == c.phase {
			seg = stepclock.Seg{Counts: map[stepclock.Key]int{}}
		}
	}
	return seg, seg.Syncs + s.pendSyncs
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
		if tok.Key != c.key {
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
		if o == nil || tok.T <= o.Start {
			continue
		}
		if e := s.stepEnd(tok.T); e > o.Start && e > o.lastGap {
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
		if !s.toks[i].Idle() {
			work = i
			break
		}
	}
	var idx int64
	at := -1
	for i := 0; i < work; i++ {
		if s.toks[i].Key == c.key {
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
	first := true
	// The first boundary is held until the second is known: a prologue
	// that is a sliver of the first iteration (the clock's operation comes
	// just after the loop's first work) is that iteration, not a window
	// of its own, so that step N is the loop's iteration N.
	pending := int64(-1)
	at := s.retroBounds()
	for i := range s.toks {
		tok := &s.toks[i]
		c.seg.Add(tok, c.key.Marked())
		if len(at) == 0 || at[0] != i {
			continue
		}
		at = at[1:]
		c.seg = stepclock.Seg{Counts: map[stepclock.Key]int{}}
		if first {
			first = false
			s.open(s.origin, true)
			pending = s.stepEnd(tok.T)
			continue
		}
		e := s.stepEnd(tok.T)
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
				e = s.stepEnd(tok.T)
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
	if s.mode == modeUnknown || s.vote != nil && s.vote.open || s.siteYoung() {
		// siteYoung: a call site found yet may lay the steps again.
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
