package ranks

import "github.com/gaptrace/gaptrace/event"

// Registry is every NCCL communicator the engine knows of, in its own
// processes and, mirrored, in those other sidecars of the job trace: what
// each is (ranks, the process's rank), the groups that link those of
// different processes, their collectives' sequences, and what each
// process's environment says of its rank. The engine feeds it creations,
// collectives, ranks and peers' records, and asks it for the ranks'
// verdict on a wait (Lateness, Completion, AwaitsLink). One goroutine
// uses it.
type Registry struct {
	// alive reports whether a process this engine traces has not exited
	// (the engine's process table).
	alive func(pid uint32) bool
	// comms: what each NCCL communicator is (ranks, this process's
	// rank), from its creation; bounded by maxComms. groups links those of
	// different processes that are one group; commOrd numbers each
	// process's communicators of one size in creation order.
	comms   map[commKey]*commInfo
	groups  map[groupKey]*commGroup
	commOrd map[commOrdKey]int
	// rankOf: each process's rank and job size from its environment
	// (SetRank); refuted: pairs of processes whose communicators were
	// linked from their collectives and then disagreed (link.go).
	rankOf  map[uint32]procRank
	refuted map[pidPair]bool
	// realigned: how often a communicator linked from its creation was
	// shifted to the offset its collectives agree at (link.go).
	realigned int
	// out takes the changes to this engine's communicators for the
	// other sidecars of the job; mirrors are the processes those traced,
	// by the pid that stands for them here (mirror.go).
	out        func(Record)
	mirrorOf   map[mirrorKey]uint32
	mirrors    map[uint32]*mirror
	nextMirror uint32
	// mirrorComms counts the mirrors' communicators in comms (at most
	// maxMirrorComms).
	mirrorComms int
}

// New is an empty registry; alive reports whether a process of this
// engine has not exited (a rank that exited may be replaced by another
// with its rank, a live one may not).
func New(alive func(pid uint32) bool) *Registry {
	return &Registry{alive: alive, rankOf: map[uint32]procRank{}}
}

// procRank is a process's rank and its job's size (0: unknown), as its
// environment says.
type procRank struct {
	rank, size int32
}

// maxComms bounds the communicator table (a job creates a handful).
const maxComms = 4096

// SetOut makes the registry report every change to this engine's own
// communicators to out, for the other engines of the job (Peer). out is
// called from the goroutine that uses the registry and must not block.
func (reg *Registry) SetOut(out func(Record)) { reg.out = out }

// SetRank says what process pid's environment says of its place in a
// distributed job: its rank and the job's size (0: unknown); a
// communicator of it whose creation was not seen, and not linked yet,
// takes them.
func (reg *Registry) SetRank(pid uint32, rank, size int32) {
	r := procRank{rank: rank, size: size}
	reg.rankOf[pid] = r
	for k, c := range reg.comms {
		if k.pid == pid && c.inferred && c.group == nil {
			c.rank, c.slot, c.ownRank, c.size = r.rank, r.rank, r.rank, r.size
			reg.own(c, true)
		}
	}
}

// Realigned counts the communicators linked from their creation that were
// shifted to the offset their collectives agree at.
func (reg *Registry) Realigned() int { return reg.realigned }

// RankIn is process pid's rank in its communicator comm and the
// communicator's size, when its creation was seen.
func (reg *Registry) RankIn(pid uint32, comm uint64) (rank, ranks int32, ok bool) {
	if c := reg.comms[commKey{pid: pid, comm: comm}]; c != nil && c.ranks > 0 {
		return c.rank, c.ranks, true
	}
	return 0, 0, false
}

// Linked counts the communicators that are members of a group.
func (reg *Registry) Linked() int {
	n := 0
	for _, c := range reg.comms {
		if c.group != nil {
			n++
		}
	}
	return n
}

// initComms makes the communicator tables.
func (reg *Registry) initComms() {
	reg.comms, reg.groups, reg.commOrd = map[commKey]*commInfo{}, map[groupKey]*commGroup{}, map[commOrdKey]int{}
	reg.refuted = map[pidPair]bool{}
	reg.mirrorComms = 0
}

