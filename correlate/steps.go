package correlate

import (
	"time"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

type stepMode uint8

const (
	modeUnknown stepMode = iota // no period yet; gaps are held
	modeWindow                  // fixed windows of StepWindow
	modePeriod                  // steps bounded by every P-th sync
	modeClock                   // steps counted by an enqueued operation (clock.go)
	modeSite                    // steps end at the step site's calls (stepsite.go)
)

const (
	histMax  = 64 // syncs remembered for period detection
	lossRing = 16 // recent period checks; half failing loses the lock
	// typicalGain: the typical step length is an EWMA of weight 1/typicalGain.
	typicalGain = 8
)

// gpmWaitMax: how long after a sync's end detection waits for GPM to say
// whether the device computed anything meanwhile, in event time (a GPM
// window is ~100 ms; the sampler delivers them within a second).
const gpmWaitMax = int64(2 * time.Second)

// stepAcc is a step being accumulated; closed once its end is known.
type stepAcc struct {
	Step
	closed bool
	// lastGap: the midpoint of the latest gap delivered to it, which
	// carries its number.
	lastGap int64
	// gaps: the gaps delivered to it, emitted with it.
	gaps []Gap
}

// lossCheck says when a locked step pattern is lost: half of the last
// lossRing steps (lossRing/2 at least) failed to match it.
type lossCheck struct {
	ok [lossRing]bool
	n  int
}

// record takes whether the latest step matched; it reports whether the
// pattern is lost.
func (l *lossCheck) record(same bool) bool {
	l.ok[l.n%lossRing] = same
	l.n++
	if l.n < lossRing/2 {
		return false
	}
	k, bad := min(l.n, lossRing), 0
	for i := 0; i < k; i++ {
		if !l.ok[i] {
			bad++
		}
	}
	return 2*bad > k
}

func (l *lossCheck) reset() { l.n = 0 }

// stepper is a process's step clock.
type stepper struct {
	pid    uint32 // for logs
	mode   stepMode
	origin int64
	hist   []stepclock.Sync
	n      int64
	period int
	phase  int
	// lost: whether the recent steps still match the pattern the mode
	// locked onto (the sync period or the clock).
	lost    lossCheck
	steps   []*stepAcc
	next    int64
	doneNum int64
	typical int64

	// Launch positions of marked launches (notePending): each thread's
	// launches reported unflushed, their sum, all launches flushed, and
	// the position at the last marked launch.
	pend       map[uint32]uint64
	pendSum    uint64
	flushedAll uint64
	markPos    uint64

	// The work clock (clock.go): enqueue tokens, the launches and syncs
	// since the last one, and the clock once found.
	toks      []stepclock.Token
	pendL     uint64
	pendSyncs int
	ntok      int
	// trimmed: the ring dropped a token (it no longer holds the run's
	// first).
	trimmed bool
	clock   *clockState
	// clockStrikes: checks in a row that found a better clock.
	clockStrikes int
	// workGone: a sync that may have covered compute left the history,
	// which then no longer holds the loop's first iteration.
	workGone bool
	// accum: the grouping of a clock's steps into the loop's iterations
	// (gradient accumulation) that launches showed, carried where they
	// are not seen (accum.go).
	accum *accumGroup
	// rival: a grouping learnt for another operation than the running
	// clock's (group), its own if that operation's clock takes over.
	rival *accumGroup
	lite  bool // launches are not seen (set with the clock)
	// vote: the half-step prologue rule's verdict, shared with the other
	// ranks of the process's communicators (rankstep.go).
	vote *prologueVote
	// anchor: the collective whose occurrences number the steps under the
	// clock, nil when the loop issues none (rankstep.go).
	anchor *stepAnchor
	// emitted: a step was emitted (doneNum holds its number).
	emitted bool
	// retroFrom: the first sync of the history that repeats with the
	// period found (its idx).
	retroFrom int64
	// dev is the process's device, for GPM's verdicts on spans where
	// launches were not seen (askGPM).
	dev *device
	// warming: the warm-up ran out into fixed windows and no period or
	// clock has been found since; splitWindow or splitWindowClock may
	// still cut the open window, so gaps in it are held.
	warming bool
	// sites: the step site, declared or found in the calls' stacks
	// (stepsite.go); under modeSite it ends the steps.
	sites siteClock
	// fw: the framework marker that clocks the steps once one came
	// (marker.go); it holds modeSite against the call sites.
	fw stepclock.FrameworkClock
	// fwCalls: sited calls since the latest marker; fwMost: the most
	// between two markers so far (marker.go).
	fwCalls, fwMost int
	fwSpans         int // whole intervals between two markers seen
	// loopMain: the main thread feeds the GPU itself (noteFeed); the
	// work pattern then takes only its syncs.
	loopMain bool
}

// slot is the position of the sync ev within its step, -1 when unknown,
// and the call site it is counted at ("" where positions count all syncs).
func (s *stepper) slot(ev *event.Event) (int, string) {
	if c := s.clock; s.mode == modeClock && c != nil {
		// Under the clock: syncs since the step's clock operation,
		// numbered apart from the sync period's slots so that baselines
		// taken before the clock took over do not mix in. Where the
		// syncs per step vary (scalar reads here and there) a position
		// names different syncs in different steps: no baseline.
		if !c.fixedSyncs() {
			return -1, ""
		}
		return stepclock.MaxPeriod + min(c.syncs, stepclock.MaxPeriod), ""
	}
	if s.mode == modeSite {
		// Under a step site (or marker): the sync's own call site and
		// its calls before it in the step, so that scalar reads made
		// some steps and not others do not shift the step's other
		// syncs; without a site, syncs since the step's end, numbered
		// apart from the other clocks' slots.
		if k := stepclock.SiteOf(ev.Stack).Key; k != "" {
			return min(s.sites.seen[k], stepclock.MaxPeriod), k
		}
		return 2*stepclock.MaxPeriod + min(s.sites.syncs, stepclock.MaxPeriod), ""
	}
	if s.mode != modePeriod || s.period == 0 {
		return -1, ""
	}
	return int(s.n % int64(s.period)), ""
}

// patternSync feeds one synchronisation to step detection.
func (p *proc) patternSync(x env, ev *event.Event) {
	if !p.st.loopSync(ev.TID) {
		// Another thread's sync: its launches and copies stay counted
		// for the loop's next sync.
		if p.st.onSiteCall(x.set, ev) {
			p.resolveHeld(x, false)
		}
		return
	}
	sig := stepclock.Sync{CUDA: ev.CUDA, Stream: ev.Stream, Launches: p.launches, Copies: p.copies, Colls: p.colls,
		End: ev.End, Ret: ev.End, Wait: ev.Duration(), Post: -1}
	if th := x.w.threads[ev.TID]; th != nil {
		sig.Ret = th.Returned(ev)
	}
	from := ev.Start
	if h := p.st.hist; len(h) > 0 {
		from = h[len(h)-1].End
	}
	sig.From = from
	if sig.Launches+sig.Colls == 0 {
		sig.Idle = x.set.launchesSeen(from, sig.End)
		sig.GPMWait = !sig.Idle && p.st.askGPM(x.d)
	}
	if sig.Launches > 0 {
		p.syncLaunches.push(int64(sig.Launches))
	}
	p.launches, p.copies, p.colls = 0, 0, 0
	p.st.onSync(x.set, sig)
	if p.st.onSiteCall(x.set, ev) {
		p.resolveHeld(x, false)
	}
}

// askGPM says whether to wait for GPM's verdict on a span where launches
// were not seen: the device reports GPM, or has reported nothing yet (the
// sampler's first windows may still be on their way). It remembers d for
// the verdicts.
func (s *stepper) askGPM(d *device) bool {
	s.dev = d
	return d != nil && !d.noWindows && (d.gpmEnd > 0 || d.maxEnd == 0)
}

// gpmVerdict settles one span waiting for GPM: quiet where GPM read no SM
// activity on the whole device throughout, and done once GPM reported on
// it, the device showed it sends none, or last (the newest sync or token)
// is gpmWaitMax past it. Without launches (lite) this is how a model's
// setup, copying its parameters one by one with a sync after each, is told
// from a loop: the GPU computes nothing during it.
func (s *stepper) gpmVerdict(from, end, last int64) (quiet, done bool) {
	if s.dev == nil {
		return false, true
	}
	none, known := s.dev.noCompute(from, end)
	return none && known, known || last-end > gpmWaitMax
}

// gpmVerdicts settles the syncs waiting for GPM.
func (s *stepper) gpmVerdicts() {
	if len(s.hist) == 0 {
		return
	}
	last := s.hist[len(s.hist)-1].End
	for i := range s.hist {
		if h := &s.hist[i]; h.GPMWait {
			if quiet, done := s.gpmVerdict(h.From, h.End, last); done {
				h.Idle, h.GPMWait = quiet, false
			}
		}
	}
}

// settled is the history up to the first sync still waiting for GPM.
func (s *stepper) settled() []stepclock.Sync {
	for i := range s.hist {
		if s.hist[i].GPMWait {
			return s.hist[:i]
		}
	}
	return s.hist
}

// setPost records, at the first enqueue after the last sync, how long the
// host took from that sync's return: time spent waiting for a CPU after
// the wakeup is contention, not the host fetching the next batch. A host
// operation's syncs are passed over: the pause is the last other sync's.
func (s *stepper) setPost(t int64) {
	for i := len(s.hist) - 1; i >= 0; i-- {
		h := &s.hist[i]
		if h.InOp {
			continue
		}
		if h.Post < 0 {
			h.Post = max(t-h.Ret, 0)
		}
		return
	}
}

// hostOp says that the syncs absorbed into the gap that began at since
// were a host operation's (its episode became bulk). Those before the
// latest one already marked were marked with it.
func (s *stepper) hostOp(since int64) {
	for i := len(s.hist) - 1; i >= 0 && s.hist[i].End > since && !s.hist[i].InOp; i-- {
		if h := &s.hist[i]; h.Absorbed {
			h.InOp, h.Post = true, 0
		}
	}
}

func (s *stepper) onSync(set settings, sig stepclock.Sync) {
	sig.Idx = s.n
	s.n++
	s.pendSyncs++
	s.hist = append(s.hist, sig)
	if len(s.hist) > histMax {
		s.forget(s.hist[:len(s.hist)-histMax])
		copy(s.hist, s.hist[len(s.hist)-histMax:])
		s.hist = s.hist[:histMax]
	}
	switch s.mode {
	case modeSite:
		// The site's calls end the steps (onSiteCall).
		s.sites.syncs++
	case modeClock:
		s.clock.syncs++
		if s.pendSyncs > s.clock.stopAfter {
			set.log.Info("step clock stopped, falling back to fixed windows", "pid", s.pid)
			s.toWindows(sig.End)
		}
	case modePeriod:
		P := s.period
		h := len(s.hist)
		if h > P {
			if s.lost.record(stepclock.SameSync(&s.hist[h-1], &s.hist[h-1-P])) {
				set.log.Info("step pattern lost, falling back to fixed windows", "pid", s.pid)
				s.toWindows(sig.End)
				return
			}
		}
		if int(sig.Idx%int64(P)) == s.phase {
			s.boundary(sig.End, false)
		}
	case modeUnknown, modeWindow:
		if s.period == 0 {
			s.gpmVerdicts()
			if P, ph, from, ok := stepclock.DetectPeriod(s.settled()); ok {
				// The syncs repeat, but do the steps they make hold the
				// same work? A clock that disagrees wins.
				if s.tryClock(set) {
					return
				}
				if s.mode == modeUnknown && (!set.lite && s.awaitMarks() || s.awaitSite()) {
					return
				}
				s.period, s.phase, s.retroFrom = P, ph, from
				set.log.Debug("step period found", "pid", s.pid, "syncs_per_step", P)
				if s.mode == modeUnknown {
					s.retro()
					return
				}
			}
		}
		if s.mode == modeWindow && s.period > 0 && int(sig.Idx%int64(s.period)) == s.phase {
			s.splitWindow(set)
			s.tick(set, sig.End)
			s.boundary(sig.End, false)
			s.mode = modePeriod
			s.lost.reset()
		}
	}
}

// retro lays steps over the history once a period is found while gaps were
// held: a prologue window up to the first boundary, then one step per
// period. No step ends at the syncs known to have covered no compute
// before the first that did: they are prologue (a model's setup copying
// its parameters).
func (s *stepper) retro() {
	from := 0
	for from < len(s.hist)-1 && s.hist[from].Idle {
		from++
	}
	first := true
	for i := range s.hist {
		h := &s.hist[i]
		if i < from || int(h.Idx%int64(s.period)) != s.phase {
			continue
		}
		if first {
			first = false
			if h.End > s.origin {
				// The prologue is a real first step when the history
				// reaches back to the first sync and this is the first
				// boundary; otherwise it is warm-up of unknown shape.
				// Where the history holds the setup's syncs too, the
				// setup is a window of its own up to its last sync, and
				// the loop's first iteration a step from there.
				whole := s.hist[0].Idx == 0
				firstStep := whole && h.Idx < int64(s.period)
				setupEnd := int64(0)
				if whole && from > 0 {
					setupEnd = s.hist[from-1].End
				}
				s.open(s.origin, !firstStep)
				if setupEnd > s.origin && setupEnd < h.End {
					s.boundary(setupEnd, false)
				}
			}
		}
		s.boundary(h.End, false)
	}
	s.mode = modePeriod
	s.lost.reset()
}

// splitWindow lays the period's boundaries over the open fixed window
// once a period is found: a first iteration that waited long (for a peer
// rank's collective, a tracer's probes) ran the warm-up out and opened a
// window, and the period, found only after a few iterations of fresh
// history, would otherwise end that window at its first boundary, making
// those iterations one step. The window's gaps were emitted with its
// number: only boundaries after the last of them split it. No step ends at
// the syncs known to have covered no compute before the first that did
// (retro).
func (s *stepper) splitWindow(set settings) {
	o := s.openStep()
	if o == nil || !o.Window {
		return
	}
	// Where the history holds the loop's first syncs, the window its
	// first boundary after compute ends in holds the loop's first
	// iteration's end: it is that iteration (a first iteration that
	// autotuned for long ran the warm-up out).
	first := !s.workGone
	work := false
	n := 0
	for i := 0; i+1 < len(s.hist); i++ {
		h := &s.hist[i]
		work = work || !h.Idle
		first = first && !h.GPMWait
		if !work || int(h.Idx%int64(s.period)) != s.phase {
			continue
		}
		n++
		if h.Idx < s.retroFrom {
			continue
		}
		o := s.openStep()
		if o == nil || h.End <= o.Start || h.End <= o.lastGap {
			continue
		}
		if o.Window && first && n == 1 {
			o.Window = false
		}
		s.tick(set, h.End)
		s.boundary(h.End, false)
	}
}

// forget notes syncs leaving the history: once one that may have covered
// compute has, the history no longer holds the loop's first iteration.
func (s *stepper) forget(h []stepclock.Sync) {
	for i := range h {
		s.workGone = s.workGone || !h[i].Idle
	}
}

// openStep is the open step, nil when none is open.
func (s *stepper) openStep() *stepAcc {
	if n := len(s.steps); n > 0 && !s.steps[n-1].closed {
		return s.steps[n-1]
	}
	return nil
}

func (s *stepper) open(t int64, window bool) {
	st := &stepAcc{}
	st.Number = s.next
	s.next++
	st.Start = t
	st.Window = window
	st.ByCause = map[Cause]int64{}
	s.steps = append(s.steps, st)
}

// boundary closes the open step at t and opens the next one.
func (s *stepper) boundary(t int64, window bool) {
	s.sites.syncs = 0
	clear(s.sites.seen)
	if n := len(s.steps); n > 0 && !s.steps[n-1].closed {
		o := s.steps[n-1]
		if t <= o.Start {
			o.Window = window
			return
		}
		o.End, o.closed = t, true
		o.ClockSource, o.ClockSite = s.clockSource()
		o.ClockSettling = s.clockSettling()
		if !o.Window {
			d := t - o.Start
			if s.typical == 0 {
				s.typical = d
			} else {
				s.typical += (d - s.typical) / typicalGain
			}
		}
	}
	s.open(t, window)
	if s.anchor != nil {
		s.renumber(len(s.steps) - 2)
	}
}

func (s *stepper) closeOpen(t int64) {
	s.flushDeferred()
	switch s.mode {
	case modeClock:
		// No next clock operation will come: the last iteration ended at
		// its last sync, like every other one.
		t = s.stepEnd(t)
	case modeSite:
		// The last iteration ended at the site's last call; what came
		// after is teardown.
		t = s.sites.lastAt
	case modePeriod:
		// Every step ends at a sync: after the loop's last one the
		// process tears down, which is no iteration (none when no sync
		// followed the last boundary).
		last := s.openStart()
		for i := range s.hist {
			if h := &s.hist[i]; h.End > last && h.End <= t {
				last = h.End
			}
		}
		t = last
	}
	if n := len(s.steps); n > 0 && !s.steps[n-1].closed {
		o := s.steps[n-1]
		if t <= o.Start {
			s.steps = s.steps[:n-1]
			s.next--
			return
		}
		o.End, o.closed = t, true
		o.ClockSource, o.ClockSite = s.clockSource()
		o.ClockSettling = s.clockSettling()
		if s.anchor != nil {
			s.renumber(n - 1)
		}
	}
}

// toWindows switches to fixed windows starting at t.
func (s *stepper) toWindows(t int64) {
	s.flushDeferred()
	s.mode = modeWindow
	s.clock = nil
	s.anchor = nil
	s.period, s.phase = 0, 0
	s.forget(s.hist)
	s.hist = s.hist[:0]
	s.boundary(t, true)
}

// tick advances fixed windows up to t, and gives up on a period whose step
// has not ended for far longer than steps usually take (an eval phase, a
// training loop that stopped syncing).
func (s *stepper) tick(set settings, t int64) {
	n := len(s.steps)
	if n == 0 || s.steps[n-1].closed {
		return
	}
	o := s.steps[n-1]
	switch s.mode {
	case modeWindow:
		w := set.stepWindow
		if k := (t - o.Start) / w; k > maxPendingSteps {
			// A clock jump or a long silence: skip the empty windows
			// rather than materialise them.
			s.boundary(o.Start+w, true)
			s.steps[len(s.steps)-1].Start = o.Start + k*w
			o = s.steps[len(s.steps)-1]
		}
		for o.Start+w <= t {
			s.boundary(o.Start+w, true)
			o = s.steps[len(s.steps)-1]
		}
	case modeSite:
		// A declared site holds however long an iteration takes; a found
		// one gives way to fixed windows like the work pattern (the loop
		// ended, or moved on), and is found again when it resumes.
		if s.sites.source != stepclock.SourceDeclared && s.typical > 0 && t-o.Start > max(siteLost*s.typical, periodLost) {
			s.fw, s.fwCalls, s.fwMost, s.fwSpans = stepclock.FrameworkClock{}, 0, 0, 0
			set.log.Info("no step at the call site for long, falling back to fixed windows", "pid", s.pid, "site", s.sites.name)
			s.sites.key, s.sites.source = "", ""
			s.toWindows(t)
		}
	case modePeriod, modeClock:
		if s.typical > 0 && t-o.Start > max(10*s.typical, periodLost) {
			set.log.Info("no step boundary for long, falling back to fixed windows", "pid", s.pid)
			s.toWindows(t)
		}
	}
}
