package correlate

import "github.com/gaptrace/gaptrace/event"

// Cross-rank matching: when one engine sees several ranks of a job, their
// own timelines say which rank a collective waited for. NCCL creates one
// communicator per rank; those of different processes that form the same
// group are linked, and the k-th collective issued on each of them is the
// same collective. It cannot complete before the last rank's stream reached
// it. The ranks run the same step, so a rank's stream reaches the collective
// when it has run the step's work since it began (its first enqueue after
// the queue drained) and the collective was issued: a rank waited, from its
// own readiness, for as long as the last rank began its step's work after
// it did, or issued the collective after it did, whichever is longer (a
// late host before the step, or one that launched slowly).

// commKey names one process's communicator: handles are addresses, and two
// processes forked from one trainer often get the same one.
type commKey struct {
	pid  uint32
	comm uint64
}

// commInfo describes one NCCL communicator of one process.
type commInfo struct {
	ranks, rank int32
	pid         uint32
	group       *commGroup
	// issued holds the issue times of the last collectives, by sequence
	// number (n counts every collective issued on it).
	issued [issueRing]int64
	// first holds, by sequence number, when the issuing process's GPU work
	// that the collective ends began (0: unknown).
	first [issueRing]int64
	n     int64
	// done holds, by sequence number, the earliest return of a sync of
	// this process that covered the collective: it had completed by then.
	done [issueRing]int64
}

// issueRing bounds how far one rank may run ahead of another in issued
// collectives and still be matched; a trainer syncs every step, so its
// ranks are at most a step's collectives apart.
const issueRing = 256

func (c *commInfo) issue(t, first int64) int64 {
	c.issued[c.n%issueRing] = t
	c.first[c.n%issueRing] = first
	c.done[c.n%issueRing] = 0
	c.n++
	return c.n - 1
}

// complete records that the seq-th collective had completed by t.
func (c *commInfo) complete(seq, t int64) {
	if seq < 0 || seq >= c.n || seq < c.n-issueRing {
		return
	}
	if d := &c.done[seq%issueRing]; *d == 0 || t < *d {
		*d = t
	}
}

// completedBy is when a sync of this process saw the seq-th collective
// complete, if one did.
func (c *commInfo) completedBy(seq int64) (int64, bool) {
	if seq < 0 || seq >= c.n || seq < c.n-issueRing || c.done[seq%issueRing] == 0 {
		return 0, false
	}
	return c.done[seq%issueRing], true
}

// issuedAt is the issue time of the seq-th collective and when the work it
// ends began, if still held.
func (c *commInfo) issuedAt(seq int64) (at, first int64, ok bool) {
	if seq < 0 || seq >= c.n || seq < c.n-issueRing {
		return 0, 0, false
	}
	return c.issued[seq%issueRing], c.first[seq%issueRing], true
}

// groupKey links the communicators of one group across processes: the
// same size, created at the same place in each process's sequence of
// communicators of that size. Ranks of one job create their communicators
// in the same order (every rank must call the same init for NCCL to
// rendezvous).
type groupKey struct {
	ranks int32
	ord   int
}

// commGroup is one communicator group: one member per rank.
type commGroup struct {
	members map[int32]*commInfo
	// prologue: each rank's verdict of the half-step prologue rule.
	prologue map[int32]bool
	// ambiguous: two live processes claimed one rank (two jobs of the same
	// shape traced at once); the group cannot be matched.
	ambiguous bool
}

// collRef is one collective issued by this process: its communicator,
// place in that communicator's sequence, issue time and when the GPU work
// it ends began.
type collRef struct {
	c         *commInfo
	seq       int64
	at, first int64
}

// peerLate is the verdict of the ranks' timelines on one collective: the
// last rank to issue it, and how much later than this rank it did (≤ 0:
// this rank was the last).
type peerLate struct {
	rank int32
	pid  uint32
	by   int64
}

// addComm records a communicator's creation and links it to its group.
func (w *world) addComm(ev *event.Event) {
	if w.comms == nil || len(w.comms) >= maxComms {
		w.comms, w.groups, w.commOrd = map[commKey]*commInfo{}, map[groupKey]*commGroup{}, map[commOrdKey]int{}
	}
	c := &commInfo{ranks: int32(ev.Count), rank: ev.PeerRank, pid: ev.PID}
	k := commKey{pid: ev.PID, comm: ev.Comm}
	if old := w.comms[k]; old != nil {
		w.unlink(old)
	}
	w.comms[k] = c
	if c.ranks < 2 || c.rank < 0 || c.rank >= c.ranks {
		return
	}
	ok := commOrdKey{pid: ev.PID, ranks: c.ranks}
	gk := groupKey{ranks: c.ranks, ord: w.commOrd[ok]}
	w.commOrd[ok]++
	g := w.groups[gk]
	if g == nil {
		g = &commGroup{members: map[int32]*commInfo{}}
		w.groups[gk] = g
	}
	if m := g.members[c.rank]; m != nil && m.pid != c.pid {
		// A rank restarted (elastic training) replaces its predecessor;
		// a second live process with the same rank is another job.
		if p := w.procs[m.pid]; p != nil && p.exitedAt == 0 {
			g.ambiguous = true
		}
	}
	g.members[c.rank] = c
	c.group = g
}

