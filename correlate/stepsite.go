package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// Steps from the code: a step ends at each sync or blocking copy made from
// the step site, the line of the job's own code that ends an iteration.
// The site is declared (Config.StepAt) or found (stepclock.PickSite: the
// site of the main thread's sync that recurs once per iteration); either
// wins over the work pattern (clock.go, steps.go), which serves code with
// no usable site (stripped native loops, stacks not captured). The step
// clock each process's steps came from is reported (StepClock).

const (
	// siteEvery: sited calls between two PickSite checks.
	siteEvery = 16
	// siteEarly: sited calls between two looks for an optimizer step's
	// site over micro-batches (pickOverGroups) while the stream is young.
	siteEarly = 4
	// siteStrikes: checks in a row that must disagree with the running
	// site (another site, or none) before it gives way: an evaluation
	// phase fills the stream with its own batches for a while.
	siteStrikes = 3
	// siteLost: typical steps without a call of the found site after
	// which it gives way to fixed windows (an evaluation phase or a
	// checkpoint may last ten steps; the site's own checks judge those).
	siteLost = 50
	// siteHold: PickSite checks the sync period waits for while the
	// stream holds sited calls and no step has been laid yet.
	siteHold = 2
	// siteSettle: site checks after which a work-pattern clock is taken
	// as the process's (clockSettling).
	siteSettle = 6
)

// siteClock is a stepper's call-site state.
type siteClock struct {
	items []stepclock.Item // the stream PickSite reads, oldest first
	buf   []stepclock.Item // the array items slides along, once full (push)
	// trimmed: the stream no longer holds the process's first items.
	trimmed bool
	calls   int // sited calls since the last check
	// The running site: its source (declared or call site), key and
	// thread (call site), and the name of the frame it was found at.
	source  string
	key     string
	tid     uint32
	name    string
	strikes int
	checks  int // PickSite checks run
	// undecided: the latest check found a main-thread site that may yet
	// prove a loop of varying micro-batches (stepclock's Undecided).
	undecided bool
	lastAt    int64 // its latest call's return
	// syncs: syncs since the latest step end under the site: a sync's
	// place in its step, for the comm baselines (stepper.slot).
	syncs int
	// seen: each sync site's calls since the latest step end: a sync's
	// place in its step by its own call site, which scalar reads made a
	// varying number of times per step do not shift (stepper.slot).
	seen map[string]int
	// pend: each thread's launches a copy reported pending, which its
	// next sync counts again (newLaunches).
	pend map[uint32]uint64
	// run: the tokens of each key since the latest sited call; ran: one
	// of them passed stepclock.UnclockedMax in this stretch, and the
	// running site was checked for it (onToken).
	run map[stepclock.Key]int
	ran bool
	// phase: the sites found to be a phase inside the loop (Unclocked):
	// never picked again.
	phase map[string]bool
	// micro: the sites known to read micro-batches (stepclock.MicroSites).
	micro map[string]bool
	// weight: each recurring site's launches an iteration, as last seen
	// (stepclock.Weights).
	weight map[string]float64
	// mainBare: when the main thread's latest syncs returned, sited or
	// not (its stack not captured), oldest first.
	mainBare []int64
}

// mainSyncs is how many syncs the main thread made since t.
func (c *siteClock) mainSyncs(t int64) int {
	n := 0
	for _, at := range c.mainBare {
		if at >= t {
			n++
		}
	}
	return n
}

// newLaunches is how many launches ev's thread made since its previous
// sited call: a sync's count (launches since its last flush) less those
// a copy in between already reported pending.
func (c *siteClock) newLaunches(ev *event.Event) uint64 {
	if c.pend == nil {
		c.pend = map[uint32]uint64{}
	}
	prev := c.pend[ev.TID]
	if ev.Kind != event.KindSync {
		c.pend[ev.TID] = ev.Pending
		if ev.Pending >= prev {
			return ev.Pending - prev
		}
		return ev.Pending
	}
	delete(c.pend, ev.TID)
	if ev.Count >= prev {
		return ev.Count - prev
	}
	return ev.Count
}

// awaitSite says whether sited calls have begun to arrive but PickSite
// has not judged them yet (siteHold checks): the sync period waits for
// it, since the site lays its steps over the stream while the period's
// steps could not be taken back.
func (s *stepper) awaitSite() bool {
	c := &s.sites
	if c.checks >= siteHold {
		return false
	}
	for i := range c.items {
		if c.items[i].Site.Key != "" {
			return true
		}
	}
	return false
}

