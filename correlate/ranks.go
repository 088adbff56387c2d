package correlate

import (
	"maps"
	"slices"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

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
//
// Communicators are linked from their creation when it was seen (same
// size, same place in each process's sequence of creations, distinct
// ranks), else from their collectives (ranklink.go).

// commKey names one process's communicator: handles are addresses, and two
// processes forked from one trainer often get the same one.
type commKey struct {
	pid  uint32
	comm uint64
}

// commInfo describes one NCCL communicator of one process.
type commInfo struct {
	// ranks and rank: from its creation; for one whose creation was not
	// seen (inferred), ranks is 0 and rank the process's own (RANK in its
	// environment, SetRank) or -1, and size the job's size there (0:
	// unknown).
	ranks, rank int32
	size        int32
	inferred    bool
	// ownRank is the rank an inferred communicator knows by itself (its
	// process's environment, else -1); a linked group may tell it more.
	ownRank int32
	pid     uint32
	group   *commGroup
	// slot is its key in group.members: its rank, or a number below 0
	// for a member of a linked group whose rank is unknown. off maps its
	// sequence numbers to the group's: the group's k-th collective is its
	// (k-off)-th (a linked group's members were first seen at different
	// points of their sequences).
	slot int32
	off  int64
	// issued holds the issue times of the last collectives, by sequence
	// number (n counts every collective issued on it).
	issued [issueRing]int64
	// first holds, by sequence number, when the issuing process's GPU work
	// that the collective ends began (0: unknown).
	first [issueRing]int64
	n     int64
	// done holds, by sequence number, the earliest return of a sync of
	// this process that covered the collective: it had completed by then;
	// doneFrom is when that sync began.
	done, doneFrom [issueRing]int64
	// sig holds, by sequence number, what the collective was (operation,
	// count, bytes, root): linked members must agree on it.
	sig [issueRing]uint64
	// occ counts the collectives issued on it by what they are (operation,
	// size, stream): the k-th all-reduce of a bucket is the same on every
	// rank, and numbers steps alike in separate sidecars (steps.go).
	occ map[stepclock.Key]int64
	// handle is the ncclComm_t; tell, for a communicator of this engine's
	// own processes, reports its changes to the job's other sidecars
	// (peer.go).
	handle uint64
	tell   func(PeerRecord)
}

// issueRing bounds how far one rank may run ahead of another in issued
// collectives and still be matched; a trainer syncs every step, so its
// ranks are at most a step's collectives apart.
const issueRing = 256

// occKeysMax bounds the kinds of collective counted per communicator.
const occKeysMax = 1024

func (c *commInfo) issue(t, first int64, sig uint64) int64 {
	i := c.n % issueRing
	c.issued[i], c.first[i], c.sig[i] = t, first, sig
	c.done[i], c.doneFrom[i] = 0, 0
	c.n++
	if c.tell != nil {
		c.tell(PeerRecord{Kind: PeerIssue, PID: c.pid, Comm: c.handle, Seq: c.n - 1, At: t, First: first, Sig: sig})
	}
	return c.n - 1
}

// held reports whether the seq-th collective is still in the ring.
func (c *commInfo) held(seq int64) bool {
	return seq >= 0 && seq < c.n && seq >= c.n-issueRing
}

// complete records that the seq-th collective had completed by t, as a
// sync that began at from showed.
func (c *commInfo) complete(seq, t, from int64) {
	if !c.held(seq) {
		return
	}
	if i := seq % issueRing; c.done[i] == 0 || t < c.done[i] {
		c.done[i], c.doneFrom[i] = t, from
		if c.tell != nil {
			c.tell(PeerRecord{Kind: PeerDone, PID: c.pid, Comm: c.handle, Seq: seq, At: t, From: from})
		}
	}
}

// completedBy is when a sync of this process saw the seq-th collective
// complete, if one did.
func (c *commInfo) completedBy(seq int64) (int64, bool) {
	if !c.held(seq) || c.done[seq%issueRing] == 0 {
		return 0, false
	}
	return c.done[seq%issueRing], true
}

// issuedAt is the issue time of the seq-th collective and when the work it
// ends began, if still held.
func (c *commInfo) issuedAt(seq int64) (at, first int64, ok bool) {
	if !c.held(seq) || c.issued[seq%issueRing] == 0 {
		// A mirrored communicator's record lost on the way is unknown.
		return 0, 0, false
	}
	return c.issued[seq%issueRing], c.first[seq%issueRing], true
}

// collSig is what a collective is, as every rank issues it alike: the
// operation, the element count, the bytes (so the datatype's size) and the
// root. Streams and communicator handles are addresses of each process.
func collSig(ev *event.Event) uint64 {
	h := uint64(ev.Op)<<56 ^ uint64(uint32(ev.PeerRank))<<24
	h ^= ev.Bytes * 0x9e3779b97f4a7c15
	h ^= ev.Count * 0xc2b2ae3d27d4eb4f
	return h
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
	// linked: formed from the members' collectives (ranklink.go), not
	// from their creation; size is the group's size where a member's
	// environment says it (0: unknown, the members seen are taken as the
	// whole group).
	linked bool
	size   int32
}

// complete reports whether every rank of the group is a member, as far as
// the engine can know.
func (g *commGroup) complete() bool {
	if g.linked {
		return len(g.members) >= 2 && (g.size == 0 || len(g.members) == int(g.size))
	}
	for _, m := range g.members {
		return len(g.members) == int(m.ranks)
	}
	return false
}

// sorted is the group's members in slot order: decisions over them must
// not depend on the order of a map.
func (g *commGroup) sorted() []*commInfo {
	out := make([]*commInfo, 0, len(g.members))
	for _, k := range slices.Sorted(maps.Keys(g.members)) {
		out = append(out, g.members[k])
	}
	return out
}

// collRef is one collective issued by this process: its communicator,
// place in that communicator's sequence, issue time and when the GPU work
// it ends began.
type collRef struct {
	c         *commInfo
	seq       int64
	at, first int64
	// occ: how many collectives like this one the communicator issued
	// before it, counted from its creation (-1: not counted, its creation
	// was not seen).
	occ int64
}

// peerLate is the verdict of the ranks' timelines on one collective: the
// last rank to issue it (its process, and its rank where known, else -1),
// and how much later than this rank it did (≤ 0: this rank was the last).
type peerLate struct {
	rank int32
	pid  uint32
	from string // the sidecar that traced it, when another one did
	by   int64
}

// initComms makes the communicator tables.
func (w *world) initComms() {
	w.comms, w.groups, w.commOrd = map[commKey]*commInfo{}, map[groupKey]*commGroup{}, map[commOrdKey]int{}
	w.refuted = map[pidPair]bool{}
	w.mirrorComms = 0
}

// addComm records a communicator's creation and links it to its group.
func (w *world) addComm(ev *event.Event) {
	if w.comms == nil || len(w.comms) >= maxComms {
		w.initComms()
	}
	c := &commInfo{ranks: int32(ev.Count), rank: ev.PeerRank, slot: ev.PeerRank, pid: ev.PID, handle: ev.Comm}
	k := commKey{pid: ev.PID, comm: ev.Comm}
	if old := w.comms[k]; old != nil {
		w.unlink(old)
	}
	w.comms[k] = c
	w.own(c, false)
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
		if w.live(m.pid) {
			g.ambiguous = true
		}
	}
	g.members[c.rank] = c
	c.group = g
}

