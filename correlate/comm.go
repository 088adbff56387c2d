package correlate

import (
	"time"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/ranks"
	"github.com/gaptrace/gaptrace/event"
)

// stallCand is a comm stall waiting for GPM windows to confirm it.
// gpmOnly: no baseline set the wait apart from compute (a peer that is
// late in every step from the first one), so the GPU alone decides
// whether, and how much of, the wait was spent spinning on the peer.
type stallCand struct {
	gap     Gap
	gpmOnly bool
	// peer: the ranks' timelines found the wait (correlate/ranks); the stall
	// is placed once the other ranks' syncs show when the collective
	// completed. by is how late the last rank issued it, from the wait's
	// start at the earliest.
	peer      bool
	ref       ranks.Ref
	by, start int64
	// undecided: a wait held for the ranks' verdict (judgeStall), its gap
	// the whole wait so far.
	undecided bool
	wait      *heldWait
}

// baseKey names a sync's place in the step. Whether the pending work
// held a collective is deliberately not part of it: a trainer may issue a
// collective only in some steps, and those must be compared with the
// steps without it.
type baseKey struct {
	cuda   event.CUDA
	stream uint64
	slot   int
	site   string // the sync's call site, where slots count per site
}

// maxBaseSlots bounds the baseline table: more distinct sync slots than
// this means the step shape keeps changing, and old baselines are stale.
const maxBaseSlots = 256

// checkStall decides whether the wait ev, which drained pending work that
// held the collective coll (ref: its place in its communicator's
// sequence), spun on a late peer. When every rank of the collective's
// group is traced here, their timelines decide (correlate/ranks); otherwise this
// rank's own history does: the baseline of earlier steps at the same sync
// slot or, without one, GPM. Only one of the two ever judges a wait. A
// wait on a communicator that may soon be linked to other ranks' (its
// creation was not seen, correlate/ranks), or whose peer has not shown the
// collective yet, waits for that a while (linkWait).
func (p *proc) checkStall(x env, th *attribute.Thread, ev *event.Event, coll *CollectiveEvidence, ref ranks.Ref) {
	// The baseline compares how long the queue ran after the last enqueue,
	// which a late peer lengthens, rather than the sync's own wait, which
	// also shrinks by any host delay between the last enqueue and the sync:
	// one such step would lower the baseline and make every ordinary step
	// after it look late by that delay.
	run := ev.Duration()
	if p.q.LastEnqueue() > 0 && p.q.LastEnqueue() <= ev.Start {
		run = ev.End - p.q.LastEnqueue()
	}
	slot, site := p.st.slot(ev)
	var r *waitRing
	if slot >= 0 {
		k := baseKey{cuda: ev.CUDA, stream: ev.Stream, slot: slot, site: site}
		r = p.base[k]
		if r == nil {
			if len(p.base) > maxBaseSlots {
				clear(p.base)
			}
			r = &waitRing{}
			p.base[k] = r
		}
	}
	p.judgeStall(x, th.TID, ev, coll, ref, r, run, true)
}

// linkWait bounds how long a wait waits for the ranks' verdict (measured
// from its end, like holdMax, which it leaves room for).
const linkWait = holdMax - int64(100*time.Millisecond)

// judgeStall is checkStall's verdict on the wait ev of thread tid; r is
// the baseline of its sync slot (nil: none) and run how long the queue ran
// after the last enqueue. mayWait: the ranks' verdict may be awaited.
func (p *proc) judgeStall(x env, tid uint32, ev *event.Event, coll *CollectiveEvidence, ref ranks.Ref, r *waitRing, run int64,
	mayWait bool) {
	set := x.set
	wait := ev.Duration()
	stall := func(excess, baseline int64, gpmOnly bool, late *ranks.Late) {
		g := Gap{PID: p.pid, TID: tid, Device: p.dev, Kind: GapStall, Start: ev.End - excess, End: ev.End,
			Duration: excess, Cause: CauseComm, Breakdown: map[Cause]int64{CauseComm: excess}}
		c := *coll
		if rank := ref.Rank(); c.Rank == nil && rank >= 0 {
			// Known since the collective was issued: from the
			// environment, or what its linked group left.
			c.Rank = &rank
		}
		if late != nil {
			if late.Rank >= 0 {
				rank := late.Rank
				c.LateRank = &rank
			}
			c.LatePID, c.LateByNS, c.LateSidecar = late.PID, late.By, late.From
		}
		g.Evidence = Evidence{Collective: &c, CUDACall: ev.CUDA.String(), BaselineNS: baseline,
			Threads: append([]uint32(nil), p.feeders...), Source: "host"}
		g.Ops = []HostOp{attribute.HostOpOf(ev, tid)}
		sc := stallCand{gap: g, gpmOnly: gpmOnly}
		if late != nil {
			sc.peer, sc.ref, sc.by, sc.start = true, ref, excess, ev.Start
		}
		p.stalls = append(p.stalls, sc)
	}
	if coll != nil {
		if late, ok := x.w.ranks.Lateness(ref, ev.End); ok {
			// The last rank issued the collective late.By after this one:
			// until then this rank could only wait, whatever its own
			// history says. A peer that was on time makes the whole wait
			// compute. The baseline learns the compute only, for when a
			// rank drops out of sight.
			excess := min(max(late.By, 0), wait)
			if excess >= set.minGap {
				stall(excess, wait-excess, false, &late)
			}
			if r != nil {
				r.push(run - excess)
			}
			return
		}
		if mayWait && wait >= set.minGap && x.w.ranks.AwaitsLink(ref) {
			// Held whole (its start keeps the step open) until the ranks
			// can judge it or linkWait passed.
			g := Gap{PID: p.pid, TID: tid, Device: p.dev, Kind: GapStall, Start: ev.Start, End: ev.End}
			p.stalls = append(p.stalls, stallCand{gap: g, undecided: true, ref: ref, wait: &heldWait{
				ev: *ev, coll: coll, ring: r, run: run}})
			return
		}
	}
	if r == nil {
		// Without a period, waits of different syncs of a step cannot be
		// compared: no baseline. Only GPM can still show a spinning peer.
		if coll != nil && wait >= set.minGap {
			stall(wait, 0, true, nil)
		}
		return
	}
	switch {
	case coll == nil || wait < set.minGap:
	case r.n >= minHistory && run-r.low() >= set.minGap:
		excess := min(run-r.low(), wait)
		stall(excess, wait-excess, false, nil)
	case r.n < minHistory || r.low() >= set.minGap:
		// Every wait so far was long: either the step's compute is long or
		// the peer has been late since the first step. GPM tells which.
		stall(wait, 0, true, nil)
	}
	r.push(run)
}

