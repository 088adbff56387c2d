package correlate

import (
	"sort"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/queue"
	"github.com/gaptrace/gaptrace/event"
)

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
	// loop names the thread that feeds the step clock (loopthread.go).
	loop loopThreads

	// q is the GPU queue model: per stream, work enqueued since it was
	// last drained (queue.Streams).
	q       queue.Streams[queuedColl]
	everEnq bool
	gap     gapState    // the open host-bounded gap (gapstate.go)
	hold    *heldCopies // async copies issued into gap, undecided (episode.go)

	// ahead is a feeder's blocking while its queue held work, a possible
	// CPU-ahead stall (queue.Ahead, ahead.go).
	ahead queue.Ahead
	// drains holds, for recent syncs that waited, the time from the last
	// enqueue to the drain: how long the queued work of a step runs.
	drains waitRing
	// leads (lite) holds the recent times from a drained sync's return to
	// the next work the probes saw: the feeder's running time (leads) and
	// the time that passed (wallLeads).
	leads, wallLeads waitRing
	// waits holds how long recent syncs waited for the GPU (their time
	// less their run-queue waits): the work the queue held when the feeder
	// stopped enqueueing, whether or not lite saw that work enqueued.
	waits  waitRing
	shadow leadShadow // auto: leads as lite would see them, during windows
	// burst is one thread's launches since the queue was last empty, and
	// busyPerLaunch the recent steps' GPU time per launch (quiet.go).
	burst         queue.Burst
	busyPerLaunch waitRing
	// syncLaunches: launches between recent syncs that had any.
	syncLaunches waitRing
	cands        []aheadCand
	stalls       []stallCand
	held         []Gap

	launches, copies, colls uint64
	// firstOps: what follows a sync (queue.FirstOps); closer: the
	// enqueue closing the gap is the first such and known quiet.
	firstOps  queue.FirstOps
	closer    bool
	launchRec []tcount // flushed launch counts, by time
	recFrom   int64    // start of the interval of launchRec[0]
	base      map[baseKey]*waitRing

	st stepper

	exitedAt int64 // when the process exited; 0 while it runs

	// out holds what the models decided and the engine has not applied yet.
	out outbox
}

// outbox is what a process's models decided during one call into them:
// final gaps (their step assigned) and finished steps, in decision order,
// how many candidates they rejected, how many steps they emitted
// incomplete and gaps they delivered after their step. Only the engine
// turns them into sink calls and totals.
type outbox struct {
	ds                    []decision
	rejected              uint64
	incomplete, afterStep uint64
}

// decision is one result: a gap, or a step with its gaps and the cause
// split of its micro idle (the part of its ByCause no gap delivered).
type decision struct {
	gap   *Gap
	step  *StepResult
	micro []causeNS
}

func (o *outbox) gap(g Gap) { o.ds = append(o.ds, decision{gap: &g}) }

func (o *outbox) step(st Step, gaps []Gap, micro []causeNS) {
	o.ds = append(o.ds, decision{step: &StepResult{Step: st, GapList: gaps}, micro: micro})
}

func (o *outbox) reset() {
	clear(o.ds)
	o.ds, o.rejected, o.incomplete, o.afterStep = o.ds[:0], 0, 0, 0
}

// settled reports whether nothing of the process waits to be emitted.
func (p *proc) settled() bool {
	return len(p.st.steps) == 0 && len(p.cands) == 0 && len(p.stalls) == 0 && len(p.held) == 0
}

func newProc(pid uint32, dev int, t int64) *proc {
	return &proc{
		pid:   pid,
		dev:   dev,
		first: t,
		tids:  map[uint32]struct{}{},
		base:  map[baseKey]*waitRing{},
		st:    stepper{pid: pid, next: 1},
	}
}

// resolvePending settles what waited for GPU windows or a step period.
func (p *proc) resolvePending(x env, force bool) {
	p.resolveAhead(x, force)
	p.resolveStalls(x, force)
	p.resolveHeld(x, force)
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
			p.st.warming = true
		}
	}
	if c := p.st.clock; c != nil && c.deferred != 0 {
		// A gap due now must go to its step: a boundary still waiting for
		// the next occurrence (the loop's last step, a long pause) is
		// placed first.
		for i := range p.held {
			if force || x.clk.now >= p.held[i].End+holdMax {
				p.st.flushDeferred()
				break
			}
		}
	}
	if p.st.mode != modeUnknown && len(p.held) > 0 {
		held := p.held
		p.held = nil
		sort.SliceStable(held, func(i, j int) bool { return held[i].Start < held[j].Start })
		for _, g := range held {
			// A clock step ends only when the next one's operation is
			// enqueued; a loop that stopped (or the trace's end) must
			// not hold its last gaps past the emission promise: they go
			// to the step still open.
			if p.st.undecided(g.Start+g.Duration/2) && x.clk.now < g.End+holdMax {
				p.held = append(p.held, g)
				continue
			}
			p.deliver(x.set, g)
		}
	}
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
	if p.gap.cur() != nil {
		lower(p.gap.cur().start)
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
func (p *proc) closeAll(x env, t int64) {
	set := x.set
	p.closeSaveAtExit(x, t)
	p.gap.end()
	p.ahead.Reset()
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

// closeWaitAtExit ends, at the feeding thread's last wait on the job's
// data, a gap still open when the process exits whose thread spent most
// of it in such waits (network, file reads and writes): a final upload of
// the model, a logger pushing its last records before the job exits
// (wandb.finish), the GPU idle for them as for any stall. The interpreter
// exiting after the last wait, and a gap that held mostly else (teardown
// with a few writes to stdout), stay dropped; so does a gap open when the
// trace ends with the job still running (its wait may go on).
func (p *proc) closeWaitAtExit(x env, t int64) {
	g := p.gap.cur()
	if g == nil {
		return
	}
	th := x.w.threads[g.tid]
	if th == nil {
		return
	}
	var waited, last int64
	for _, sg := range th.Segments(g.start, t, nil) {
		if sg.Ev == nil {
			continue
		}
		if sg.Ev.FDKind == event.FDPipe {
			// stdout and stderr into a pipe: the exiting interpreter's
			// last log lines, not the job's data.
			continue
		}
		switch attribute.BaseCause(sg.Ev) {
		case CauseNet, CauseIORead, CauseIOWrite:
			waited += sg.B - sg.A
			last = sg.B
		}
	}
	if waited < x.set.minGap || 2*waited < last-g.start {
		return
	}
	p.closeGap(x, th, min(last, t))
}

// closeSaveAtExit ends, at its file's last write, fsync or rename, a gap
// still open when the trace ends that holds a host operation writing a
// file (a final checkpoint): the job's last minutes of saving are the
// GPU's idle like any checkpoint's. The rest of a gap open at the end
// (the interpreter exiting, the sidecar stopped mid-wait) is no loop's.
func (p *proc) closeSaveAtExit(x env, t int64) {
	g := p.gap.cur()
	if g == nil || g.ep == nil || !g.ep.bulk {
		return
	}
	th := x.w.threads[g.tid]
	if th == nil {
		return
	}
	if _, f := writtenFile(th, g.start, th.Segments(g.start, t, nil)); f != nil && f.last > g.start {
		p.closeGap(x, th, min(f.last, t))
	}
}
