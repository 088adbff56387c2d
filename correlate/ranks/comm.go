package ranks

import (
	"maps"
	"slices"

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
// ranks), else from their collectives (link.go).

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
	// rank, and numbers steps alike in separate sidecars (the engine's
	// rankstep.go).
	occ map[occKey]int64
	// handle is the ncclComm_t; tell, for a communicator of this engine's
	// own processes, reports its changes to the job's other sidecars
	// (mirror.go).
	handle uint64
	tell   func(Record)
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
		c.tell(Record{Kind: KindIssue, PID: c.pid, Comm: c.handle, Seq: c.n - 1, At: t, First: first, Sig: sig})
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
			c.tell(Record{Kind: KindDone, PID: c.pid, Comm: c.handle, Seq: seq, At: t, From: from})
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
	// order is members in slot order (sorted), nil once they changed:
	// every collective of every rank reads it, members change rarely.
	order []*commInfo
	// prologue: each rank's verdict of the half-step prologue rule.
	prologue map[int32]bool
	// ambiguous: two live processes claimed one rank (two jobs of the same
	// shape traced at once); the group cannot be matched.
	ambiguous bool
	// linked: formed from the members' collectives (link.go), not
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
// Callers must not change it; whoever changes members sets order to nil.
func (g *commGroup) sorted() []*commInfo {
	if g.order != nil || len(g.members) == 0 {
		return g.order
	}
	out := make([]*commInfo, 0, len(g.members))
	for _, k := range slices.Sorted(maps.Keys(g.members)) {
		out = append(out, g.members[k])
	}
	g.order = out
	return out
}

// occKey is what a collective is within its communicator, as the step
// clock tells operations apart (stepclock.TokenOf: its kind and
// communicator are the communicator's own).
type occKey struct {
	op     event.NCCLOp
	stream uint64
	bytes  uint64
}

// Ref is one collective issued by a process: its communicator, place in
// that communicator's sequence, issue time and when the GPU work it ends
// began. The zero Ref is no collective (a send, a receive, a full table).
type Ref struct {
	c         *commInfo
	seq       int64
	at, first int64
	// occ: how many collectives like this one the communicator issued
	// before it, counted from its creation (-1: not counted, its creation
	// was not seen).
	occ int64
}

// Valid reports whether r is a collective on a known communicator.
func (r Ref) Valid() bool { return r.c != nil }

// At is when the collective was issued.
func (r Ref) At() int64 { return r.at }

// Occ is how many collectives like this one its communicator issued
// before it since its creation (-1: its creation was not seen).
func (r Ref) Occ() int64 { return r.occ }

// Rank is the issuing process's rank in the communicator, as known now
// (from its creation, its environment or what its linked group left; -1:
// unknown).
func (r Ref) Rank() int32 {
	if r.c == nil {
		return -1
	}
	return r.c.rank
}

// Complete records that the collective had completed by t, as a sync of
// its process that began at from showed.
func (r Ref) Complete(t, from int64) {
	if r.c != nil {
		r.c.complete(r.seq, t, from)
	}
}

// Late is the verdict of the ranks' timelines on one collective: the last
// rank to issue it (its process, and its rank where known, else -1), and
// how much later than the judged rank it did (≤ 0: that rank was the
// last).
type Late struct {
	Rank int32
	PID  uint32
	From string // the sidecar that traced it, when another one did
	By   int64
}
