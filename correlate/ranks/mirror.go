package ranks

// Ranks traced by other engines. One engine judges a collective wait by
// the other ranks' timelines only where it sees them (comm.go); a job
// whose ranks are traced by several sidecars (a sidecar per pod, per node)
// has them exchange what the engine keeps of each communicator instead:
// its creation, each collective's issue (when, and when the issuing
// process's GPU work that the collective ends began) and the earliest sync
// return that saw it complete. A remote communicator is mirrored here as if
// its process were traced by this engine, under a pid of its own, so that
// linking, the lateness verdict and the completion rule treat it like a
// local one. Times are Unix nanoseconds of the receiving host; the
// transport shifts them between hosts (cmd/sidecar/internal/peers).

import "github.com/gaptrace/gaptrace/event"

// mirror is a process traced by another engine, known from its records.
type mirror struct {
	from string // the sidecar that traces it
	pid  uint32 // its pid there
	// gone: the process exited or its sidecar left; its communicators
	// stay, like an exited process's own, until goneAt (the watermark
	// when that was first seen here) is ForgetGoneMirrors' after behind, so
	// that the other ranks' last waits are still judged by its timeline;
	// forgotten: they were dropped.
	gone, forgotten bool
	goneAt          int64
}

type mirrorKey struct {
	from string
	pid  uint32
}

// mirrorBase: mirrored processes get pids from here on, above any pid a
// kernel hands out (at most 2^22).
const mirrorBase = uint32(1) << 31

// maxMirrors bounds the mirrored processes (a job's ranks, restarts).
const maxMirrors = 1 << 16

// maxMirrorComms bounds the communicators of mirrored processes: half the
// table, so that records from other sidecars never fill it and never make
// it reset (which drops this engine's own communicators).
const maxMirrorComms = maxComms / 2

// ForgetGoneMirrors drops the communicators of mirrored processes gone
// for after of watermark wm: every wait on them was decided (the engine
// passes the longest a wait's verdict can be held).
func (reg *Registry) ForgetGoneMirrors(wm, after int64) {
	for m, mi := range reg.mirrors {
		if !mi.gone || mi.forgotten {
			continue
		}
		if mi.goneAt == 0 {
			mi.goneAt = max(wm, 1)
			continue
		}
		if wm-mi.goneAt > after {
			mi.forgotten = true
			reg.Forget(m)
		}
	}
}

// Peer applies records from the engine of another sidecar, from, whose
// times are already in this host's clock.
func (reg *Registry) Peer(from string, recs []Record) {
	for i := range recs {
		reg.peer(from, &recs[i])
	}
}

// PeerLeft says that the sidecar from is gone: the processes it traced are
// no longer seen, and no verdict waits for them.
func (reg *Registry) PeerLeft(from string) {
	for k, pid := range reg.mirrorOf {
		if k.from == from {
			reg.mirrorGone(pid)
		}
	}
}

// mirrorPID is the pid standing for process pid of sidecar from.
func (reg *Registry) mirrorPID(from string, pid uint32) (uint32, bool) {
	k := mirrorKey{from: from, pid: pid}
	if m, ok := reg.mirrorOf[k]; ok {
		return m, true
	}
	if reg.mirrorOf == nil {
		reg.mirrorOf, reg.mirrors = map[mirrorKey]uint32{}, map[uint32]*mirror{}
	}
	if len(reg.mirrors) >= maxMirrors {
		return 0, false
	}
	m := mirrorBase + reg.nextMirror
	reg.nextMirror++
	reg.mirrorOf[k] = m
	reg.mirrors[m] = &mirror{from: from, pid: pid}
	return m, true
}

// mirrorGone says that a mirrored process is gone: no wait waits for it
// any longer; forgetGoneMirrors drops its communicators later.
func (reg *Registry) mirrorGone(m uint32) {
	if mi := reg.mirrors[m]; mi != nil && !mi.gone {
		mi.gone, mi.goneAt = true, 0
	}
}

// realPID is the pid a process has where it is traced.
func (reg *Registry) realPID(pid uint32) uint32 {
	if m := reg.mirrors[pid]; m != nil {
		return m.pid
	}
	return pid
}

// Mirrored reports whether pid stands for a process of another sidecar.
func (reg *Registry) Mirrored(pid uint32) bool {
	return reg.mirrors[pid] != nil
}

// peer applies one record of sidecar from.
func (reg *Registry) peer(from string, r *Record) {
	if r.Kind == KindProc || r.Check() != nil {
		return
	}
	pid, ok := reg.mirrorPID(from, r.PID)
	if !ok {
		return
	}
	if reg.mirrors[pid].gone && r.Kind != KindComm {
		return
	}
	k := commKey{pid: pid, comm: r.Comm}
	c := reg.comms[k]
	switch r.Kind {
	case KindComm:
		if mi := reg.mirrors[pid]; mi.gone {
			// Back (a restart reusing its pid): what it had is stale.
			if !mi.forgotten {
				reg.Forget(pid)
			}
			mi.gone, mi.forgotten, mi.goneAt = false, false, 0
			c = nil
		}
		if c == nil && (reg.mirrorComms >= maxMirrorComms || len(reg.comms) >= maxComms) {
			return // never at the cost of this engine's own
		}
		if r.Inferred {
			if c == nil {
				if c = reg.inferComm(&event.Event{PID: pid, Comm: r.Comm}); c == nil {
					return
				}
				reg.mirrorComms++
			}
			if c.inferred && c.group == nil && r.Rank >= 0 {
				c.rank, c.slot, c.ownRank, c.size = r.Rank, r.Rank, r.Rank, r.Size
			}
			return
		}
		if c != nil && !c.inferred && c.ranks == r.Ranks && c.rank == r.Rank {
			return // sent again to a sidecar that joined late
		}
		reg.Add(&event.Event{Kind: event.KindCommInit, PID: pid, Comm: r.Comm, Count: uint64(max(r.Ranks, 0)),
			PeerRank: r.Rank})
		if c == nil {
			reg.mirrorComms++
		}
	case KindIssue:
		if c == nil || r.Seq < c.n {
			return // unknown, or already held
		}
		if r.Seq >= c.n+issueRing {
			c.issued, c.first, c.done, c.doneFrom, c.sig = [issueRing]int64{}, [issueRing]int64{},
				[issueRing]int64{}, [issueRing]int64{}, [issueRing]uint64{}
			c.n = r.Seq
		}
		for c.n < r.Seq {
			c.issue(0, 0, 0) // lost on the way: unknown
		}
		c.issue(r.At, r.First, r.Sig)
		reg.link(c)
	case KindDone:
		if c != nil {
			c.complete(r.Seq, r.At, r.From)
		}
	case KindGone:
		reg.mirrorGone(pid)
	}
}

// sidecarOf names the sidecar that traces a mirrored process ("" for this
// engine's own).
func (reg *Registry) sidecarOf(pid uint32) string {
	if m := reg.mirrors[pid]; m != nil {
		return m.from
	}
	return ""
}

// hasComms reports whether process pid has a communicator.
func (reg *Registry) hasComms(pid uint32) bool {
	for k := range reg.comms {
		if k.pid == pid {
			return true
		}
	}
	return false
}
