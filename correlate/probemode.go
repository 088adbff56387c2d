package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// Probe sets as the engine sees them per span of time under ProbesAuto: the
// per-launch probes are attached only for sampled windows, so a gap is
// decided as full would decide it only when one window covered all of it
// (its start included: a launch before the window opened was not seen, so
// the first enqueue seen need not be the gap's end); every other gap is
// decided as lite would.

// maxWindows bounds the remembered windows: a window is looked up only
// for gaps that are still open or held (seconds), and the summary's
// share of time at full is kept as a running total.
const maxWindows = 256

// probeModes is the timeline of full windows: spans closed in order, the
// last possibly open (end 0).
type probeModes struct {
	wins []interval.Span
	// closedNS is the full time of windows already forgotten.
	closedNS int64
}

func (m *probeModes) open() bool { return len(m.wins) > 0 && m.wins[len(m.wins)-1].B == 0 }

// set records that the per-launch probes were live (full) or not from at.
// Repeats and times going backwards are ignored.
func (m *probeModes) set(full bool, at int64) {
	switch {
	case full && !m.open():
		if n := len(m.wins); n > 0 && at < m.wins[n-1].B {
			at = m.wins[n-1].B
		}
		if len(m.wins) == maxWindows {
			m.closedNS += m.wins[0].B - m.wins[0].A
			m.wins = append(m.wins[:0], m.wins[1:]...)
		}
		m.wins = append(m.wins, interval.Span{A: at, B: 0})
	case !full && m.open():
		w := &m.wins[len(m.wins)-1]
		w.B = max(at, w.A)
	}
}

// fullOver reports whether one window covers [lo, hi].
func (m *probeModes) fullOver(lo, hi int64) bool {
	for i := len(m.wins) - 1; i >= 0; i-- {
		w := m.wins[i]
		if w.A <= lo {
			return w.B == 0 || hi <= w.B
		}
	}
	return false
}

// fullNS is the time at full within [lo, hi].
func (m *probeModes) fullNS(lo, hi int64) int64 {
	var n int64
	for _, w := range m.wins {
		end := w.B
		if end == 0 {
			end = hi
		}
		if a, b := max(w.A, lo), min(end, hi); b > a {
			n += b - a
		}
	}
	return n + m.closedNS
}

// liteOver reports whether a gap over [lo, hi] is decided as lite decides.
func (x env) liteOver(lo, hi int64) bool {
	if x.set.modes == nil {
		return x.set.lite
	}
	return !x.set.modes.fullOver(lo, hi)
}

// probesOver names the probe set that decided a gap over [lo, hi].
func (x env) probesOver(lo, hi int64) string {
	if x.liteOver(lo, hi) {
		return ProbesLite
	}
	return ProbesFull
}

// ProbesLive tells an engine configured with ProbesAuto that the per-launch
// probes are live (full) or not from at (Unix ns): from when the last
// attach returned, or until the first detach began. Call it before the
// watermark reaches at: right after attaching, right before detaching.
func (e *Engine) ProbesLive(full bool, at int64) {
	if e.set.modes != nil {
		e.set.modes.set(full, at)
	}
}

// leadShadow keeps lite's lead history current through full windows. Lite
// measures, for each gap, the lead from a drained sync's return to the next
// work it sees (a copy, a collective, a sync) and places gaps no blocking
// call explains with the recent leads; a window closes gaps at the first
// launch instead and measures none, so without this the first lite gaps
// after the warm-up window would find no history and be lost.
type leadShadow struct {
	from int64 // the open gap's start, its launch seen, no other work yet
	done int64 // start of the last gap whose lead was recorded
}

// shadowLead records, under auto and inside a window, the lead lite would
// have measured: at the first non-launch work after a gap's start.
func (p *proc) shadowLead(x env, ev *event.Event) {
	if x.set.modes == nil {
		return
	}
	sh := &p.shadow
	launch := ev.Kind == event.KindEnqueue
	if sh.from != 0 && !launch {
		p.leads.push(p.running(x, ev, sh.from))
		p.wallLeads.push(ev.Start - sh.from)
		sh.done, sh.from = sh.from, 0
		return
	}
	g := p.gap.cur()
	if g == nil || g.start == sh.done || x.liteOver(g.start, ev.Start) {
		return // lite's own closure records this gap's lead
	}
	if g.quiet {
		// Opened after a trailing burst (quiet.go): lite sees no such
		// gap, and its leads run from a sync's return.
		return
	}
	if launch {
		sh.from = g.start
		return
	}
	p.leads.push(p.running(x, ev, g.start))
	p.wallLeads.push(ev.Start - g.start)
	sh.done = g.start
}

// running is the time ev's thread ran from `from` to ev: a lead as lite
// measures it, without the time the thread could not run.
func (p *proc) running(x env, ev *event.Event, from int64) int64 {
	d := ev.Start - from
	if th := x.w.threads[ev.TID]; th != nil {
		d -= th.Stopped(from, ev.Start)
	}
	return d
}

// launchesSeen says whether every kernel launch in [lo, hi] was seen: at
// full, or under auto inside one window. Under auto the step clock still
// compares steps without launch counts (windows and the time between them
// count launches differently), but where launches were seen their absence
// is evidence: steps of a loop launch kernels.
func (set settings) launchesSeen(lo, hi int64) bool {
	if set.modes != nil {
		return set.modes.fullOver(lo, hi)
	}
	return !set.lite
}
