package ranks

// Lateness asks the other ranks' timelines about collective r, whose wait
// ended at end. ok is false when a rank of its group is not traced here,
// has not shown the collective, or the sequences disagree (lost events):
// the caller then falls back to this rank's own history.
func (reg *Registry) Lateness(r Ref, end int64) (Late, bool) {
	c := r.c
	if c == nil || c.group == nil || c.group.ambiguous || c.group.members[c.slot] != c || !c.group.complete() {
		return Late{}, false
	}
	g := c.group
	seq := r.seq + c.off
	late := Late{Rank: c.rank, PID: c.pid}
	self := true
	for _, m := range g.sorted() {
		if m == c {
			continue
		}
		j := seq - m.off
		t, first, ok := m.issuedAt(j)
		// A peer that issued the collective after this rank's wait on it
		// ended is impossible: the sequences are misaligned.
		if !ok || t > end {
			return Late{}, false
		}
		if g.linked && c.held(r.seq) && m.sig[j%issueRing] != c.sig[r.seq%issueRing] {
			return Late{}, false
		}
		by := t - r.at
		if first > 0 && r.first > 0 {
			// Never longer than from this rank's issue to the wait's end:
			// work that began long before (no drain between steps) says
			// nothing about this step.
			by = max(by, min(first-r.first, end-r.at))
		}
		if self || by > late.By {
			late, self = Late{Rank: m.rank, PID: reg.realPID(m.pid), From: reg.sidecarOf(m.pid), By: by}, false
		}
	}
	return late, true
}

// Completion is the earliest time a rank's sync saw collective r complete,
// and whether every rank's did already. The collective completes at once
// on every rank; the ranks' syncs return when their threads get a CPU, so
// the earliest return says best when it completed.
func (reg *Registry) Completion(r Ref) (int64, bool) {
	c := r.c
	if c == nil || c.group == nil || !c.group.complete() {
		return 0, false
	}
	var first int64
	all := true
	for _, m := range c.group.sorted() {
		t, ok := m.completedBy(r.seq + c.off - m.off)
		if !ok {
			all = false
			continue
		}
		if first == 0 || t < first {
			first = t
		}
	}
	return first, all
}

// AwaitsLink reports whether a verdict on a wait on collective r is best
// left for a while to the ranks: its communicator may soon be linked to
// another traced process's, or a member of its group has not shown the
// collective yet (its event arrives late).
func (reg *Registry) AwaitsLink(r Ref) bool {
	c := r.c
	if c == nil {
		return false
	}
	if g := c.group; g != nil && !g.ambiguous && g.complete() {
		for _, m := range g.members {
			// A rank that is gone issues nothing more.
			if j := r.seq + c.off - m.off; j >= m.n && j < m.n+issueRing && reg.live(m.pid) {
				return true
			}
		}
		return false
	}
	if !linkable(c) || c.n > linkEager {
		return false
	}
	for k, o := range reg.comms {
		if k.pid != c.pid && linkable(o) && reg.live(o.pid) {
			return true
		}
	}
	return false
}

// Vote records process pid's verdict of the half-step prologue rule
// (sliver: its prologue is a sliver of its loop's first iteration) in each
// group of its communicators, and returns the groups' verdict: any, some
// rank of them found a sliver (pid's own verdict included); all, every
// rank this engine traces has voted, but those that exited (exited: a
// process of this engine that exited). Ranks traced by other sidecars do
// not vote: step numbers agree there by the communicators' sequences.
func (reg *Registry) Vote(pid uint32, sliver bool, exited func(pid uint32) bool) (all, any bool) {
	all, any = true, sliver
	for _, c := range reg.comms {
		g := c.group
		if c.pid != pid || g == nil || g.ambiguous || g.members[c.slot] != c {
			continue
		}
		if g.prologue == nil {
			g.prologue = map[int32]bool{}
		}
		g.prologue[c.slot] = sliver
		for rank, m := range g.members {
			if reg.Mirrored(m.pid) {
				continue
			}
			v, ok := g.prologue[rank]
			if !ok && !exited(m.pid) {
				// A rank that exited without a clock has no verdict.
				all = false
			}
			any = any || v
		}
	}
	return all, any
}