// siteToken notes one enqueued token in the stream.
func (s *stepper) siteToken(set settings, key stepclock.Key, t int64) {
	c := &s.sites
	if c.run == nil {
		c.run = map[stepclock.Key]int{}
	}
	c.run[key]++
	c.push(stepclock.Item{Key: key, T: t, Seen: set.launchesSeen(c.lastT(t), t), Pos: s.flushedAll + s.pendSum})
}

// lastT is when the stream's latest item came, t where it holds none.
func (c *siteClock) lastT(t int64) int64 {
	if n := len(c.items); n > 0 {
		return min(c.items[n-1].T, t)
	}
	return t
}

// push adds it to the stream, which keeps its last SiteRing items. Once
// full, the stream is a window sliding along an array of twice its
// length, moved back to the array's front when it reaches the end: moving
// every item on each push was the largest memory move of an 8-rank
// replay (7% of its CPU).
func (c *siteClock) push(it stepclock.Item) {
	if len(c.items) < stepclock.SiteRing {
		c.items = append(c.items, it)
		return
	}
	c.trimmed = true
	if cap(c.items) == len(c.items) {
		if len(c.buf) < 2*stepclock.SiteRing {
			c.buf = make([]stepclock.Item, 2*stepclock.SiteRing)
		}
		n := copy(c.buf, c.items[1:]) // may overlap: copy moves
		clear(c.buf[n:])              // drop what the old items held
		c.buf[n] = it
		c.items = c.buf[: n+1 : len(c.buf)]
		return
	}
	c.items[0] = stepclock.Item{} // drop what the oldest held
	c.items = append(c.items[1:], it)
}

// onSiteCall takes a sync or blocking copy with its stack; it reports
// whether a step ended at it.
func (s *stepper) onSiteCall(set settings, ev *event.Event) bool {
	c := &s.sites
	if ev.TID == s.pid && set.stepAt == nil {
		if c.mainBare = append(c.mainBare, ev.End); len(c.mainBare) > stepclock.SiteRing {
			c.mainBare = c.mainBare[1:]
		}
	}
	if len(ev.Stack) == 0 {
		return false
	}
	site := stepclock.SiteOf(ev.Stack)
	if site.Key != "" {
		// Counted once any step it ends has begun: the next call of
		// the site in the step is its first.
		defer func() {
			if c.seen == nil {
				c.seen = map[string]int{}
			}
			c.seen[site.Key]++
		}()
	}
	if sp := set.stepAt; sp != nil {
		f, ok := sp.Match(ev.Stack)
		if !ok {
			return false
		}
		c.lastAt = ev.End
		if s.mode != modeSite {
			c.source, c.name = stepclock.SourceDeclared, stepclock.MatchName(f)
			set.log.Info("steps end at the declared site", "pid", s.pid, "site", c.name)
			s.enterSite(nil)
		}
		s.boundary(ev.End, false)
		return true
	}
	if site.Key == "" {
		return false
	}
	clear(c.run)
	c.ran = false
	it := stepclock.Item{Site: site, TID: ev.TID, Launches: c.newLaunches(ev), T: ev.End,
		Seen: set.launchesSeen(c.lastT(ev.End), ev.End), Pos: s.flushedAll + s.pendSum}
	if n := len(c.items); n > 0 && ev.Kind == event.KindMemcpy {
		// The copy came as a token just before: it is this call.
		if k, ok := stepclock.TokenOf(ev); ok && c.items[n-1].Site.Key == "" && c.items[n-1].Key == k {
			c.items = c.items[:n-1]
		}
	}
	c.push(it)
	if s.fw.On() {
		return s.frameworkSiteCall(set, ev.End)
	}
	c.calls++
	ended := false
	if s.mode == modeSite && site.Key == c.key && ev.TID == c.tid {
		c.lastAt = ev.End
		s.boundary(ev.End, false)
		ended = true
	}
	if c.calls >= siteEvery {
		c.calls = 0
		ended = s.checkSite(set) || ended
	} else if c.calls%siteEarly == 0 && !c.trimmed && s.mode != modeSite {
		ended = s.pickOverGroups(set) || ended
	}
	return ended
}

