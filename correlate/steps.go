package correlate

import (
	"sort"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

type stepMode uint8

const (
	modeUnknown stepMode = iota // no period yet; gaps are held
	modeWindow                  // fixed windows of StepWindow
	modePeriod                  // steps bounded by every P-th sync
	modeClock                   // steps counted by an enqueued operation (clock.go)
)

const (
	histMax   = 64 // syncs remembered for period detection
	maxPeriod = 16 // most syncs per step considered
	matchMin  = 0.8
	lossRing  = 16 // recent period checks; half failing loses the lock
	// launchJitter, launchJitterRel: launch counts of two syncs this close
	// are the same step shape (data-dependent control flow adds a few).
	launchJitter    = 2
	launchJitterRel = 0.05
	// detectMin syncs at least are compared, over the last detectPeriods
	// periods or detectWindow syncs, whichever is more.
	detectMin     = 4
	detectPeriods = 4
	detectWindow  = 12
	// typicalGain: the typical step length is an EWMA of weight 1/typicalGain.
	typicalGain = 8
	// batchFetchMin: the host time after a sync that marks fetching the
	// next batch, when it is also twice any other sync's.
	batchFetchMin = int64(200 * time.Microsecond)
)

// syncSig is what one synchronisation looked like; steps are where the
// sequence of signatures repeats.
type syncSig struct {
	cuda     event.CUDA
	stream   uint64
	launches uint64
	copies   uint64
	colls    uint64
	end      int64 // the GPU was done (the wakeup, where known)
	ret      int64 // the call returned
	wait     int64
	idx      int64
	// post is the host time from the sync's return to the next enqueue,
	// -1 until known: fetching the next batch makes it longest after the
	// step's last sync.
	post int64
	// idle: every launch since the previous sync was seen (full, or a
	// window of auto) and there was none, nor a collective; or, with
	// launches unseen (lite), GPM read zero SM activity on the whole
	// device all the while: the sync covered no GPU compute.
	idle bool
	// from is where the span the sync covered began (the previous sync's
	// end, or its own start).
	from int64
	// gpmWait: launches were not seen and GPM has not yet reported on
	// the span; detection leaves the sync out until it does (gpmWaitMax).
	gpmWait bool
	// absorbed: the sync only waited for copies of device data into an
	// open gap (episode.go); inOp: they were a host operation's (a bulk
	// episode, torch.save), which lies between two iterations: no step
	// ends at its syncs, and the pause after the sync before it lasts
	// through it.
	absorbed, inOp bool
}

// gpmWaitMax: how long after a sync's end detection waits for GPM to say
// whether the device computed anything meanwhile, in event time (a GPM
// window is ~100 ms; the sampler delivers them within a second).
const gpmWaitMax = int64(2 * time.Second)

func sigEq(a, b *syncSig) bool {
	if a.cuda != b.cuda || a.stream != b.stream || a.copies != b.copies || a.colls != b.colls {
		return false
	}
	x, y := a.launches, b.launches
	if x < y {
		x, y = y, x
	}
	// Launch counts jitter slightly with data-dependent control flow.
	return x-y <= launchJitter || float64(x-y) <= launchJitterRel*float64(x)
}

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
	hist   []syncSig
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
	toks      []token
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
	lite  bool // launches are not seen (set with the clock)
	// vote: the half-step prologue rule's verdict, shared with the other
	// ranks of the process's communicators (ranks.go).
	vote *prologueVote
	// anchor: the collective whose occurrences number the steps under the
	// clock, nil when the loop issues none (ranks.go).
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
}

// slot is the position of the next sync within a step, -1 when unknown.
func (s *stepper) slot() int {
	if c := s.clock; s.mode == modeClock && c != nil {
		// Under the clock: syncs since the step's clock operation,
		// numbered apart from the sync period's slots so that baselines
		// taken before the clock took over do not mix in. Where the
		// syncs per step vary (scalar reads here and there) a position
		// names different syncs in different steps: no baseline.
		if !c.fixedSyncs() {
			return -1
		}
		return maxPeriod + min(c.syncs, maxPeriod)
	}
	if s.mode != modePeriod || s.period == 0 {
		return -1
	}
	return int(s.n % int64(s.period))
}

