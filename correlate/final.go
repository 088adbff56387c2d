package correlate

// When a step is final: the step holding a time, whether every input of
// a step is in, and emitting the steps that are.

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
	if p.gap.cur() != nil && p.gap.cur().start < st.End {
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
	if a := p.ahead.Start(); a != 0 && a < st.End {
		return false
	}
	if p.st.siteYoung() && x.clk.now < st.End+holdMax {
		// The call sites may yet take these steps back (giveBack).
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