// siteYoung says whether sited calls have begun to arrive and PickSite
// has not judged siteHold streams of them yet (siteSettle while the
// latest check found a site whose intervals may yet prove a loop of
// varying micro-batches: the data picked 3 of them mostly, 2 now and
// then, too few counts to fit), with no declared site or
// framework marker running: an optimizer step's site found then takes
// back the micro-batch steps laid meanwhile (giveBack), so they wait
// (final.go), within the emission promise.
func (s *stepper) siteYoung() bool {
	c := &s.sites
	hold := siteHold
	if c.undecided {
		hold = siteSettle
	}
	if c.checks >= hold || c.trimmed || s.fw.On() || s.mode == modeSite && c.source != stepclock.SourceCallSite {
		return false
	}
	return c.sited()
}

// sited says whether the stream holds a sited call.
func (c *siteClock) sited() bool {
	for i := range c.items {
		if c.items[i].Site.Key != "" {
			return true
		}
	}
	return false
}

// clockSettling says whether the work pattern clocks the steps while
// sited calls arrive and the site checks have not had their say (no site
// taken, fewer than siteSettle checks). A check with the launches in view
// tells an iteration from a micro-batch or an evaluation's batch where one
// blind to them (lite) may not, so auto's first window waits for it.
func (s *stepper) clockSettling() bool {
	c := &s.sites
	if s.mode == modeSite || s.fw.On() || c.checks >= siteSettle {
		return false
	}
	return c.sited()
}

// pickOverGroups takes the site PickSite finds where it is called once
// after each group of another site's micro-batch reads (an optimizer
// step's, Pick.Groups), between the regular checks while the stream is
// young: the batch copy's clock counts micro-batches until it does, and
// steps emitted meanwhile cannot be taken back (giveBack).
func (s *stepper) pickOverGroups(set settings) bool {
	if set.stepAt != nil {
		return false
	}
	c := &s.sites
	p, ok := stepclock.PickSite(c.items, s.pid)
	if !ok || p.Groups == 0 || c.micro[stepclock.SiteID(p.TID, p.Site.Key)] || c.phase[stepclock.SiteID(p.TID, p.Site.Key)] {
		return false
	}
	if p.TID != s.pid && c.mainSyncs(c.items[0].T) >= stepclock.SiteMinRuns {
		return false // a background thread's (checkSite)
	}
	return s.takeSite(set, p.Site, p.TID, p.Pin)
}

// checkSite runs PickSite over the stream: it enters the site found, or
// gives the running one up after siteStrikes checks that disagree.
func (s *stepper) checkSite(set settings) bool {
	c := &s.sites
	c.checks++
	sc := stepclock.Score(c.items) // c.items stays as it is until the check ends
	c.undecided = s.mode != modeSite && sc.Undecided(s.pid)
	for id, w := range sc.Weights() {
		if c.weight == nil {
			c.weight = map[string]float64{}
		}
		c.weight[id] = w
	}
	for _, id := range sc.MicroSites() {
		if c.micro == nil {
			c.micro = map[string]bool{}
		}
		c.micro[id] = true
	}
	if s.mode == modeSite && c.source == stepclock.SourceCallSite && c.tid != s.pid && c.mainSyncs(c.items[0].T) >= stepclock.SiteMinRuns {
		// The main thread now syncs recurrently: the running site is a
		// background thread's (a saver's burst filled the stream when it
		// was found), which never owns the step clock.
		set.log.Info("step site is a background thread's, back to the work pattern", "pid", s.pid, "site", c.name)
		c.key, c.source = "", ""
		s.toWindows(c.lastAt)
	}
	if p, ok := s.replacedBy(); ok {
		set.log.Info("step site replaced: the loop changed", "pid", s.pid, "was", c.name, "site", p.Pin)
		return s.takeSite(set, p.Site, p.TID, p.Pin)
	}
	if site, ok := s.outweighed(sc); ok {
		// The running site was found in an evaluation's batches (an
		// attach during one): the training's, whose iterations launch
		// clearly more, still recurs and takes over at once.
		return s.takeSite(set, site, c.tid, stepclock.PinIn(c.items, site.Key))
	}
	if s.mode == modeSite && c.source == stepclock.SourceCallSite && sc.Unclocked(c.key, c.tid) {
		// Its iterations' work came again and again with no call of it
		// (stepclock.Unclocked): the site was a phase the sidecar met
		// first (an evaluation's batches), and the loop runs without it.
		set.log.Info("step site misses the loop's iterations, back to the work pattern", "pid", s.pid, "site", c.name)
		if c.phase == nil {
			c.phase = map[string]bool{}
		}
		c.phase[stepclock.SiteID(c.tid, c.key)] = true
		c.key, c.source, c.strikes = "", "", 0
		s.toWindows(c.lastAt)
		return true
	}
	if s.mode == modeSite && sc.Qualifies(c.key, c.tid) && !s.mainTakesOver(sc) {
		// The running site still recurs: a rival (an evaluation's
		// batches) does not unseat it.
		c.strikes = 0
		if c.source == stepclock.SourceCallSite {
			if pin := stepclock.PinIn(c.items, c.key); pin != "" {
				c.name = pin
			}
		}
		return false
	}
	p, ok := sc.Pick(s.pid)
	if ok && c.micro[stepclock.SiteID(p.TID, p.Site.Key)] {
		// It reads micro-batches, as launches showed earlier: no step.
		ok = false
	}
	if ok && (c.phase[stepclock.SiteID(p.TID, p.Site.Key)] || sc.Unclocked(p.Site.Key, p.TID)) {
		// The loop iterates without calling it: a phase, not the loop.
		ok = false
	}
	if ok && s.mode == modeClock && s.withinGroup(p) {
		// Its calls come more often than the group launches showed
		// (an evaluation's batches, a micro-batch's read): no step.
		ok = false
	}
	if ok && p.TID != s.pid && c.mainSyncs(c.items[0].T) >= stepclock.SiteMinRuns {
		// The main thread syncs on its own, recurrently (from a site
		// that does not qualify, or whose stack was not captured): the
		// other thread's site is a background one's (a saver), which
		// never owns the step clock.
		ok = false
	}
	set.log.Debug("step site check", "pid", s.pid, "site", p.Site.Name, "runs", p.Runs, "rival", p.Rival.Name, "ok", ok)
	if ok && s.mode == modeSite && c.source == stepclock.SourceCallSite && p.TID == c.tid && c.heavier(c.key, p.Site.Key, p.TID) == 1 {
		// The running site's iterations launch clearly more than the
		// site found: an evaluation's batches fill the stream for now,
		// and the training's site stays.
		return false
	}
	if s.mode == modeSite {
		if !ok && c.recent() {
			// Still called lately, and nothing else recurs: a phase (an
			// evaluation) holds the stream for now.
			return false
		}
		if c.strikes++; c.strikes < siteStrikes {
			return false
		}
		c.strikes = 0
		if !ok {
			set.log.Info("step site no longer recurs, back to the work pattern", "pid", s.pid, "site", c.name)
			c.key, c.source = "", ""
			s.toWindows(c.lastAt)
			return true
		}
	} else if !ok {
		return false
	}
	return s.takeSite(set, p.Site, p.TID, p.Pin)
}

