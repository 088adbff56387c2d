package correlate

import (
	"math"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

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
	// preempt (lite): the feeder could not run over [lo, hi] with too
	// little work queued to cover it (preempted): the GPU idled over it,
	// as far as the windows allow, up to hi.
	preempt bool
	// exact (lite): the feeder had not run since its queue drained, so
	// the host alone bounds the idle over [lo, hi] (no window caps it).
	exact bool
	// await (a preemption lite placed by its ramp, rampQ after its start
	// pstart): the feeder's next sync says better what the queue held
	// (settlePreempted); the candidate waits for it.
	await         bool
	pstart, rampQ int64
}

// onBlocking notes a feeder that blocked while its queue held work: the
// start of a possible CPU-ahead stall. The blocking counts in total, not
// per call: a data read is a loop of calls of a fraction of a millisecond
// each (256 KiB O_DIRECT reads: 0.3–1 ms), no one of which reaches MinGap.
func (p *proc) onBlocking(th *attribute.Thread, ev *event.Event) {
	if !p.everEnq || !p.feeders.has(th.TID) {
		return
	}
	if p.gap.cur() != nil || p.q.AllDrained() || ev.Start < p.q.LastEnqueue() {
		return
	}
	p.ahead.Block(th.TID, ev.Start, ev.Duration())
}

// endAhead ends a possible CPU-ahead interval at hi: it is a candidate when
// ok and the feeder was blocked for at least MinGap in all since it began;
// when needDrain, only if the usual drain time is known.
func (p *proc) endAhead(set settings, hi int64, ok, needDrain bool) {
	if tid, lo, found := p.ahead.End(hi, ok, set.minGap); found {
		c := aheadCand{tid: tid, lo: lo, hi: hi}
		if p.drains.n >= minHistory && p.q.LastEnqueue() > 0 {
			c.drain = p.q.LastEnqueue() + p.drains.recentMedian(drainRecent)
		}
		if c.drain > 0 || !needDrain {
			p.cands = append(p.cands, c)
		}
	}
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
		if c.await && !force && x.clk.now < c.hi+holdMax {
			// Waiting for the feeder's next sync (settlePreempted).
			p.cands[k] = c
			k++
			continue
		}
		// A device that never sent windows will not start now: no wait.
		// The window that holds hi may also hold idle the host explains
		// after hi (a checkpoint's gap opening 80 ms later): the host's
		// events through its end must be in first, or that idle lands in
		// this candidate.
		if force || d.maxEnd == 0 || d.maxEnd >= c.hi && x.clk.wm >= d.coverEnd(c.hi) || x.clk.now >= c.hi+holdMax {
			p.resolveCand(x, c)
			continue
		}
		p.cands[k] = c
		k++
	}
	p.cands = p.cands[:k]
}

// knownIdle is idle of d that the windows hold but no emitted gap does yet:
// the time before any traced process of d first queued work (a job's
// setup, the interpreter starting) and the gaps still open. A window
// (100–200 ms) that holds a checkpoint's first 50 ms, or the loop's start,
// has that much idle no blocking of the host elsewhere in it explains.
// Lite cannot see launches: a gap it holds open may hide the next step's
// first kernels, so only one that absorbed a host operation's copies
// (episode.go: a checkpoint in progress) counts. Its first work seen can
// come after launches too, but a job's first GPU work is nearly always a
// copy (the model's weights), which it sees.
func (x env) knownIdle(d *device) []interval.Span {
	var l []interval.Span
	first := int64(math.MaxInt64)
	for _, p := range x.w.procs {
		if p.dev != d.id || !p.everEnq {
			continue
		}
		first = min(first, p.st.origin)
		if g := p.gap.cur(); g != nil && (!x.liteOver(g.start, x.clk.now) || g.ep != nil && g.ep.bulk) {
			l = interval.Add(l, interval.Span{A: g.start, B: math.MaxInt64})
		}
	}
	if first < math.MaxInt64 {
		l = interval.Add(l, interval.Span{A: math.MinInt64, B: first})
	}
	return l
}

func (p *proc) resolveCand(x env, c aheadCand) {
	d := x.d
	known := x.knownIdle(d)
	idle := d.idleWithin(c.lo, c.hi, known)
	if c.drain > 0 {
		// A window (100–200 ms) is much longer than a stall: its idle says
		// how much but not where, and the micro-idle it also holds shifts
		// the estimate by many ms. The host knows better where the queue
		// ran dry when the step's queued work runs as long as usual; the
		// windows still cap what the GPU can have idled.
		idle = min(max(c.hi-max(c.lo, c.drain), 0), d.idleAtMost(c.lo, c.hi, known))
	}
	a, b := c.hi-idle, c.hi
	source := "host+gpu"
	switch {
	case c.exact:
		idle, a, b, source = c.hi-c.lo, c.lo, c.hi, "host"
	case c.preempt:
		idle = min(c.hi-c.lo, d.idleAtMost(c.lo, c.hi, known))
		a = c.hi - idle
	case c.lead > 0:
		idle = min(max(c.hi-c.lead-c.lo, 0), d.idleAtMost(c.lo, c.hi, known))
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
	at := attribute.New()
	at.Add(x.w, th, a, b, nil)
	g.Cause, g.Breakdown, g.Evidence, g.Ops = at.Result()
	g.Evidence.Source = source
	g.Evidence.Threads = append([]uint32(nil), p.feeders...)
	p.emit(x, g)
}
