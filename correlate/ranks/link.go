package ranks

import (
	"cmp"
	"slices"
	"time"
)

// Communicators linked from their collectives. A communicator created
// before tracing began (`attach --pid` to a running job) or before the
// probes were in (a trainer that creates it right after loading libnccl)
// is known only from its collectives. The ranks of one group still issue
// the same sequence of collectives (the same operation, count, datatype and
// root, in the same order: the k-th of each is one collective), and one
// collective completes at one moment on every rank, after every rank
// issued it. Two live processes' communicators are one group when, at one
// offset between their sequences, over a window of recent collectives:
//
//   - every pair is the same collective (collSig);
//   - no rank's sync saw a collective complete before the other rank
//     issued it (causality: a wrong offset pairs a collective with the
//     other's next or previous one, issued after, or completed before, a
//     sync that waited on it);
//   - where both ranks' syncs were waiting when the first of them returned,
//     they returned together (within linkJitter, or a quarter of the
//     shorter wait): the collective released both at once. In at least
//     linkTested such pairs, all of them while fewer than 8 were compared,
//     three in four beyond.
//
// Two independent jobs of the same shape traced by one engine issue the
// same sequences too, and a wrong pairing of their collectives often
// passes causality (a deep queue keeps a sync waiting long), but their
// collectives complete at unrelated moments: their syncs return apart. Only
// jobs stepping in lockstep within the jitter over the whole window cannot
// be told apart; a link is checked again every linkCheckEvery collectives
// and dropped at the first disagreement, and a pair that disagreed once
// must then agree over the full window (linkWindow pairs, half of them
// tested). A process's rank and its job's size, where its environment
// says them (RANK/WORLD_SIZE, SetRank), bound the group: two members of one
// rank are two jobs, and a group is whole only with size members (a
// communicator smaller than the job, a tensor-parallel group, say, is then
// never judged by its ranks); with no size known, the members seen are
// taken as the whole group (ranks traced by another gaptrace, on another
// node, cannot be seen to be missing). Hashing the ncclUniqueId at
// creation would link communicators exactly, but it is not seen either.

const (
	// linkWindow: the most recent pairs compared.
	linkWindow = 32
	// linkTested: pairs in which both syncs waited that must agree.
	linkTested = 3
	// linkJitter: how far apart two ranks' syncs released by one
	// collective may return (their threads get a CPU at different times).
	linkJitter = int64(2 * time.Millisecond)
	// linkCheckEvery: a linked member is checked again every this many
	// of its collectives; an unlinked one after its first linkEager looks
	// only this often.
	linkCheckEvery = 16
	linkEager      = 64
)

// pidPair names two processes, the lower pid first.
type pidPair struct{ a, b uint32 }

func pairOf(a, b uint32) pidPair {
	if a > b {
		a, b = b, a
	}
	return pidPair{a, b}
}

// linkable reports whether c may be linked from its collectives: its
// creation was not seen, or its group from creation lacks ranks (the
// probes came in between two ranks' creations).
func linkable(c *commInfo) bool {
	switch {
	case c.inferred:
		return true
	case c.group != nil:
		return c.group.linked || !c.group.complete()
	}
	return false
}

// linkScore is how two communicators' sequences compare at one offset.
type linkScore struct {
	pairs, tested, agreed int
	spread                int64 // the agreeing pairs' return differences, summed
	bad                   bool  // a pair is not one collective
}

// scorePairs compares c's recent collectives with o's, c's i-th with o's
// (i+d)-th.
func scorePairs(c, o *commInfo, d int64) linkScore {
	var s linkScore
	for i := c.n - 1; c.held(i) && s.pairs < linkWindow; i-- {
		j := i + d
		if j >= o.n {
			continue // o has not issued it yet
		}
		if !o.held(j) {
			break
		}
		s.pairs++
		ic, io := i%issueRing, j%issueRing
		if c.sig[ic] != o.sig[io] {
			s.bad = true
			return s
		}
		ec, eo := c.done[ic], o.done[io]
		if ec > 0 && o.issued[io] > ec || eo > 0 && c.issued[ic] > eo {
			s.bad = true
			return s
		}
		if ec == 0 || eo == 0 {
			continue
		}
		first := min(ec, eo)
		if c.doneFrom[ic] >= first || o.doneFrom[io] >= first {
			continue // one sync began after the collective was done
		}
		s.tested++
		diff := max(ec-eo, eo-ec)
		if diff <= max(linkJitter, min(ec-c.doneFrom[ic], eo-o.doneFrom[io])/4) {
			s.agreed++
			s.spread += diff
		}
	}
	return s
}