// heldWait is a wait whose verdict awaits the ranks (judgeStall).
type heldWait struct {
	ev   event.Event
	coll *CollectiveEvidence
	ring *waitRing
	run  int64
}

// resolveHeldWaits judges the waits that awaited the ranks, once they can
// (their communicator was linked, the peer's collective arrived), no link
// is to be expected any more, or linkWait passed.
func (p *proc) resolveHeldWaits(x env, force bool) {
	var due []stallCand
	k := 0
	for _, s := range p.stalls {
		if s.undecided && (force || x.clk.now >= s.gap.End+linkWait || !x.w.ranks.AwaitsLink(s.ref)) {
			due = append(due, s)
			continue
		}
		p.stalls[k] = s
		k++
	}
	clear(p.stalls[k:])
	p.stalls = p.stalls[:k]
	for _, s := range due {
		h := s.wait
		p.judgeStall(x, s.gap.TID, &h.ev, h.coll, s.ref, h.ring, h.run, false)
	}
}

// resolveStalls confirms or rejects the comm stalls whose GPM windows
// arrived (or that waited long enough).
func (p *proc) resolveStalls(x env, force bool) {
	if len(p.stalls) == 0 {
		return
	}
	p.resolveHeldWaits(x, force)
	d := x.d
	k := 0
	for _, s := range p.stalls {
		if s.undecided {
			p.stalls[k] = s
			k++
			continue
		}
		if s.peer {
			c, all := x.w.ranks.Completion(s.ref)
			if !all && !force && x.clk.now < s.gap.End+holdMax {
				p.stalls[k] = s
				k++
				continue
			}
			// This rank's sync returned when its thread got a CPU, which
			// on a loaded host is well after the collective completed: the
			// wait on the peer ends where the earliest rank saw it done.
			if c > 0 && c < s.gap.End {
				s.gap.End = c
			}
			s.gap.Start = max(s.start, s.gap.End-s.by)
			s.gap.Duration = s.gap.End - s.gap.Start
			s.gap.Breakdown = map[Cause]int64{CauseComm: s.gap.Duration}
			s.gap.Evidence.BaselineNS = s.gap.Ops[0].End - s.gap.Ops[0].Start - s.gap.Duration
			if s.gap.Duration < x.set.minGap {
				p.out.rejected++
				continue
			}
		}
		noGPM := d.gpmEnd == 0 && !d.gpmComing
		if force || noGPM || d.gpmEnd >= s.gap.End || x.clk.now >= s.gap.End+holdMax {
			sm := d.smActivity(s.gap.Start, s.gap.End)
			// With a baseline, the wait's excess is already set apart from
			// the compute: reject it only when the GPU must have computed
			// during it, whatever the window's compute around it.
			reject := sm > smStallMax
			if !s.gpmOnly {
				reject = d.smActivityMin(s.gap.Start, s.gap.End) > smStallMax
			}
			if reject || (s.gpmOnly && sm < 0) {
				p.out.rejected++
				continue
			}
			if s.gpmOnly {
				// Utilization counts a spinning collective as busy, GPM SM
				// activity barely does; an idle GPU lowers both. So over
				// the wait's windows, busy − compute is the spin, and its
				// share of the busy time is the share of the wait spent on
				// the peer. Compute kernels keep SM activity at 0.7-0.95 on
				// an H200: 0.8 stands in until the device shows a higher peak.
				busy := d.busyFraction(s.gap.Start, s.gap.End)
				ref := max(d.smPeak, 2*sm, smComputeRef)
				spin := busy - sm/ref
				if busy <= 0 || spin < spinMin {
					p.out.rejected++
					continue
				}
				excess := int64(float64(s.gap.Duration) * min(1, spin/busy))
				if excess < x.set.minGap {
					p.out.rejected++
					continue
				}
				s.gap.Start = s.gap.End - excess
				s.gap.Duration = excess
				s.gap.Breakdown = map[Cause]int64{CauseComm: excess}
			}
			if sm >= 0 {
				s.gap.Evidence.SMActivity = &sm
				s.gap.Evidence.Source = "host+gpu"
				if s.gpmOnly {
					s.gap.Evidence.Source = "gpu"
				}
			}
			p.emit(x, s.gap)
			continue
		}
		p.stalls[k] = s
		k++
	}
	p.stalls = p.stalls[:k]
}