// commOrdKey counts one process's communicators of one size.
type commOrdKey struct {
	pid   uint32
	ranks int32
}

// unlink takes c out of its group.
func (w *world) unlink(c *commInfo) {
	if c.group != nil && c.group.members[c.rank] == c {
		delete(c.group.members, c.rank)
	}
	c.group = nil
}

// forgetComms drops the communicators of a process that is gone.
func (w *world) forgetComms(pid uint32) {
	for k, c := range w.comms {
		if k.pid == pid {
			w.unlink(c)
			delete(w.comms, k)
		}
	}
	for k := range w.commOrd {
		if k.pid == pid {
			delete(w.commOrd, k)
		}
	}
}

// issueColl records a collective's issue on its communicator; first is
// when the GPU work it ends began (0: unknown). Sends and receives are left
// out: ranks issue different ones (a pipeline stage sends where the next
// receives), so the k-th of them is not one operation on every rank.
func (w *world) issueColl(ev *event.Event, first int64) collRef {
	c := w.comms[commKey{pid: ev.PID, comm: ev.Comm}]
	if c == nil || ev.Op == event.NCCLSend || ev.Op == event.NCCLRecv || ev.Op == event.NCCLNone || ev.Op >= event.NCCLLast {
		return collRef{}
	}
	return collRef{c: c, seq: c.issue(ev.Start, first), at: ev.Start, first: first}
}

// lateness asks the other ranks' timelines about collective r, whose wait
// ended at end. ok is false when a rank of its group is not traced here,
// has not shown the collective, or the sequences disagree (lost events):
// the caller then falls back to this rank's own history.
func (w *world) lateness(r collRef, end int64) (peerLate, bool) {
	c := r.c
	if c == nil || c.group == nil || c.group.ambiguous || c.group.members[c.rank] != c {
		return peerLate{}, false
	}
	late := peerLate{rank: c.rank, pid: c.pid}
	for rank := int32(0); rank < c.ranks; rank++ {
		if rank == c.rank {
			continue
		}
		m := c.group.members[rank]
		if m == nil {
			return peerLate{}, false
		}
		t, first, ok := m.issuedAt(r.seq)
		// A peer that issued the collective after this rank's wait on it
		// ended is impossible: the sequences are misaligned.
		if !ok || t > end {
			return peerLate{}, false
		}
		by := t - r.at
		if first > 0 && r.first > 0 {
			// Never longer than from this rank's issue to the wait's end:
			// work that began long before (no drain between steps) says
			// nothing about this step.
			by = max(by, min(first-r.first, end-r.at))
		}
		if late.rank == c.rank || by > late.by {
			late = peerLate{rank: rank, pid: m.pid, by: by}
		}
	}
	return late, true
}

// completion is the earliest time a rank's sync saw collective r complete,
// and whether every rank's did already. The collective completes at once
// on every rank; the ranks' syncs return when their threads get a CPU, so
// the earliest return says best when it completed.
func (w *world) completion(r collRef) (int64, bool) {
	c := r.c
	if c == nil || c.group == nil {
		return 0, false
	}
	var first int64
	all := true
	for rank := int32(0); rank < c.ranks; rank++ {
		m := c.group.members[rank]
		if m == nil {
			return first, false
		}
		t, ok := m.completedBy(r.seq)
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
	all, any := true, v.sliver
	for _, c := range x.w.comms {
		g := c.group
		if c.pid != p.pid || g == nil || g.ambiguous || g.members[c.rank] != c {
			continue
		}
		if g.prologue == nil {
			g.prologue = map[int32]bool{}
		}
		g.prologue[c.rank] = v.sliver
		for rank, m := range g.members {
			sliver, ok := g.prologue[rank]
			if !ok {
				// A rank that exited without a clock has no verdict.
				if mp := x.w.procs[m.pid]; mp == nil || mp.exitedAt == 0 {
					all = false
				}
			}
			any = any || sliver
		}
	}
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
