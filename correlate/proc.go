package correlate

import (
	"slices"
	"sort"

	"github.com/gaptrace/gaptrace/event"
)

// stream is the queue model of one CUDA stream of a process.
type stream struct {
	pending int64 // first enqueue since the stream was last drained; 0 when drained
	lastEnq int64
	coll    *CollectiveEvidence // last collective enqueued since the drain
}

// openGap is a drained queue waiting for its next enqueue.
type openGap struct {
	start int64
	tid   uint32 // thread whose sync drained the queue
	exact bool   // the sync waited, so start is the drain to the µs
}

// aheadCand is an interval where a feeder blocked while its queue still
// held work; the GPU windows decide how much of it was idle.
type aheadCand struct {
	tid    uint32
	lo, hi int64
	// drain is when the queue most likely ran dry: the last enqueue plus
	// the usual time a waiting sync took to see the queue drain after the
	// last enqueue. 0 when too few syncs waited yet.
	drain int64
	// lead (lite) is the usual time from a drained sync's return to the
	// next work the probes see: the launches before it are invisible, so
	// the GPU idled from lo to about hi - lead (placed at the start).
	lead int64
}

// stallCand is a comm stall waiting for GPM windows to confirm it.
// gpmOnly: no baseline set the wait apart from compute (a peer that is
// late in every step from the first one), so the GPU alone decides
// whether, and how much of, the wait was spent spinning on the peer.
type stallCand struct {
	gap     Gap
	gpmOnly bool
}

type tcount struct {
	t int64
	n uint64
}

// baseKey names a sync's place in the step. Whether the pending work
// held a collective is deliberately not part of it: a trainer may issue a
// collective only in some steps, and those must be compared with the
// steps without it.
type baseKey struct {
	cuda   event.CUDA
	stream uint64
	slot   int
}

// waitRing holds the recent waits of one sync slot.
type waitRing struct {
	v [32]int64
	n int
}

func (r *waitRing) push(x int64) { r.v[r.n%len(r.v)] = x; r.n++ }

