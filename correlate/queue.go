package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/correlate/ranks"
	"github.com/gaptrace/gaptrace/event"
)

// queuedColl is what the queue model keeps of a collective it holds: its
// evidence and its place in its communicator's sequence.
type queuedColl struct {
	ev  *CollectiveEvidence
	ref ranks.Ref
}

// openGap is a drained queue waiting for its next enqueue.
type openGap struct {
	start int64
	tid   uint32 // thread whose sync drained the queue
	exact bool   // the sync waited, so start is the drain to the µs
	// stack is that of the sync or copy that drained the queue (kept,
	// not the event: the engine's events are not retained past their
	// processing).
	stack      []event.Frame
	stackTrunc bool
	ep         *episode // device copies of a host operation inside it (episode.go)
	// quiet: opened where a trailing burst's work most likely ended
	// (quiet.go), not at a sync lite would also see.
	quiet bool
}

func (p *proc) startGPU(t int64) {
	if !p.everEnq {
		p.everEnq = true
		p.st.origin = t
	}
}

func (p *proc) onEnqueue(x env, th *attribute.Thread, ev *event.Event, coll *CollectiveEvidence, ref ranks.Ref) {
	p.shadowLead(x, ev)
	p.feeders.add(th.TID)
	// Another thread's copy inside the loop's gap leaves the gap open
	// (loopthread.go); its work stays pending on its stream.
	aside := p.aside(th, ev)
	p.loop.note(ev)
	p.st.noteFeed(th.TID, ev)
	t := ev.Start
	wasDrained := p.q.AllDrained()
	launchesBefore := p.launches + p.colls
	switch ev.Kind {
	case event.KindEnqueue:
		p.launches += ev.Count
		p.recLaunches(t, ev.Count)
		p.st.onLaunches(ev.Count)
		p.st.notePending(th.TID, ev.Pending, ev.Count > 0)
	case event.KindMemcpyAsync:
		p.copies++
		p.st.notePending(th.TID, ev.Pending, false)
	case event.KindMemset:
		p.st.notePending(th.TID, ev.Pending, false)
	case event.KindCollective:
		p.colls++
	}
	p.st.setPost(t)
	// Before the gap this enqueue closes is delivered: it may end a step.
	occ := int64(-1)
	if ref.Valid() {
		occ = ref.Occ()
	}
	p.st.dev = x.d
	p.stepToken(x, ev, occ, t)
	first := p.firstOps.Learn(ev, launchesBefore, x.set.launchesSeen)
	if p.gap.cur() != nil && !aside {
		if first && p.gap.cur().start == p.firstOps.SyncEnd() && p.firstOps.Quiet(ev) {
			p.closer = true
		}
		p.closeGap(x, th, t)
		p.closer = false
	}
	p.endAhead(x.set, t, true, false)
	p.q.Enqueue(ev.Stream, t)
	th.LastStream, th.Enqueued = ev.Stream, true
	if ev.Kind == event.KindCollective {
		p.q.Collective(ev.Stream, queuedColl{coll, ref}, ref.At())
	}
	p.burst.Note(th.TID, ev, wasDrained)
	p.startGPU(t)
}

// drainStreams marks the streams the sync ev of th covers as drained
// (queue.Streams.Drain: an event sync covers the stream th last queued
// to) and returns the collective their pending work held, if any.
func (p *proc) drainStreams(th *attribute.Thread, ev *event.Event) (*CollectiveEvidence, ranks.Ref) {
	c, _ := p.q.Drain(ev, th.LastStream, th.Enqueued)
	return c.ev, c.ref
}