// patternSync feeds one synchronisation to step detection.
func (p *proc) patternSync(x env, ev *event.Event) {
	sig := syncSig{cuda: ev.CUDA, stream: ev.Stream, launches: p.launches, copies: p.copies, colls: p.colls,
		end: ev.End, ret: ev.End, wait: ev.Duration(), post: -1}
	if th := x.w.threads[ev.TID]; th != nil {
		sig.ret = th.returned(ev)
	}
	from := ev.Start
	if h := p.st.hist; len(h) > 0 {
		from = h[len(h)-1].end
	}
	sig.from = from
	if sig.launches+sig.colls == 0 {
		sig.idle = x.set.launchesSeen(from, sig.end)
		sig.gpmWait = !sig.idle && p.st.askGPM(x.d)
	}
	if sig.launches > 0 {
		p.syncLaunches.push(int64(sig.launches))
	}
	p.launches, p.copies, p.colls = 0, 0, 0
	p.st.onSync(x.set, sig)
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
	last := s.hist[len(s.hist)-1].end
	for i := range s.hist {
		if h := &s.hist[i]; h.gpmWait {
			if quiet, done := s.gpmVerdict(h.from, h.end, last); done {
				h.idle, h.gpmWait = quiet, false
			}
		}
	}
}

// settled is the history up to the first sync still waiting for GPM.
func (s *stepper) settled() []syncSig {
	for i := range s.hist {
		if s.hist[i].gpmWait {
			return s.hist[:i]
		}
	}
	return s.hist
}

// returned is when a sync returned to its caller: a sync ended at its
// wakeup (wokenSync) returned once the thread got a CPU back.
func (t *thread) returned(sync *event.Event) int64 {
	for i := len(t.tl) - 1; i >= 0; i-- {
		r := &t.tl[i]
		if r.End <= sync.Start {
			break
		}
		if r.Kind == event.KindRunqueue && r.Woken && r.Start == sync.End {
			return r.End
		}
	}
	return sync.End
}

// setPost records, at the first enqueue after the last sync, how long the
// host took from that sync's return: time spent waiting for a CPU after
// the wakeup is contention, not the host fetching the next batch. A host
// operation's syncs are passed over: the pause is the last other sync's.
func (s *stepper) setPost(t int64) {
	for i := len(s.hist) - 1; i >= 0; i-- {
		h := &s.hist[i]
		if h.inOp {
			continue
		}
		if h.post < 0 {
			h.post = max(t-h.ret, 0)
		}
		return
	}
}

// hostOp says that the syncs absorbed into the gap that began at since
// were a host operation's (its episode became bulk). Those before the
// latest one already marked were marked with it.
func (s *stepper) hostOp(since int64) {
	for i := len(s.hist) - 1; i >= 0 && s.hist[i].end > since && !s.hist[i].inOp; i-- {
		if h := &s.hist[i]; h.absorbed {
			h.inOp, h.post = true, 0
		}
	}
}