// accepts says whether a score links: strict after a disagreement.
func (s linkScore) accepts(strict bool) bool {
	switch {
	case s.bad || s.tested < linkTested:
		return false
	case strict:
		return s.pairs >= linkWindow && 2*s.tested >= linkWindow && 4*s.agreed >= 3*s.tested
	case s.tested < 8:
		return s.agreed == s.tested
	}
	return 4*s.agreed >= 3*s.tested
}

// disagrees says whether a linked member's score refutes the link.
func (s linkScore) disagrees() bool {
	return s.bad || s.tested >= linkTested && 4*s.agreed < 3*s.tested
}

// offsetOf finds the one offset d at which c's i-th collective is o's
// (i+d)-th, if the recent sequences agree at exactly one.
func offsetOf(c, o *commInfo, strict bool) (int64, linkScore, bool) {
	// Candidates: the collectives of o that c's latest completed one can
	// be (the same collective, issued before it completed on c, and not
	// completed on o before c issued it): one per step in a loop that
	// syncs every step, a step's buckets in one that does not.
	ref := int64(-1)
	for i := c.n - 1; c.held(i) && i >= c.n-linkWindow; i-- {
		if c.done[i%issueRing] > 0 {
			ref = i
			break
		}
	}
	if ref < 0 {
		return 0, linkScore{}, false
	}
	ir := ref % issueRing
	var found []int64
	for j := max(o.n-issueRing, 0); j < o.n; j++ {
		io := j % issueRing
		if o.sig[io] != c.sig[ir] || o.issued[io] > c.done[ir] || o.done[io] > 0 && c.issued[ir] > o.done[io] {
			continue
		}
		found = append(found, j-ref)
	}
	var best int64
	var bs linkScore
	n := 0
	for _, d := range found {
		if s := scorePairs(c, o, d); s.accepts(strict) {
			best, bs = d, s
			n++
		}
	}
	return best, bs, n == 1
}

// link tries to link c, which just issued a collective, with another
// process's communicator, or checks its link again.
func (reg *Registry) link(c *commInfo) {
	if !linkable(c) {
		reg.realign(c)
		return
	}
	if c.group != nil && c.group.linked {
		if c.n%linkCheckEvery == 0 {
			reg.recheck(c)
		}
		return
	}
	if c.n < linkTested || c.n > linkEager && c.n%linkCheckEvery != 0 {
		return
	}
	type cand struct {
		o *commInfo
		d int64
		s linkScore
	}
	var cands []cand
	for k, o := range reg.comms {
		if k.pid == c.pid || o.n < linkTested || !linkable(o) || !reg.live(o.pid) {
			continue
		}
		if g := o.group; g != nil && g.linked && g.has(c.pid) {
			continue
		}
		d, s, ok := offsetOf(c, o, reg.refuted[pairOf(c.pid, o.pid)])
		if ok {
			cands = append(cands, cand{o, d, s})
		}
	}
	// The closest partner first: more pairs tested, then returns closer
	// together; the pid and the handle make the order total.
	slices.SortFunc(cands, func(a, b cand) int {
		if a.s.tested != b.s.tested {
			return cmp.Compare(b.s.tested, a.s.tested)
		}
		if x, y := a.s.spread*int64(b.s.agreed), b.s.spread*int64(a.s.agreed); x != y {
			return cmp.Compare(x, y)
		}
		if a.o.pid != b.o.pid {
			return cmp.Compare(a.o.pid, b.o.pid)
		}
		return cmp.Compare(a.o.n, b.o.n)
	})
	for _, k := range cands {
		if reg.join(c, k.o, k.d) {
			return
		}
	}
}

// has reports whether a member of g belongs to process pid.
func (g *commGroup) has(pid uint32) bool {
	for _, m := range g.members {
		if m.pid == pid {
			return true
		}
	}
	return false
}

// sizeOf is the group size c knows: from its creation, else from its
// process's environment (0: unknown).
func sizeOf(c *commInfo) int32 {
	if c.ranks > 0 {
		return c.ranks
	}
	return c.size
}

