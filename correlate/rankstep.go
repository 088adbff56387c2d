package correlate

import "github.com/gaptrace/gaptrace/correlate/stepclock"

// The half-step prologue rule (clock.go: a prologue that is a sliver of the
// loop's first iteration is that iteration, so that step N is iteration N)
// judges one rank's start, and ranks start differently: one broadcasts the
// weights or warms up before the loop, another enters it at once. The
// ranks of a communicator run the same iterations, and a rank's first clock
// operation falling just after its loop began shows that the first
// boundary lies inside iteration 1 on every rank: the prologue is merged
// into the first step on every rank when any rank of the group found it a
// sliver. Until every traced rank of its groups has voted (or holdMax has
// passed), a rank emits no step and holds its gaps, whose step numbers the
// verdict decides.

// prologueVote is one process's verdict and what it did about it.
type prologueVote struct {
	sliver bool  // its own prologue was a sliver of the first iteration
	num    int64 // the prologue's step number
	open   bool  // the group's verdict is still awaited
	since  int64 // when the group's verdict began to be awaited (watermark)
}

// settleVote records the process's verdict in its groups and applies the
// group's; it reports whether steps must wait for other ranks' verdicts.
func (p *proc) settleVote(x env, force bool) bool {
	v := p.st.vote
	if v == nil || !v.open {
		return false
	}
	if v.since == 0 {
		v.since = x.clk.wm
	}
	all, any := x.w.ranks.Vote(p.pid, v.sliver, func(pid uint32) bool {
		mp := x.w.procs[pid]
		return mp != nil && mp.exitedAt != 0
	})
	if any && !v.sliver {
		p.st.mergePrologue(v.num)
		v.sliver = true
	}
	if all || force || x.clk.wm-v.since > holdMax/2 {
		v.open = false
		p.resolveHeld(x, false)
		return false
	}
	return true
}

// mergePrologue makes the prologue window numbered num part of the step
// after it, numbering the later steps one less. Nothing of them has been
// emitted: steps and gaps wait for the verdict.
func (s *stepper) mergePrologue(num int64) {
	for i := 0; i+1 < len(s.steps); i++ {
		a, b := s.steps[i], s.steps[i+1]
		if a.Number != num {
			continue
		}
		a.End, a.closed, a.Window = b.End, b.closed, false
		a.Gaps += b.Gaps
		a.gaps = append(a.gaps, b.gaps...)
		a.StallNS += b.StallNS
		a.BoundedIdleNS += b.BoundedIdleNS
		a.Launches += b.Launches
		for c, ns := range b.ByCause {
			a.ByCause[c] += ns
		}
		s.steps = append(s.steps[:i+1], s.steps[i+2:]...)
		for _, st := range s.steps[i+1:] {
			st.Number--
		}
		s.next--
		return
	}
}

// Step numbers that agree across sidecars. The half-step prologue rule
// above needs every rank in one engine; a sidecar per rank sees one. What
// every rank sees alike is its communicators' sequences: the ranks of a
// communicator issue the same collectives in the same order, every
// iteration. Under the work clock, a collective that occurs the same
// number of times (per) in every step anchors the numbering: the step
// holding its k-th occurrence since the communicator's creation is step
// k/per + 1, on every rank, whatever each one did before. Steps before the
// first that holds one (a rank's setup, warm-up) are its prologue and count
// down to it: one prologue before step 1 is step 0. A step that holds none
// later on (a checkpoint's) follows its predecessor, and the next anchored
// step takes its number from the sequence again, never reusing one.

// stepAnchor is the collective that numbers a process's steps.
type stepAnchor struct {
	key stepclock.Key
	per int64 // occurrences per step
}

// anchorSegs: steps of the token ring compared to find the anchor.
const anchorSegs = 8

