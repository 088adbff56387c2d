package correlate

import "github.com/gaptrace/gaptrace/correlate/interval"

// emit records a gap on the device and delivers it once its step is known.
func (p *proc) emit(x env, g Gap) {
	if x.set.modes != nil {
		g.Probes = x.probesOver(g.Start, g.End)
	}
	x.w.samples.mappedReads(&g)
	x.w.samples.sampledCalls(&g, x.w.Thread(g.TID))
	x.w.samples.attachCode(&g)
	d := x.d
	if g.Kind == GapStall {
		d.stalls = interval.Add(d.stalls, interval.Span{A: g.Start, B: g.End})
	} else {
		d.gaps = interval.Add(d.gaps, interval.Span{A: g.Start, B: g.End})
	}
	if p.st.undecided(g.Start + g.Duration/2) {
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
		st.lastGap = max(st.lastGap, g.Start+g.Duration/2)
		if g.Kind == GapStall {
			st.StallNS += g.Duration
		} else {
			st.BoundedIdleNS += g.Duration
		}
		for c, ns := range g.Breakdown {
			st.ByCause[c] += ns
		}
		st.gaps = append(st.gaps, g)
	} else {
		g.Step, g.Late = p.st.doneNum, true
		if p.st.emitted {
			// Every step that could hold it is out: the gap counts in
			// the totals and the gaps file, in no step.
			p.out.afterStep++
		}
		set.log.Debug("gap belongs to a step already emitted", "pid", p.pid, "start", g.Start, "step", g.Step)
	}
	p.out.gap(g)
}