// join links c with o, whose (i+d)-th collective is c's i-th: into o's
// linked group when c agrees with every member and its rank and size fit,
// else into a new group of the two.
func (reg *Registry) join(c, o *commInfo, d int64) bool {
	g := o.group
	if g == nil || !g.linked {
		if !canPair(o, c) {
			return false
		}
		g = &commGroup{members: map[int32]*commInfo{}, linked: true}
		reg.unlink(o)
		g.add(o, 0)
		reg.unlink(c)
		g.add(c, d)
		g.lastRank()
		return true
	}
	if !g.fits(c) {
		return false
	}
	strict := false
	for _, m := range g.members {
		strict = strict || reg.refuted[pairOf(c.pid, m.pid)]
	}
	for _, m := range g.sorted() {
		if m != o && !scorePairs(c, m, d+o.off-m.off).accepts(strict) {
			return false
		}
	}
	reg.unlink(c)
	g.add(c, d+o.off)
	g.lastRank()
	return true
}

// lastRank gives the one member of a whole group whose rank is unknown the
// rank no other member has (one rank's creation was seen, the other's
// not: the probes came in between).
func (g *commGroup) lastRank() {
	if g.size == 0 || len(g.members) != int(g.size) {
		return
	}
	var unknown *commInfo
	taken := map[int32]bool{}
	for _, m := range g.members {
		switch {
		case m.rank < 0 && unknown != nil:
			return
		case m.rank < 0:
			unknown = m
		case m.rank >= g.size:
			return
		default:
			taken[m.rank] = true
		}
	}
	if unknown == nil {
		return
	}
	for r := int32(0); r < g.size; r++ {
		if !taken[r] {
			delete(g.members, unknown.slot)
			unknown.rank, unknown.slot = r, r
			g.members[r] = unknown
			g.order = nil
			return
		}
	}
}

// fits reports whether c can join g: its rank free, its size g's, g not
// full.
func (g *commGroup) fits(c *commInfo) bool {
	if c.rank >= 0 && g.members[c.rank] != nil {
		return false
	}
	sz := sizeOf(c)
	if sz > 0 && g.size > 0 && sz != g.size {
		return false
	}
	if n := max(sz, g.size); n > 0 && len(g.members) >= int(n) {
		return false
	}
	return true
}

// canPair reports whether a and b can form a group of their own.
func canPair(a, b *commInfo) bool {
	if a.rank >= 0 && a.rank == b.rank {
		return false
	}
	sa, sb := sizeOf(a), sizeOf(b)
	return sa == 0 || sb == 0 || sa == sb
}

// add makes c a member of g, its sequence shifted by off.
func (g *commGroup) add(c *commInfo, off int64) {
	c.slot = c.rank
	if c.slot < 0 {
		c.slot = -1
		for g.members[c.slot] != nil {
			c.slot--
		}
	}
	g.members[c.slot] = c
	g.order = nil
	c.group, c.off = g, off
	if sz := sizeOf(c); sz > 0 && g.size == 0 {
		g.size = sz
	}
}

// recheck drops c from its linked group when its recent collectives
// disagree with a member's: lost events shifted a sequence, or two jobs
// that stepped together for a while drifted apart.
func (reg *Registry) recheck(c *commInfo) {
	g := c.group
	for _, m := range g.sorted() {
		if m == c || !scorePairs(c, m, c.off-m.off).disagrees() {
			continue
		}
		reg.refuted[pairOf(c.pid, m.pid)] = true
		reg.unlink(c)
		if len(g.members) == 1 {
			for _, last := range g.members {
				reg.unlink(last)
			}
		}
		return
	}
}

// realign checks the sequence of c, a member of a group linked from its
// communicators' creation, against the other members' and shifts it to
// the one offset their collectives agree at when they disagree at the
// creation's: a collective a rank issued before the probe on it was in (a
// trainer that creates its communicator and at once broadcasts its
// weights, the probes attaching one by one) or a lost event. Counted from
// the creation, that rank's k-th collective would be paired with another
// rank's (k±1)-th: an earlier issue judges every wait on time, a later one
// sends it to the baseline. Checked at every collective while the
// sequence is young, then every linkCheckEvery.
func (reg *Registry) realign(c *commInfo) {
	g := c.group
	if g == nil || g.linked || g.ambiguous || c.n < linkTested || c.n > linkEager && c.n%linkCheckEvery != 0 {
		return
	}
	for _, m := range g.sorted() {
		if m == c || !scorePairs(c, m, c.off-m.off).disagrees() {
			continue
		}
		if d, _, ok := offsetOf(c, m, false); ok && d+m.off != c.off {
			c.off = d + m.off
			reg.realigned++
		}
		return
	}
}