// findAnchor picks, from the clock's last steps in the token ring, a
// collective counted from its communicator's creation that every one of
// them holds equally often. Segments of m clock occurrences from any
// phase hold one step's operations each. Of several such collectives the
// choice depends only on what they are, so that every rank makes it alike.
func (s *stepper) findAnchor() *stepAnchor {
	c := s.clock
	if c == nil {
		return nil
	}
	var bounds []int
	k := 0
	for i := range s.toks {
		if s.toks[i].Key != c.key {
			continue
		}
		if k%c.m == 0 {
			bounds = append(bounds, i)
		}
		k++
	}
	if len(bounds) < 3 {
		return nil
	}
	if len(bounds) > anchorSegs+1 {
		bounds = bounds[len(bounds)-anchorSegs-1:]
	}
	var per map[stepclock.Key]int64
	for j := 0; j+1 < len(bounds); j++ {
		seg := map[stepclock.Key]int64{}
		for i := bounds[j]; i < bounds[j+1]; i++ {
			if t := &s.toks[i]; t.Occ >= 0 {
				seg[t.Key]++
			}
		}
		if per == nil {
			per = seg
			continue
		}
		for key, n := range per {
			if seg[key] != n {
				delete(per, key)
			}
		}
	}
	var best *stepAnchor
	for key, n := range per {
		if best == nil || anchorBefore(key, n, best) {
			best = &stepAnchor{key: key, per: n}
		}
	}
	return best
}

// anchorBefore orders candidate anchors: the largest (a gradient bucket
// rather than a loss scalar), then by operation, count and stream.
func anchorBefore(k stepclock.Key, n int64, b *stepAnchor) bool {
	switch {
	case k.Bytes != b.key.Bytes:
		return k.Bytes > b.key.Bytes
	case k.Op != b.key.Op:
		return k.Op < b.key.Op
	case n != b.per:
		return n < b.per
	case k.Stream != b.key.Stream:
		return k.Stream < b.key.Stream
	}
	return k.Comm < b.key.Comm
}

// anchorIn is the first occurrence of the anchor enqueued in [lo, hi), -1
// when none; hi < 0 is a step still open, whose occurrence may be the next
// one to come.
func (s *stepper) anchorIn(lo, hi int64) int64 {
	a := s.anchor
	last := int64(-1)
	for i := range s.toks {
		t := &s.toks[i]
		if t.Key != a.key || t.Occ < 0 {
			continue
		}
		if t.T >= lo && (hi < 0 || t.T < hi) {
			return t.Occ
		}
		if t.T < lo {
			last = t.Occ
		}
	}
	if hi < 0 && last >= 0 {
		return last + 1
	}
	return -1
}

// renumber numbers the pending steps from the from-th on by the anchor.
// A step whose gaps were delivered keeps its number: they carry it.
func (s *stepper) renumber(from int) {
	a := s.anchor
	from = max(from, 0)
	if a == nil || from >= len(s.steps) {
		return
	}
	occ := func(st *stepAcc) int64 {
		hi := int64(-1)
		if st.closed {
			hi = st.End
		}
		return s.anchorIn(st.Start, hi)
	}
	if from == 0 {
		// The prologue counts down to the first anchored step, above
		// every number emitted.
		for i, st := range s.steps {
			if st.Gaps > 0 {
				break
			}
			o := occ(st)
			if o < 0 {
				continue
			}
			base, lo := o/a.per+1-int64(i), int64(0)
			if s.emitted {
				lo = s.doneNum + 1
			}
			if i > 0 && base >= lo {
				for j := 0; j < i; j++ {
					s.steps[j].Number = base + int64(j)
				}
				from = i
			}
			break
		}
	}
	for i := from; i < len(s.steps); i++ {
		st := s.steps[i]
		if st.Gaps > 0 {
			continue
		}
		prev := int64(0)
		switch {
		case i > 0:
			prev = s.steps[i-1].Number
		case s.emitted:
			prev = s.doneNum
		}
		n := prev + 1
		if o := occ(st); o >= 0 {
			n = max(n, o/a.per+1)
		}
		st.Number = n
	}
	s.next = s.steps[len(s.steps)-1].Number + 1
}