func (s *stepper) onSync(set settings, sig syncSig) {
	sig.idx = s.n
	s.n++
	s.pendSyncs++
	s.hist = append(s.hist, sig)
	if len(s.hist) > histMax {
		s.forget(s.hist[:len(s.hist)-histMax])
		copy(s.hist, s.hist[len(s.hist)-histMax:])
		s.hist = s.hist[:histMax]
	}
	switch s.mode {
	case modeClock:
		s.clock.syncs++
		if s.pendSyncs > s.clock.stopAfter {
			set.log.Info("step clock stopped, falling back to fixed windows", "pid", s.pid)
			s.toWindows(sig.end)
		}
	case modePeriod:
		P := s.period
		h := len(s.hist)
		if h > P {
			if s.lost.record(sigEq(&s.hist[h-1], &s.hist[h-1-P])) {
				set.log.Info("step pattern lost, falling back to fixed windows", "pid", s.pid)
				s.toWindows(sig.end)
				return
			}
		}
		if int(sig.idx%int64(P)) == s.phase {
			s.boundary(sig.end, false)
		}
	case modeUnknown, modeWindow:
		if s.period == 0 {
			s.gpmVerdicts()
			if P, ph, from, ok := detect(s.settled()); ok {
				// The syncs repeat, but do the steps they make hold the
				// same work? A clock that disagrees wins.
				if s.tryClock(set) {
					return
				}
				if s.mode == modeUnknown && !set.lite && s.awaitMarks() {
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
		if s.mode == modeWindow && s.period > 0 && int(sig.idx%int64(s.period)) == s.phase {
			s.splitWindow(set)
			s.tick(set, sig.end)
			s.boundary(sig.end, false)
			s.mode = modePeriod
			s.lost.reset()
		}
	}
}

// detect finds the smallest P for which recent signatures repeat, the
// phase whose sync waits longest (the end of the step's work), and the idx
// of the first sync of the stretch that repeats. Repeats
// known to have launched no kernel and issued no collective are not a
// loop's steps: a model's setup copies its parameters one by one, each
// followed by a sync, in a pattern that repeats layer after layer, and no
// kernel runs.
func detect(hist []syncSig) (period, phase int, from int64, ok bool) {
	for P := 1; P <= maxPeriod; P++ {
		need := max(2*P, detectMin)
		if len(hist) < P+need {
			break
		}
		lo := max(P, len(hist)-max(detectPeriods*P, detectWindow))
		cmp, match := 0, 0
		for i := lo; i < len(hist); i++ {
			cmp++
			if sigEq(&hist[i], &hist[i-P]) {
				match++
			}
		}
		if cmp < need || float64(match) < matchMin*float64(cmp) {
			continue
		}
		if idle(hist[lo-P+1:]) {
			continue
		}
		return P, phaseOf(hist[lo-P:], P), hist[lo-P].idx, true
	}
	return 0, 0, 0, false
}

// idle says whether the syncs are all known to have covered no compute.
func idle(h []syncSig) bool {
	for i := range h {
		if !h[i].idle {
			return false
		}
	}
	return true
}

// retro lays steps over the history once a period is found while gaps were
// held: a prologue window up to the first boundary, then one step per
// period. No step ends at the syncs known to have covered no compute
// before the first that did: they are prologue (a model's setup copying
// its parameters).
func (s *stepper) retro() {
	from := 0
	for from < len(s.hist)-1 && s.hist[from].idle {
		from++
	}
	first := true
	for i := range s.hist {
		h := &s.hist[i]
		if i < from || int(h.idx%int64(s.period)) != s.phase {
			continue
		}
		if first {
			first = false
			if h.end > s.origin {
				// The prologue is a real first step when the history
				// reaches back to the first sync and this is the first
				// boundary; otherwise it is warm-up of unknown shape.
				// Where the history holds the setup's syncs too, the
				// setup is a window of its own up to its last sync, and
				// the loop's first iteration a step from there.
				whole := s.hist[0].idx == 0
				firstStep := whole && h.idx < int64(s.period)
				setupEnd := int64(0)
				if whole && from > 0 {
					setupEnd = s.hist[from-1].end
				}
				s.open(s.origin, !firstStep)
				if setupEnd > s.origin && setupEnd < h.end {
					s.boundary(setupEnd, false)
				}
			}
		}
		s.boundary(h.end, false)
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
		work = work || !h.idle
		first = first && !h.gpmWait
		if !work || int(h.idx%int64(s.period)) != s.phase {
			continue
		}
		n++
		if h.idx < s.retroFrom {
			continue
		}
		o := s.openStep()
		if o == nil || h.end <= o.Start || h.end <= o.lastGap {
			continue
		}
		if o.Window && first && n == 1 {
			o.Window = false
		}
		s.tick(set, h.end)
		s.boundary(h.end, false)
	}
}

// forget notes syncs leaving the history: once one that may have covered
// compute has, the history no longer holds the loop's first iteration.
func (s *stepper) forget(h []syncSig) {
	for i := range h {
		s.workGone = s.workGone || !h[i].idle
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
	if n := len(s.steps); n > 0 && !s.steps[n-1].closed {
		o := s.steps[n-1]
		if t <= o.Start {
			o.Window = window
			return
		}
		o.End, o.closed = t, true
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
	case modePeriod:
		// Every step ends at a sync: after the loop's last one the
		// process tears down, which is no iteration (none when no sync
		// followed the last boundary).
		last := s.openStart()
		for i := range s.hist {
			if h := &s.hist[i]; h.end > last && h.end <= t {
				last = h.end
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
	case modePeriod, modeClock:
		if s.typical > 0 && t-o.Start > max(10*s.typical, periodLost) {
			set.log.Info("no step boundary for long, falling back to fixed windows", "pid", s.pid)
			s.toWindows(t)
		}
	}
}

// lookup returns the pending step containing t.
func (s *stepper) lookup(set settings, t int64) *stepAcc {
	if s.mode == modeWindow {
		s.tick(set, t)
	}
	for i := len(s.steps) - 1; i >= 0; i-- {
		if s.steps[i].Start <= t {
			return s.steps[i]
		}
	}
	return nil
}

// ready says whether every input of step st is final.
func (p *proc) ready(x env, st *stepAcc) bool {
	if x.clk.wm < st.End {
		return false
	}
	for i := range p.held {
		if p.held[i].Start < st.End {
			return false
		}
	}
	if p.gap != nil && p.gap.start < st.End {
		return false
	}
	for _, c := range p.cands {
		if c.lo < st.End {
			return false
		}
	}
	for _, s := range p.stalls {
		if s.gap.Start < st.End {
			return false
		}
	}
	if p.aheadStart != 0 && p.aheadStart < st.End {
		return false
	}
	if wEnd := x.d.coverEnd(st.End); wEnd > 0 && x.clk.wm >= wEnd {
		return true
	}
	return x.clk.now-st.End >= windowWait
}

// finalizeSteps emits closed steps whose inputs are final, in order.
func (p *proc) finalizeSteps(x env, force bool) {
	s := &p.st
	if p.settleVote(x, force) {
		return
	}
	k := 0
	for k < len(s.steps) {
		st := s.steps[k]
		if !st.closed {
			break
		}
		if !force && !p.ready(x, st) {
			if len(s.steps)-k <= maxPendingSteps {
				break
			}
			x.set.log.Warn("step waited too long for its inputs, emitting it incomplete", "pid", p.pid, "step", st.Number)
			p.out.incomplete++
		}
		p.finishStep(x, st)
		s.doneNum, s.emitted = st.Number, true
		k++
	}
	if k > 0 {
		copy(s.steps, s.steps[k:])
		for i := len(s.steps) - k; i < len(s.steps); i++ {
			s.steps[i] = nil
		}
		s.steps = s.steps[:len(s.steps)-k]
		keep := p.keepFrom(x.clk.wm)
		j := 0
		// Windows reach back before the oldest pending step: keep a margin.
		for j < len(p.launchRec) && p.launchRec[j].t < keep-retain {
			j++
		}
		if j > 0 {
			p.recFrom = p.launchRec[j-1].t
			p.launchRec = append(p.launchRec[:0], p.launchRec[j:]...)
		}
	}
}

// phaseOf picks which sync of a period ends the step: the one after which
// the host takes clearly longest to enqueue again (it fetches the next
// batch), else the one that waits longest (the end of the step's work).
func phaseOf(h []syncSig, P int) int {
	if P == 1 {
		return 0
	}
	median := func(r int, f func(*syncSig) int64) int64 {
		var v []int64
		for i := range h {
			if int(h[i].idx%int64(P)) == r {
				if x := f(&h[i]); x >= 0 {
					v = append(v, x)
				}
			}
		}
		if len(v) == 0 {
			return -1
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[len(v)/2]
	}
	// A sync followed at once by another sync (one per stream, say) does
	// not end the step: only syncs after which work is enqueued qualify.
	ok := make([]bool, P)
	any := false
	for i := range h {
		r := int((h[i].idx + int64(P) - 1) % int64(P))
		if h[i].launches+h[i].copies+h[i].colls > 0 && !ok[r] {
			ok[r], any = true, true
		}
	}
	if !any {
		for r := range ok {
			ok[r] = true
		}
	}
	best, first, second := -1, int64(-1), int64(-1)
	for r := 0; r < P; r++ {
		if !ok[r] {
			continue
		}
		m := median(r, func(s *syncSig) int64 { return s.post })
		if m > first {
			best, first, second = r, m, first
		} else if m > second {
			second = m
		}
	}
	if best >= 0 && first >= batchFetchMin && first >= 2*max(second, 0) {
		return best
	}
	best, first = 0, -1
	for r := 0; r < P; r++ {
		if !ok[r] {
			continue
		}
		if m := median(r, func(s *syncSig) int64 { return s.wait }); m > first {
			best, first = r, m
		}
	}
	return best
}