// takeSite makes site on tid the running call site: its calls in the
// stream end the steps from the open one on.
func (s *stepper) takeSite(set settings, site stepclock.Site, tid uint32, pin string) bool {
	c := &s.sites
	var ends []int64
	for i := range c.items {
		if it := &c.items[i]; it.Site.Key == site.Key && it.TID == tid {
			ends = append(ends, it.T)
		}
	}
	c.source, c.key, c.tid, c.name, c.strikes = stepclock.SourceCallSite, site.Key, tid, pin, 0
	c.lastAt = ends[len(ends)-1]
	set.log.Info("steps end at a call site", "pid", s.pid, "site", c.name, "tid", tid)
	s.enterSite(ends)
	return true
}

// mainTakesOver says whether a running call site on another thread than
// the main one gives way to a site PickSite now finds on the main thread:
// a background thread's burst (a saver's copies) that filled the stream
// when the site was first looked for never owns the step clock.
func (s *stepper) mainTakesOver(sc *stepclock.Scored) bool {
	c := &s.sites
	if c.source != stepclock.SourceCallSite || c.tid == s.pid {
		return false
	}
	p, ok := sc.Pick(s.pid)
	return ok && p.TID == s.pid
}

// outweighed is the site of the running call site's thread that recurs
// in the stream (stepclock.Qualifies) and whose iterations launch
// clearly more, as last seen (weight): the running one was found in an
// evaluation's batches.
func (s *stepper) outweighed(sc *stepclock.Scored) (stepclock.Site, bool) {
	c := &s.sites
	if s.mode != modeSite || c.source != stepclock.SourceCallSite {
		return stepclock.Site{}, false
	}
	for i := len(c.items) - 1; i >= 0; i-- {
		it := &c.items[i]
		if it.Site.Key == "" || it.Site.Key == c.key || it.TID != c.tid || c.heavier(it.Site.Key, c.key, c.tid) != 1 {
			continue
		}
		if sc.Qualifies(it.Site.Key, c.tid) {
			return it.Site, true
		}
		break
	}
	return stepclock.Site{}, false
}