// Add records a communicator's creation (ev is a KindCommInit) and links
// it to its group.
func (reg *Registry) Add(ev *event.Event) {
	if reg.comms == nil || len(reg.comms) >= maxComms {
		reg.initComms()
	}
	c := &commInfo{ranks: int32(ev.Count), rank: ev.PeerRank, slot: ev.PeerRank, pid: ev.PID, handle: ev.Comm}
	k := commKey{pid: ev.PID, comm: ev.Comm}
	if old := reg.comms[k]; old != nil {
		reg.unlink(old)
	}
	reg.comms[k] = c
	reg.own(c, false)
	if c.ranks < 2 || c.rank < 0 || c.rank >= c.ranks {
		return
	}
	ok := commOrdKey{pid: ev.PID, ranks: c.ranks}
	gk := groupKey{ranks: c.ranks, ord: reg.commOrd[ok]}
	reg.commOrd[ok]++
	g := reg.groups[gk]
	if g == nil {
		g = &commGroup{members: map[int32]*commInfo{}}
		reg.groups[gk] = g
	}
	if m := g.members[c.rank]; m != nil && m.pid != c.pid {
		// A rank restarted (elastic training) replaces its predecessor;
		// a second live process with the same rank is another job.
		if reg.live(m.pid) {
			g.ambiguous = true
		}
	}
	g.members[c.rank] = c
	g.order = nil
	c.group = g
}

// live reports whether pid is a traced process that has not exited.
func (reg *Registry) live(pid uint32) bool {
	if m := reg.mirrors[pid]; m != nil {
		return !m.gone
	}
	return reg.alive(pid)
}

// commOrdKey counts one process's communicators of one size.
type commOrdKey struct {
	pid   uint32
	ranks int32
}

// unlink takes c out of its group.
func (reg *Registry) unlink(c *commInfo) {
	if c.group != nil && c.group.members[c.slot] == c {
		delete(c.group.members, c.slot)
		c.group.order = nil
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
func (reg *Registry) own(c *commInfo, again bool) {
	if reg.out == nil || reg.Mirrored(c.pid) {
		return
	}
	c.tell = reg.out
	r := Record{Kind: KindComm, PID: c.pid, Comm: c.handle, Ranks: c.ranks, Rank: c.rank}
	if c.inferred {
		r.Ranks, r.Rank, r.Size, r.Inferred = 0, c.ownRank, c.size, true
	}
	if !again || c.inferred {
		c.tell(r)
	}
}

// Forget drops the communicators of a process that is gone, and what its
// environment said of its rank.
func (reg *Registry) Forget(pid uint32) {
	if reg.out != nil && !reg.Mirrored(pid) && reg.hasComms(pid) {
		reg.out(Record{Kind: KindGone, PID: pid})
	}
	mirrored := reg.Mirrored(pid)
	for k, c := range reg.comms {
		if k.pid == pid {
			reg.unlink(c)
			delete(reg.comms, k)
			if mirrored {
				reg.mirrorComms--
			}
		}
	}
	for k := range reg.commOrd {
		if k.pid == pid {
			delete(reg.commOrd, k)
		}
	}
	for k := range reg.refuted {
		if k.a == pid || k.b == pid {
			delete(reg.refuted, k)
		}
	}
	delete(reg.rankOf, pid)
}

// Issue records a collective's issue on its communicator; first is
// when the GPU work it ends began (0: unknown). Sends and receives are left
// out: ranks issue different ones (a pipeline stage sends where the next
// receives), so the k-th of them is not one operation on every rank. A
// communicator whose creation was not seen (created before tracing began,
// or before the probes were in) is known from its first collective on.
func (reg *Registry) Issue(ev *event.Event, first int64) Ref {
	if ev.Op == event.NCCLSend || ev.Op == event.NCCLRecv || ev.Op == event.NCCLNone || ev.Op >= event.NCCLLast {
		return Ref{}
	}
	c := reg.comms[commKey{pid: ev.PID, comm: ev.Comm}]
	if c == nil {
		if c = reg.inferComm(ev); c == nil {
			return Ref{}
		}
	}
	occ := int64(-1)
	if !c.inferred {
		k := occKey{op: ev.Op, stream: ev.Stream, bytes: ev.Bytes}
		if c.occ == nil {
			c.occ = map[occKey]int64{}
		}
		n, ok := c.occ[k]
		if ok || len(c.occ) < occKeysMax {
			c.occ[k] = n + 1
			occ = n
		}
		// Else collectives of ever new sizes: none of them clocks a loop.
	}
	r := Ref{c: c, seq: c.issue(ev.Start, first, collSig(ev)), at: ev.Start, first: first, occ: occ}
	reg.link(c)
	return r
}

// inferComm records a communicator first seen by a collective; nil when
// the table is full.
func (reg *Registry) inferComm(ev *event.Event) *commInfo {
	if reg.comms == nil {
		reg.initComms()
	}
	if len(reg.comms) >= maxComms {
		return nil
	}
	c := &commInfo{rank: -1, slot: -1, ownRank: -1, pid: ev.PID, inferred: true, handle: ev.Comm}
	if r, ok := reg.rankOf[ev.PID]; ok {
		c.rank, c.slot, c.ownRank, c.size = r.rank, r.rank, r.rank, r.size
	}
	reg.comms[commKey{pid: ev.PID, comm: ev.Comm}] = c
	reg.own(c, false)
	return c
}