func (p *proc) onSync(x env, th *attribute.Thread, ev *event.Event) {
	p.shadowLead(x, ev)
	p.feeders.add(th.TID)
	aside := p.aside(th, ev)
	p.loop.note(ev)
	if ev.Count > 0 {
		p.launches += ev.Count
		p.recLaunches(ev.Start, ev.Count)
		p.st.onLaunches(ev.Count)
	}
	p.st.notePending(th.TID, 0, true)
	if x.set.lite {
		// Lite sees no launches: a trainer that only launches and syncs
		// (no async copies, no collectives) feeds the GPU all the same.
		p.startGPU(ev.Start)
	}
	if !p.everEnq {
		return
	}
	waited := ev.Duration() > x.set.syncWaited
	wait := max(ev.Duration()-th.Runnable(ev.Start, ev.End), 0)
	p.waits.push(wait)
	// Another thread's sync drains its own copies: the loop's gap stays
	// open, whether it waited or not (loopthread.go).
	if p.gap.cur() != nil && !aside {
		switch {
		case x.liteOver(p.gap.cur().start, ev.Start):
			// Launches are invisible in lite: the sync says work resumed.
			p.closeGap(x, th, ev.Start)
		case waited:
			// The GPU had work the tracer did not show (lost events): the
			// open gap is not trustworthy.
			p.out.rejected++
			p.gap.end()
		}
	}
	// Preemptions before this sync, the gap it closed included: its wait
	// says what their queue held.
	p.settlePreempted(th.TID, ev.Start, wait)
	pendingBefore := !p.q.AllDrained()
	coll, cref := p.drainStreams(th, ev)
	if cref.Valid() {
		cref.Complete(ev.End, ev.Start)
	}
	if waited && pendingBefore {
		p.checkStall(x, th, ev, coll, cref)
		d := x.d
		d.busy = interval.Add(d.busy, interval.Span{A: ev.Start, B: ev.End})
		if p.q.LastEnqueue() > 0 && p.q.LastEnqueue() <= ev.Start {
			p.drains.push(ev.End - p.q.LastEnqueue())
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
	p.patternSync(x, ev)
	p.firstOps.Sync(ev.End)
	if p.gap.cur() == nil && p.q.AllDrained() {
		p.gap.begin(&openGap{start: ev.End, tid: th.TID, exact: waited, stack: ev.Stack, stackTrunc: ev.StackTruncated})
	}
}

// onSyncCopy handles a synchronous copy or a free. While work is pending it
// completes after that work, so it drains the queue like a sync; inside a
// gap it is host activity (cuda.memcpy / cuda.alloc) on the timeline.
func (p *proc) onSyncCopy(x env, th *attribute.Thread, ev *event.Event) {
	p.shadowLead(x, ev)
	// A batch copied synchronously (cuMemcpyHtoD, often from pageable
	// memory) is the loop's data movement as much as an async one: it
	// clocks the steps, whether the queue had drained before it or not.
	if ev.Kind == event.KindMemcpy {
		p.st.dev = x.d
		p.stepToken(x, ev, -1, ev.Start)
	}
	if ev.Kind == event.KindMemcpy && ev.CUDA == event.CUMemcpyDtoH && x.liteOver(ev.Start, ev.End) && !p.aside(th, ev) {
		p.liteReadBack(x, th, ev)
		return
	}
	if !p.everEnq || p.q.AllDrained() {
		p.onBlocking(th, ev)
		if p.everEnq && ev.Kind == event.KindMemcpy && ev.CUDA == event.CUMemcpyDtoH {
			// A read of device data (the loss) is a sync to the step
			// pattern however empty the queue looked: lite sees no
			// launch, so to it the queue is always drained.
			p.patternSync(x, ev)
		}
		return
	}
	if p.gap.cur() != nil && x.liteOver(p.gap.cur().start, ev.Start) && !p.aside(th, ev) {
		p.closeGap(x, th, ev.Start)
	}
	if _, cref := p.drainStreams(th, ev); cref.Valid() {
		cref.Complete(ev.End, ev.Start)
	}
	p.endAhead(x.set, ev.End, p.ahead.Start() < ev.Start, false)
	if ev.Kind == event.KindMemcpy && ev.CUDA == event.CUMemcpyDtoH {
		p.patternSync(x, ev)
	}
	if p.gap.cur() == nil && p.q.AllDrained() {
		p.gap.begin(&openGap{start: ev.End, tid: th.TID, exact: true, stack: ev.Stack, stackTrunc: ev.StackTruncated})
	}
}

// liteReadBack (lite) takes a synchronous read of device data as the sync
// it is: it waits for everything queued before it on the legacy stream,
// which lite cannot see. A loop whose only syncs are such reads (the loss
// copied back with cuMemcpyDtoH) would otherwise never open a gap: to lite
// its queue is always drained and its GPU never fed. As at a sync, the read
// says work resumed in the open gap, and the GPU idles from its return.
func (p *proc) liteReadBack(x env, th *attribute.Thread, ev *event.Event) {
	p.feeders.add(th.TID)
	p.startGPU(ev.Start)
	if p.gap.cur() != nil {
		p.closeGap(x, th, ev.Start)
	}
	wait := max(ev.Duration()-th.Runnable(ev.Start, ev.End), 0)
	p.waits.push(wait)
	p.settlePreempted(th.TID, ev.Start, wait)
	if _, cref := p.drainStreams(th, ev); cref.Valid() {
		cref.Complete(ev.End, ev.Start)
	}
	p.patternSync(x, ev)
	p.firstOps.Sync(ev.End)
	if p.gap.cur() == nil {
		p.gap.begin(&openGap{start: ev.End, tid: th.TID, exact: true, stack: ev.Stack, stackTrunc: ev.StackTruncated})
	}
}

// inferEnd (lite) is where the gap most likely ended: the end of th's last
// blocking activity inside the gap before t. In a host operation's gap
// (episode: torch.save) a fault on a mapped file counts as its activity:
// the operation pages in its own code and data, where a fault in a step's
// launch loop says nothing.
func (p *proc) inferEnd(th *attribute.Thread, start, t int64, episode bool) int64 {
	var end int64
	for i := th.Len() - 1; i >= 0; i-- {
		ev := th.At(i)
		if ev.End <= start {
			break
		}
		if episode && ev.Kind == event.KindOffCPU && ev.Path != "" && ev.End <= t {
			end = max(end, ev.End)
			continue
		}
		// A preemption (or a thread blocked outside any call: a page
		// fault) says nothing about when launches resumed: it lands as
		// often in the launch loop as in a stall (preempted decides what
		// it cost). Nor does a call that mostly waited for a CPU (a staged
		// copy preempted in the driver).
		if ev.Kind == event.KindSync || attribute.OffRun(ev) || ev.End > t || ev.Start < start ||
			2*th.Runnable(ev.Start, ev.End) >= ev.Duration() {
			continue
		}
		if ev.End > end {
			end = ev.End
		}
	}
	return end
}

// preempted (lite) turns the times th could not run in [from, t) (run-
// queue waits, blocking outside any call) into CPU-ahead candidates where
// the GPU queue was too shallow to cover them. The queue
// is empty at from (the sync's return, the end of the blocking call the
// host gap ends at, or the end of the computing the lead candidate
// covers) and until launch, where the invisible enqueues most likely
// began; from there it grows to what the syncs usually wait for (depth)
// over the usual lead, so at a wait that starts after τ of running time
// it holds about depth·min(τ/lead, 1). A feeder that cannot run for D
// while its queue holds Q < D starves the GPU for D-Q, from a+Q to the
// wait's end (it enqueues again as soon as it runs); the windows cap that
// when the candidate resolves. A loop whose host runs ahead (syncs that
// wait long) keeps a preemption inside its launches unseen unless it
// outlasts the queue; a launch-bound loop (syncs that find the queue
// about empty) loses the GPU for every preemption.
func (p *proc) preempted(x env, th *attribute.Thread, from, launch, t int64) {
	if p.waits.n < minHistory {
		return
	}
	depth := p.waits.high(waitRecent)
	if depth < x.set.minGap/2 {
		// What is left when the feeder stops is the last kernel and the
		// sync's own latency: the queue is empty for any preemption.
		depth = 0
	}
	var lead int64
	if p.leads.n >= minHistory {
		lead = p.leads.recentMedian(leadRecent)
	}
	for i := range th.Overlaps(from, t) {
		ev := th.At(i)
		if !attribute.OffRun(ev) || ev.Start < from || ev.End > t {
			continue
		}
		q := depth
		if tau := max(ev.Start-launch-th.Stopped(launch, ev.Start), 0); lead > 0 && tau < lead {
			q = int64(float64(depth) * float64(tau) / float64(lead))
		}
		c := aheadCand{tid: th.TID, lo: ev.Start + q, hi: ev.End, preempt: true}
		if q > 0 && ev.End-ev.Start >= x.set.minGap {
			// The feeder's next sync says better what the queue held.
			c.await, c.pstart, c.rampQ = true, ev.Start, q
		}
		if !c.await && ev.End-c.lo < x.set.minGap {
			continue
		}
		p.cands = append(p.cands, c)
	}
}

// queuedBefore bounds what a feeder's queue held when it was preempted by
// the wait of its next sync: that sync waits for what the feeder enqueued
// after the preemption, less what the GPU ran of its queue meanwhile, so
// its wait short of the usual one (depth) is the most the queue held. A
// feeder preempted before it launched anything (between steps) waits as
// long as ever.
func queuedBefore(depth, wait int64) int64 { return max(depth-wait, 0) }

// settlePreempted places the preemptions of tid that waited for a sync
// (preempted) now that its next sync, starting at t, waited wait.
func (p *proc) settlePreempted(tid uint32, t, wait int64) {
	depth := p.waits.high(waitRecent)
	for i := range p.cands {
		c := &p.cands[i]
		if !c.await || c.tid != tid || t < c.hi {
			continue
		}
		c.await = false
		c.lo = c.pstart + min(c.rampQ, queuedBefore(depth, wait))
	}
}

func (p *proc) closeGap(x env, th *attribute.Thread, t int64) {
	g := p.gap.end()
	end := t
	switch {
	case p.closer && x.liteOver(g.start, t):
		// The first operation after the sync, which the loop launches
		// nothing before (learnt where launches were seen): the GPU
		// idled until it.
		p.leads.push(t - g.start - th.Stopped(g.start, t))
		p.wallLeads.push(t - g.start)
	case x.liteOver(g.start, t):
		end = p.inferEnd(th, g.start, t, g.ep != nil && g.ep.bulk)
		from := max(g.start, end)
		if end <= g.start {
			// A feeder that has not run since its sync found the queue
			// empty enqueued nothing: the host alone bounds that idle (the
			// wait for a CPU after the sync's wakeup), as at full.
			from = th.StoppedFrom(g.start, t)
			if from-g.start >= x.set.minGap {
				p.resolveCand(x, aheadCand{tid: th.TID, lo: g.start, hi: from, exact: true})
			}
		}
		// The lead is the feeder's running time from the sync's return
		// to the work the probes see (time it could not run only
		// stretches it); the invisible launches take its last part.
		launch := from
		if p.leads.n >= minHistory {
			launch = th.RanBack(from, t, p.leads.recentMedian(leadRecent))
		}
		// A loop paced by the clock (or by its own compute) takes the
		// same time per step but runs less when preempted; one paced by
		// its work runs the same and takes longer. Only what exceeds the
		// usual lead both ways is computing before the launches.
		pre := launch - from
		if p.wallLeads.n >= minHistory {
			pre = min(pre, t-from-p.wallLeads.recentMedian(leadRecent))
		}
		if end-g.start < x.set.minGap && pre >= x.set.minGap {
			// No blocking explains the gap (the feeder computed): the
			// usual lead says where the invisible launches began, the
			// windows how much of it the GPU idled.
			p.cands = append(p.cands, aheadCand{tid: th.TID, lo: from, hi: t, lead: t - from - pre})
			from += pre
		}
		// Where the feeder stopped after that, its queue's depth says
		// what it cost.
		p.preempted(x, th, from, launch, t)
		p.leads.push(t - g.start - th.Stopped(g.start, t))
		p.wallLeads.push(t - g.start)
	}
	if end-g.start < x.set.minGap {
		return
	}
	build := func(a, b int64, ep *episode) Gap {
		gap := Gap{PID: p.pid, TID: th.TID, Device: p.dev, Kind: GapIdle, Start: a, End: b, Duration: b - a}
		at := attribute.New()
		at.Add(x.w, th, a, b, nil)
		gap.Cause, gap.Breakdown, gap.Evidence, gap.Ops = at.Result()
		if ep != nil {
			gap.Cause, gap.Evidence.Episode = episodeResult(th, a, b, ep, gap.Breakdown)
			if stack, truncated, ok := at.Stack(gap.Cause); ok {
				gap.Evidence.Stack, gap.Evidence.StackTruncated = stack, truncated
			}
		}
		if gap.Evidence.Stack == nil && g.stack != nil && a == g.start {
			gap.Evidence.Stack, gap.Evidence.StackTruncated = g.stack, g.stackTrunc
		}
		gap.Evidence.Source = "host"
		gap.Evidence.Threads = append([]uint32(nil), p.feeders...)
		return gap
	}
	if g.ep == nil || !g.ep.bulk {
		p.emit(x, build(g.start, end, nil))
		return
	}
	// A checkpoint followed by a wait on something else (a lock, the next
	// batch's pageable copy) is two gaps: the save, then the wait.
	if split := episodeSplit(th, g.start, end, x.set.minGap); split-g.start >= x.set.minGap {
		if first := build(g.start, split, g.ep); first.Cause == CauseIOWrite {
			p.emit(x, first)
			p.emit(x, build(split, end, nil))
			return
		}
	}
	p.emit(x, build(g.start, end, g.ep))
}