// live reports whether pid is a traced process that has not exited.
func (w *world) live(pid uint32) bool {
	if m := w.mirrors[pid]; m != nil {
		return !m.gone
	}
	p := w.procs[pid]
	return p != nil && p.exitedAt == 0
}

// commOrdKey counts one process's communicators of one size.
type commOrdKey struct {
	pid   uint32
	ranks int32
}

// unlink takes c out of its group.
func (w *world) unlink(c *commInfo) {
	if c.group != nil && c.group.members[c.slot] == c {
		delete(c.group.members, c.slot)
	}
	c.group, c.off = nil, 0
	if c.inferred {
		c.rank = c.ownRank
	}
	c.slot = c.rank
}

// own makes a communicator of this engine's own processes report its
// changes to the job's other sidecars, starting with itself (again, when
// again: its rank became known).
func (w *world) own(c *commInfo, again bool) {
	if w.peerOut == nil || w.mirrored(c.pid) {
		return
	}
	c.tell = w.peerOut
	r := PeerRecord{Kind: PeerComm, PID: c.pid, Comm: c.handle, Ranks: c.ranks, Rank: c.rank}
	if c.inferred {
		r.Ranks, r.Rank, r.Size, r.Inferred = 0, c.ownRank, c.size, true
	}
	if !again || c.inferred {
		c.tell(r)
	}
}