// replacedBy is the site that took the running call site's place: the
// running one is no longer called, and the stream after its last call
// holds another site of its thread that recurs once an iteration
// (PickSite over that part, twice SiteMinRuns intervals) and launches
// no clearly less, as seen (weight), or no kernel at all while copying
// the same batch (SameWork): the loop changed (eager warm-up steps,
// then a captured graph's replays; compiled steps after eager ones).
// An evaluation's batches launch clearly less, a checkpoint's reads
// copy no batch: the running site waits for the training to return
// (checkSite). Lite sees no launches and keeps waiting. Until the running site's calls
// leave the stream, the running site still qualifies there, so without
// this the new loop's iterations would wait hundreds of steps for it.
func (s *stepper) replacedBy() (stepclock.Pick, bool) {
	c := &s.sites
	if s.mode != modeSite || c.source != stepclock.SourceCallSite {
		return stepclock.Pick{}, false
	}
	last, after := -1, 0
	for i := len(c.items) - 1; i >= 0; i-- {
		it := &c.items[i]
		if it.Site.Key == c.key && it.TID == c.tid {
			last = i
			break
		}
		if it.Site.Key != "" && it.TID == c.tid {
			after++
		}
	}
	if last < 0 || after <= 2*stepclock.SiteMinRuns {
		return stepclock.Pick{}, false
	}
	p, ok := stepclock.PickSite(c.items[last+1:], s.pid)
	if !ok || p.TID != c.tid || p.Site.Key == c.key || p.Runs < 2*stepclock.SiteMinRuns ||
		c.micro[stepclock.SiteID(p.TID, p.Site.Key)] {
		return stepclock.Pick{}, false
	}
	// The running loop's launches must be known (full, or auto's
	// windows): the new one launches no clearly less, or no kernel seen
	// at all (a graph's replays) while its iterations copy the same
	// batch as the running one's (a checkpoint's reads copy none).
	// The new site's weight from the stream after the running one's
	// last call: its earlier intervals span the running loop's
	// iterations (a checkpoint every 25 steps).
	was, okWas := c.weight[stepclock.SiteID(c.tid, c.key)]
	now, okNow := stepclock.Weights(c.items[last+1:])[stepclock.SiteID(p.TID, p.Site.Key)]
	switch {
	case !okWas:
		// The running loop's launches were never seen (lite): the same
		// batch copied once an iteration tells the loop that changed its
		// site (eager warm-up steps, then a graph's replays), and nothing
		// else does.
		return p, stepclock.SameData(c.items, c.key, p.Site.Key, c.tid)
	case was == 0:
		return stepclock.Pick{}, false
	case !okNow || now == 0:
		return p, stepclock.SameWork(c.items, c.key, p.Site.Key, c.tid)
	}
	return p, stepclock.Heavier(was, now) != 1
}

// heavier compares the launches an iteration of sites a and b on tid, as
// last seen (stepclock.Heavier; a site known to launch nothing between
// its calls is lighter than one that launches; 0 where either is not
// known).
func (c *siteClock) heavier(a, b string, tid uint32) int {
	wa, oka := c.weight[stepclock.SiteID(tid, a)]
	wb, okb := c.weight[stepclock.SiteID(tid, b)]
	switch {
	case !oka || !okb:
		return 0
	case wa > 0 && wb == 0:
		return 1
	case wa == 0 && wb > 0:
		return -1
	case wa == 0:
		return 0
	}
	return stepclock.Heavier(wa, wb)
}

// recent says whether the running site was called in the later half of
// the stream.
func (c *siteClock) recent() bool {
	for i := len(c.items) / 2; i < len(c.items); i++ {
		if it := &c.items[i]; it.Site.Key == c.key && it.TID == c.tid {
			return true
		}
	}
	return false
}

// enterSite hands the steps to the site: the steps the other clocks laid
// give way to the site's calls in the stream (ends) after the last gap
// delivered to the open step, or, where gaps were held, after a prologue
// window from the process's first enqueue.
func (s *stepper) enterSite(ends []int64) {
	s.flushDeferred()
	if s.mode == modeUnknown {
		s.open(s.origin, true)
	}
	if len(ends) > 1 && s.anchor == nil {
		s.giveBack(ends)
	}
	s.mode = modeSite
	s.clock, s.anchor = nil, nil
	s.period, s.phase = 0, 0
	s.warming = false
	s.lost.reset()
	for _, e := range ends {
		o := s.openStep()
		if o == nil || e <= o.Start || e <= o.lastGap {
			continue
		}
		s.boundary(e, false)
	}
}