// recentMedian is the median of the last k values pushed (fewer when fewer
// were): the latest steps say best what this step's work looks like.
func (r *waitRing) recentMedian(k int) int64 {
	k = min(k, r.n, len(r.v))
	v := make([]int64, 0, k)
	for i := 1; i <= k; i++ {
		v = append(v, r.v[(r.n-i)%len(r.v)])
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// low is the lower quartile of the values held: what an ordinary step
// takes. Not the minimum: one step that reached its sync unusually (a
// host delay in lite, an outlier) would lower the baseline for the whole
// ring and turn every ordinary step after it into a false stall.
func (r *waitRing) low() int64 {
	k := min(r.n, len(r.v))
	v := slices.Clone(r.v[:k])
	slices.Sort(v)
	return v[(k-1)/4]
}

// tidSet is a small ordered set of thread ids (feeders are few).
type tidSet []uint32

func (s tidSet) has(t uint32) bool {
	for _, x := range s {
		if x == t {
			return true
		}
	}
	return false
}

func (s *tidSet) add(t uint32) {
	if !s.has(t) {
		*s = append(*s, t)
		sort.Slice(*s, func(i, j int) bool { return (*s)[i] < (*s)[j] })
	}
}

// proc is one traced process: its place in the tree and, once it feeds a
// GPU, its queue model, pending decisions and step clock.
type proc struct {
	pid     uint32
	parent  uint32
	comm    string
	dev     int
	first   int64
	last    int64
	tids    map[uint32]struct{}
	feeders tidSet

	streams map[uint64]*stream
	everEnq bool
	gap     *openGap
	lastEnq int64

	aheadStart int64
	aheadTID   uint32
	// aheadBlocked is how long the feeder was blocked since aheadStart.
	aheadBlocked int64
	// drains holds, for recent syncs that waited, the time from the last
	// enqueue to the drain: how long the queued work of a step runs.
	drains waitRing
	// leads (lite) holds the recent times from a drained sync's return to
	// the next work the probes saw.
	leads  waitRing
	cands  []aheadCand
	stalls []stallCand
	held   []Gap

	launches, copies, colls uint64
	launchRec               []tcount // flushed launch counts, by time
	recFrom                 int64    // start of the interval of launchRec[0]
	base                    map[baseKey]*waitRing

	st stepper

	exitedAt int64 // when the process exited; 0 while it runs

	// out holds what the models decided and the engine has not applied yet.
	out outbox
}

// outbox is what a process's models decided during one call into them:
// final gaps (their step assigned) and finished steps, in decision order,
// and how many candidates they rejected. Only the engine turns them into
// sink calls and totals.
type outbox struct {
	ds       []decision
	rejected uint64
}

// decision is one result: a gap, or a step with the cause split of its
// micro idle (the part of its ByCause no gap delivered).
type decision struct {
	gap   *Gap
	step  *Step
	micro []causeNS
}

func (o *outbox) gap(g Gap) { o.ds = append(o.ds, decision{gap: &g}) }

func (o *outbox) step(st Step, micro []causeNS) {
	o.ds = append(o.ds, decision{step: &st, micro: micro})
}

func (o *outbox) reset() {
	clear(o.ds)
	o.ds, o.rejected = o.ds[:0], 0
}

// settled reports whether nothing of the process waits to be emitted.
func (p *proc) settled() bool {
	return len(p.st.steps) == 0 && len(p.cands) == 0 && len(p.stalls) == 0 && len(p.held) == 0
}

func newProc(pid uint32, dev int, t int64) *proc {
	return &proc{
		pid:     pid,
		dev:     dev,
		first:   t,
		tids:    map[uint32]struct{}{},
		streams: map[uint64]*stream{},
		base:    map[baseKey]*waitRing{},
		st:      stepper{pid: pid, next: 1},
	}
}

func (p *proc) stream(id uint64) *stream {
	s := p.streams[id]
	if s == nil {
		s = &stream{}
		p.streams[id] = s
	}
	return s
}

func (p *proc) allDrained() bool {
	for _, s := range p.streams {
		if s.pending != 0 {
			return false
		}
	}
	return true
}

func (p *proc) startGPU(t int64) {
	if !p.everEnq {
		p.everEnq = true
		p.st.origin = t
	}
}

func (p *proc) onEnqueue(x env, th *thread, ev *event.Event, coll *CollectiveEvidence) {
	p.feeders.add(th.tid)
	t := ev.Start
	switch ev.Kind {
	case event.KindEnqueue:
		p.launches += ev.Count
		p.recLaunches(t, ev.Count)
	case event.KindMemcpyAsync:
		p.copies++
	case event.KindCollective:
		p.colls++
	}
	if h := p.st.hist; len(h) > 0 && h[len(h)-1].post < 0 {
		h[len(h)-1].post = max(t-h[len(h)-1].end, 0)
	}
	if p.gap != nil {
		p.closeGap(x, th, t)
	}
	p.endAhead(x.set, t, true, false)
	s := p.stream(ev.Stream)
	if s.pending == 0 {
		s.pending = t
	}
	s.lastEnq = t
	if ev.Kind == event.KindCollective {
		s.coll = coll
	}
	if t > p.lastEnq {
		p.lastEnq = t
	}
	p.startGPU(t)
}

// drainStreams marks the streams a sync covers as drained and returns the
// collective their pending work held, if any. Work enqueued after the sync
// began is not covered. A stream sync also covers other streams whose last
// work predates the synced stream's last work: training loops hand side
// streams' results (batch copies) to the main stream through events, which
// are not traced, so that work is done when the main stream is.
func (p *proc) drainStreams(ev *event.Event) *CollectiveEvidence {
	// The legacy default stream (0) is not special here: frameworks create
	// their side streams non-blocking, so syncing stream 0 does not wait
	// for them; the rule below covers their earlier work.
	all := ev.CUDA == event.CUCtxSynchronize || ev.Kind == event.KindFree
	var ref int64
	if !all {
		if s := p.streams[ev.Stream]; s != nil {
			ref = s.lastEnq
		}
	}
	var coll *CollectiveEvidence
	for id, s := range p.streams {
		if s.pending == 0 || s.lastEnq > ev.Start {
			continue
		}
		if all || id == ev.Stream || s.lastEnq <= ref {
			if s.coll != nil {
				coll = s.coll
			}
			s.pending, s.coll = 0, nil
		}
	}
	return coll
}

func (p *proc) onSync(x env, th *thread, ev *event.Event) {
	p.feeders.add(th.tid)
	if ev.Count > 0 {
		p.launches += ev.Count
		p.recLaunches(ev.Start, ev.Count)
	}
	if !p.everEnq {
		return
	}
	waited := ev.Duration() > x.set.syncWaited
	if p.gap != nil {
		switch {
		case x.set.lite:
			// Launches are invisible in lite: the sync says work resumed.
			p.closeGap(x, th, ev.Start)
		case waited:
			// The GPU had work the tracer did not show (lost events): the
			// open gap is not trustworthy.
			p.out.rejected++
			p.gap = nil
		}
	}
	pendingBefore := !p.allDrained()
	coll := p.drainStreams(ev)
	if waited && pendingBefore {
		p.checkStall(x.set, th, ev, coll)
		d := x.d
		d.busy = addSpan(d.busy, span{ev.Start, ev.End})
		if p.lastEnq > 0 && p.lastEnq <= ev.Start {
			p.drains.push(ev.End - p.lastEnq)
		}
	}
	// A sync that returned at once found the queue empty: the GPU idled
	// somewhere in [blocking start, sync start]. One that waited long proves
	// the GPU was busy all along; a short wait can be the call's own cost on
	// a loaded host, and the usual drain time then says where the queue ran
	// dry.
	switch {
	case !waited:
		p.endAhead(x.set, ev.Start, true, false)
	case ev.Duration() < x.set.minGap:
		p.endAhead(x.set, ev.Start, true, true)
	default:
		p.endAhead(x.set, ev.Start, false, false)
	}
	p.patternSync(x.set, ev)
	if p.gap == nil && p.allDrained() {
		p.gap = &openGap{start: ev.End, tid: th.tid, exact: waited}
	}
}

// onSyncCopy handles a synchronous copy or a free. While work is pending it
// completes after that work, so it drains the queue like a sync; inside a
// gap it is host activity (cuda.memcpy / cuda.alloc) on the timeline.
func (p *proc) onSyncCopy(x env, th *thread, ev *event.Event) {
	if !p.everEnq || p.allDrained() {
		p.onBlocking(th, ev)
		return
	}
	if p.gap != nil && x.set.lite {
		p.closeGap(x, th, ev.Start)
	}
	p.drainStreams(ev)
	p.endAhead(x.set, ev.End, p.aheadStart < ev.Start, false)
	if ev.Kind == event.KindMemcpy && ev.CUDA == event.CUMemcpyDtoH {
		p.patternSync(x.set, ev)
	}
	if p.gap == nil && p.allDrained() {
		p.gap = &openGap{start: ev.End, tid: th.tid, exact: true}
	}
}

// onBlocking notes a feeder that blocked while its queue held work: the
// start of a possible CPU-ahead stall. The blocking counts in total, not
// per call: a data read is a loop of calls of a fraction of a millisecond
// each (256 KiB O_DIRECT reads: 0.3–1 ms), no one of which reaches MinGap.
func (p *proc) onBlocking(th *thread, ev *event.Event) {
	if !p.everEnq || !p.feeders.has(th.tid) {
		return
	}
	if p.gap != nil || p.allDrained() || ev.Start < p.lastEnq {
		return
	}
	if p.aheadStart == 0 || ev.Start < p.aheadStart {
		p.aheadStart, p.aheadTID = ev.Start, th.tid
	}
	p.aheadBlocked += ev.Duration()
}

// endAhead ends a possible CPU-ahead interval at hi: it is a candidate when
// ok and the feeder was blocked for at least MinGap in all since it began;
// when needDrain, only if the usual drain time is known.
func (p *proc) endAhead(set settings, hi int64, ok, needDrain bool) {
	if p.aheadStart != 0 && ok && hi > p.aheadStart && p.aheadBlocked >= set.minGap {
		c := aheadCand{tid: p.aheadTID, lo: p.aheadStart, hi: hi}
		if p.drains.n >= 4 && p.lastEnq > 0 {
			c.drain = p.lastEnq + p.drains.recentMedian(5)
		}
		if c.drain > 0 || !needDrain {
			p.cands = append(p.cands, c)
		}
	}
	p.aheadStart, p.aheadBlocked = 0, 0
}

// inferEnd (lite) is where the gap most likely ended: the end of th's last
// blocking activity inside the gap before t.
func (p *proc) inferEnd(th *thread, start, t int64) int64 {
	var end int64
	for i := len(th.tl) - 1; i >= 0; i-- {
		ev := &th.tl[i]
		if ev.End <= start {
			break
		}
		// A preemption says nothing about when launches resumed: it lands
		// as often in the launch loop as in a stall.
		if ev.Kind == event.KindSync || ev.Kind == event.KindRunqueue || ev.End > t || ev.Start < start {
			continue
		}
		if ev.End > end {
			end = ev.End
		}
	}
	return end
}

func (p *proc) closeGap(x env, th *thread, t int64) {
	g := p.gap
	p.gap = nil
	end := t
	if x.set.lite {
		end = p.inferEnd(th, g.start, t)
		if end-g.start < x.set.minGap && t-g.start >= x.set.minGap && p.leads.n >= 4 {
			// No blocking explains the gap (the feeder computed): the
			// usual lead says where the invisible launches began, the
			// windows how much of it the GPU idled.
			p.cands = append(p.cands, aheadCand{tid: th.tid, lo: g.start, hi: t, lead: p.leads.recentMedian(9)})
		}
		p.leads.push(t - g.start)
	}
	if end-g.start < x.set.minGap {
		return
	}
	gap := Gap{PID: p.pid, TID: th.tid, Device: p.dev, Kind: GapIdle, Start: g.start, End: end, Duration: end - g.start}
	at := newAttribution(x.w)
	at.thread(th, g.start, end, nil)
	gap.Cause, gap.Breakdown, gap.Evidence, gap.Ops = at.result()
	gap.Evidence.Source = "host"
	gap.Evidence.Threads = append([]uint32(nil), p.feeders...)
	p.emit(x, gap)
}

func (p *proc) checkStall(set settings, th *thread, ev *event.Event, coll *CollectiveEvidence) {
	wait := ev.Duration()
	stall := func(excess, baseline int64, gpmOnly bool) {
		g := Gap{PID: p.pid, TID: th.tid, Device: p.dev, Kind: GapStall, Start: ev.End - excess, End: ev.End,
			Duration: excess, Cause: CauseComm, Breakdown: map[Cause]int64{CauseComm: excess}}
		c := *coll
		g.Evidence = Evidence{Collective: &c, CUDACall: ev.CUDA.String(), BaselineNS: baseline,
			Threads: append([]uint32(nil), p.feeders...), Source: "host"}
		g.Ops = []HostOp{hostOp(ev, th.tid)}
		p.stalls = append(p.stalls, stallCand{gap: g, gpmOnly: gpmOnly})
	}
	slot := p.st.slot()
	if slot < 0 {
		// Without a period, waits of different syncs of a step cannot be
		// compared: no baseline. Only GPM can still show a spinning peer.
		if coll != nil && wait >= set.minGap {
			stall(wait, 0, true)
		}
		return
	}
	k := baseKey{cuda: ev.CUDA, stream: ev.Stream, slot: slot}
	r := p.base[k]
	if r == nil {
		if len(p.base) > 256 {
			clear(p.base)
		}
		r = &waitRing{}
		p.base[k] = r
	}
	// The baseline compares how long the queue ran after the last enqueue,
	// which a late peer lengthens, rather than the sync's own wait, which
	// also shrinks by any host delay between the last enqueue and the sync:
	// one such step would lower the baseline and make every ordinary step
	// after it look late by that delay.
	run := wait
	if p.lastEnq > 0 && p.lastEnq <= ev.Start {
		run = ev.End - p.lastEnq
	}
	switch {
	case coll == nil || wait < set.minGap:
	case r.n >= 4 && run-r.low() >= set.minGap:
		excess := min(run-r.low(), wait)
		stall(excess, wait-excess, false)
	case r.n < 4 || r.low() >= set.minGap:
		// Every wait so far was long: either the step's compute is long or
		// the peer has been late since the first step. GPM tells which.
		stall(wait, 0, true)
	}
	r.push(run)
}

// emit records a gap on the device and delivers it once its step is known.
func (p *proc) emit(x env, g Gap) {
	d := x.d
	if g.Kind == GapStall {
		d.stalls = addSpan(d.stalls, span{g.Start, g.End})
	} else {
		d.gaps = addSpan(d.gaps, span{g.Start, g.End})
	}
	if p.st.mode == modeUnknown {
		p.held = append(p.held, g)
		return
	}
	p.deliver(x.set, g)
}

// deliver assigns a gap to the step holding most of it (its midpoint): a
// gap opened by one per-stream sync can start a few µs before the step's
// last sync returns.
func (p *proc) deliver(set settings, g Gap) {
	st := p.st.lookup(set, g.Start+g.Duration/2)
	if st != nil {
		g.Step = st.Number
		st.Gaps++
		if g.Kind == GapStall {
			st.StallNS += g.Duration
		} else {
			st.BoundedIdleNS += g.Duration
		}
		for c, ns := range g.Breakdown {
			st.ByCause[c] += ns
		}
	} else {
		g.Step = p.st.doneNum
		set.log.Debug("gap belongs to a step already emitted", "pid", p.pid, "start", g.Start, "step", g.Step)
	}
	p.out.gap(g)
}

// resolvePending settles what waited for GPU windows or a step period.
func (p *proc) resolvePending(x env, force bool) {
	p.resolveAhead(x, force)
	p.resolveStalls(x, force)
	p.resolveHeld(x, force)
}

// resolveAhead decides the CPU-ahead candidates whose windows arrived
// (or that waited long enough).
func (p *proc) resolveAhead(x env, force bool) {
	if len(p.cands) == 0 {
		return
	}
	d := x.d
	k := 0
	for _, c := range p.cands {
		// A device that never sent windows will not start now: no wait.
		if force || d.maxEnd == 0 || d.maxEnd >= c.hi || x.clk.now >= c.hi+holdMax {
			p.resolveCand(x, c)
			continue
		}
		p.cands[k] = c
		k++
	}
	p.cands = p.cands[:k]
}

// resolveStalls confirms or rejects the comm stalls whose GPM windows
// arrived (or that waited long enough).
func (p *proc) resolveStalls(x env, force bool) {
	if len(p.stalls) == 0 {
		return
	}
	d := x.d
	k := 0
	for _, s := range p.stalls {
		if force || d.gpmEnd == 0 || d.gpmEnd >= s.gap.End || x.clk.now >= s.gap.End+holdMax {
			sm := d.smActivity(s.gap.Start, s.gap.End)
			// With a baseline, the wait's excess is already set apart from
			// the compute: reject it only when the GPU must have computed
			// during it, whatever the window's compute around it.
			reject := sm > smStallMax
			if !s.gpmOnly {
				reject = d.smActivityMin(s.gap.Start, s.gap.End) > smStallMax
			}
			if reject || (s.gpmOnly && sm < 0) {
				p.out.rejected++
				continue
			}
			if s.gpmOnly {
				// Utilization counts a spinning collective as busy, GPM SM
				// activity barely does; an idle GPU lowers both. So over
				// the wait's windows, busy − compute is the spin, and its
				// share of the busy time is the share of the wait spent on
				// the peer. Compute kernels keep SM activity at 0.7-0.95 on
				// an H200: 0.8 stands in until the device shows a higher peak.
				busy := d.busyFraction(s.gap.Start, s.gap.End)
				ref := max(d.smPeak, 2*sm, smComputeRef)
				spin := busy - sm/ref
				if busy <= 0 || spin < spinMin {
					p.out.rejected++
					continue
				}
				excess := int64(float64(s.gap.Duration) * min(1, spin/busy))
				if excess < x.set.minGap {
					p.out.rejected++
					continue
				}
				s.gap.Start = s.gap.End - excess
				s.gap.Duration = excess
				s.gap.Breakdown = map[Cause]int64{CauseComm: excess}
			}
			if sm >= 0 {
				s.gap.Evidence.SMActivity = &sm
				s.gap.Evidence.Source = "host+gpu"
				if s.gpmOnly {
					s.gap.Evidence.Source = "gpu"
				}
			}
			p.emit(x, s.gap)
			continue
		}
		p.stalls[k] = s
		k++
	}
	p.stalls = p.stalls[:k]
}

// resolveHeld delivers the gaps held until the step clock ran: it falls
// back to fixed windows once a held gap or the warm-up waited too long.
func (p *proc) resolveHeld(x env, force bool) {
	if p.st.mode == modeUnknown && p.everEnq {
		due := force || x.clk.wm-p.st.origin > warmupMax
		for i := range p.held {
			if x.clk.now >= p.held[i].End+holdMax {
				due = true
			}
		}
		if due {
			p.st.toWindows(p.st.origin)
		}
	}
	if p.st.mode != modeUnknown && len(p.held) > 0 {
		held := p.held
		p.held = nil
		sort.SliceStable(held, func(i, j int) bool { return held[i].Start < held[j].Start })
		for _, g := range held {
			p.deliver(x.set, g)
		}
	}
}

func (p *proc) resolveCand(x env, c aheadCand) {
	d := x.d
	idle := d.idleWithin(c.lo, c.hi)
	if c.drain > 0 {
		// A window (100–200 ms) is much longer than a stall: its idle says
		// how much but not where, and the micro-idle it also holds shifts
		// the estimate by many ms. The host knows better where the queue
		// ran dry when the step's queued work runs as long as usual; the
		// windows still cap what the GPU can have idled.
		idle = min(max(c.hi-max(c.lo, c.drain), 0), d.idleAtMost(c.lo, c.hi))
	}
	a, b := c.hi-idle, c.hi
	if c.lead > 0 {
		idle = min(max(c.hi-c.lead-c.lo, 0), d.idleAtMost(c.lo, c.hi))
		a, b = c.lo, c.lo+idle
	}
	if idle < x.set.minGap {
		return
	}
	th := x.w.threads[c.tid]
	if th == nil {
		return
	}
	g := Gap{PID: p.pid, TID: c.tid, Device: p.dev, Kind: GapIdle, Start: a, End: b, Duration: idle}
	at := newAttribution(x.w)
	at.thread(th, a, b, nil)
	g.Cause, g.Breakdown, g.Evidence, g.Ops = at.result()
	g.Evidence.Source = "host+gpu"
	g.Evidence.Threads = append([]uint32(nil), p.feeders...)
	p.emit(x, g)
}

// keepFrom is the oldest time this process's pending work may still read.
func (p *proc) keepFrom(wm int64) int64 {
	k := wm - retain
	lower := func(t int64) {
		if t < k {
			k = t
		}
	}
	if p.st.mode == modeUnknown && p.everEnq {
		lower(p.st.origin)
	}
	if len(p.st.steps) > 0 {
		lower(p.st.steps[0].Start)
	}
	if p.gap != nil {
		lower(p.gap.start)
	}
	for _, c := range p.cands {
		lower(c.lo)
	}
	for _, s := range p.stalls {
		lower(s.gap.Start)
	}
	for _, g := range p.held {
		lower(g.Start)
	}
	return k
}

// closeAll ends what the process had open at t (exit or Close). An open gap
// has no end: the GPU was still idle when tracing stopped, which says
// nothing about the training loop, so it is dropped.
func (p *proc) closeAll(set settings, t int64) {
	p.gap = nil
	p.aheadStart, p.aheadBlocked = 0, 0
	if !p.everEnq {
		return
	}
	if p.st.mode == modeUnknown {
		p.st.toWindows(p.st.origin)
	}
	p.st.tick(set, t)
	p.st.closeOpen(t)
}

func (p *proc) tickSteps(set settings, wm int64) {
	if p.everEnq {
		p.st.tick(set, wm)
	}
}

// recLaunches records n launches flushed at t (made since the thread's
// previous flushed event), keeping the records sorted by time.
func (p *proc) recLaunches(t int64, n uint64) {
	if p.recFrom == 0 {
		p.recFrom = t
	}
	i := len(p.launchRec)
	for i > 0 && p.launchRec[i-1].t > t {
		i--
	}
	p.launchRec = append(p.launchRec, tcount{})
	copy(p.launchRec[i+1:], p.launchRec[i:])
	p.launchRec[i] = tcount{t, n}
}

// launchWeight is how many launches were made in [a,b) outside the spans
// hid: each record's launches are spread over the non-hidden time since the
// previous record (no launch happens inside a gap); past the last record
// (launches not flushed yet) the average density of the records continues.
// It is what the GPU's busy time is split by.
func (p *proc) launchWeight(a, b int64, hid []span) float64 {
	nonGap := func(x, y int64) int64 { return (y - x) - overlapLen(hid, x, y) }
	prev := p.recFrom
	var w float64
	var n uint64
	for _, r := range p.launchRec {
		n += r.n
		if r.t > prev {
			if r.t > a && prev < b {
				if ng := nonGap(prev, r.t); ng > 0 {
					w += float64(r.n) * float64(nonGap(max(prev, a), min(r.t, b))) / float64(ng)
				}
			}
			prev = r.t
		}
		if prev >= b {
			return w
		}
	}
	if b > prev && n > 0 {
		if ng := nonGap(p.recFrom, prev); ng > 0 {
			w += float64(n) / float64(ng) * float64(nonGap(max(prev, a), b))
		}
	}
	return w
}