// forgetComms drops the communicators of a process that is gone.
func (w *world) forgetComms(pid uint32) {
	if w.peerOut != nil && !w.mirrored(pid) && w.hasComms(pid) {
		w.peerOut(PeerRecord{Kind: PeerGone, PID: pid})
	}
	mirrored := w.mirrored(pid)
	for k, c := range w.comms {
		if k.pid == pid {
			w.unlink(c)
			delete(w.comms, k)
			if mirrored {
				w.mirrorComms--
			}
		}
	}
	for k := range w.commOrd {
		if k.pid == pid {
			delete(w.commOrd, k)
		}
	}
	for k := range w.refuted {
		if k.a == pid || k.b == pid {
			delete(w.refuted, k)
		}
	}
	delete(w.rankOf, pid)
}

// issueColl records a collective's issue on its communicator; first is
// when the GPU work it ends began (0: unknown). Sends and receives are left
// out: ranks issue different ones (a pipeline stage sends where the next
// receives), so the k-th of them is not one operation on every rank. A
// communicator whose creation was not seen (created before tracing began,
// or before the probes were in) is known from its first collective on.
func (w *world) issueColl(ev *event.Event, first int64) collRef {
	if ev.Op == event.NCCLSend || ev.Op == event.NCCLRecv || ev.Op == event.NCCLNone || ev.Op >= event.NCCLLast {
		return collRef{}
	}
	c := w.comms[commKey{pid: ev.PID, comm: ev.Comm}]
	if c == nil {
		if c = w.inferComm(ev); c == nil {
			return collRef{}
		}
	}
	occ := int64(-1)
	if !c.inferred {
		k, _ := stepclock.TokenOf(ev)
		if c.occ == nil {
			c.occ = map[stepclock.Key]int64{}
		}
		n, ok := c.occ[k]
		if ok || len(c.occ) < occKeysMax {
			c.occ[k] = n + 1
			occ = n
		}
		// Else collectives of ever new sizes: none of them clocks a loop.
	}
	r := collRef{c: c, seq: c.issue(ev.Start, first, collSig(ev)), at: ev.Start, first: first, occ: occ}
	w.link(c)
	return r
}

// inferComm records a communicator first seen by a collective; nil when
// the table is full.
func (w *world) inferComm(ev *event.Event) *commInfo {
	if w.comms == nil {
		w.initComms()
	}
	if len(w.comms) >= maxComms {
		return nil
	}
	c := &commInfo{rank: -1, slot: -1, ownRank: -1, pid: ev.PID, inferred: true, handle: ev.Comm}
	if r, ok := w.rankOf[ev.PID]; ok {
		c.rank, c.slot, c.ownRank, c.size = r.rank, r.rank, r.rank, r.size
	}
	w.comms[commKey{pid: ev.PID, comm: ev.Comm}] = c
	w.own(c, false)
	return c
}

// lateness asks the other ranks' timelines about collective r, whose wait
// ended at end. ok is false when a rank of its group is not traced here,
// has not shown the collective, or the sequences disagree (lost events):
// the caller then falls back to this rank's own history.
func (w *world) lateness(r collRef, end int64) (peerLate, bool) {
	c := r.c
	if c == nil || c.group == nil || c.group.ambiguous || c.group.members[c.slot] != c || !c.group.complete() {
		return peerLate{}, false
	}
	g := c.group
	seq := r.seq + c.off
	late := peerLate{rank: c.rank, pid: c.pid}
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
			return peerLate{}, false
		}
		if g.linked && c.held(r.seq) && m.sig[j%issueRing] != c.sig[r.seq%issueRing] {
			return peerLate{}, false
		}
		by := t - r.at
		if first > 0 && r.first > 0 {
			// Never longer than from this rank's issue to the wait's end:
			// work that began long before (no drain between steps) says
			// nothing about this step.
			by = max(by, min(first-r.first, end-r.at))
		}
		if self || by > late.by {
			late, self = peerLate{rank: m.rank, pid: w.realPID(m.pid), from: w.sidecarOf(m.pid), by: by}, false
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
