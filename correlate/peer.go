package correlate

// Ranks traced by other engines. One engine judges a collective wait by
// the other ranks' timelines only where it sees them (ranks.go); a job
// whose ranks are traced by several sidecars (a sidecar per pod, per node)
// has them exchange what the engine keeps of each communicator instead:
// its creation, each collective's issue (when, and when the issuing
// process's GPU work that the collective ends began) and the earliest sync
// return that saw it complete. A remote communicator is mirrored here as if
// its process were traced by this engine, under a pid of its own, so that
// linking, the lateness verdict and the completion rule treat it like a
// local one. Times are Unix nanoseconds of the receiving host; the
// transport shifts them between hosts (cmd/sidecar/internal/peers).

import (
	"errors"
	"fmt"

	"github.com/gaptrace/gaptrace/event"
)

// PeerKind says what a PeerRecord reports.
type PeerKind uint8

const (
	// PeerComm: a communicator of PID exists: Ranks and Rank from its
	// creation or, Inferred, first seen by a collective (Rank and Size
	// from its process's environment, -1 and 0 when unknown).
	PeerComm PeerKind = iota + 1
	// PeerIssue: the Seq-th collective on Comm was issued at At; First is
	// when the GPU work it ends began (0: unknown); Sig what it is.
	PeerIssue
	// PeerDone: a sync that began at From and returned at At saw the
	// Seq-th collective on Comm complete.
	PeerDone
	// PeerGone: process PID exited; its communicators are gone.
	PeerGone
	// PeerProc: process PID's state since At (State, and WChan, File,
	// Exit where they apply), for the hang reports of the other sidecars;
	// engines ignore it (peerproc.go).
	PeerProc
)

// PeerRecord is one change to a communicator of a process traced by
// another engine.
type PeerRecord struct {
	Kind     PeerKind `json:"k"`
	PID      uint32   `json:"p"`
	Comm     uint64   `json:"c,omitempty"`
	Ranks    int32    `json:"n,omitempty"`
	Rank     int32    `json:"r"`
	Size     int32    `json:"s,omitempty"`
	Inferred bool     `json:"i,omitempty"`
	Seq      int64    `json:"q,omitempty"`
	At       int64    `json:"a,omitempty"`
	First    int64    `json:"f,omitempty"`
	From     int64    `json:"b,omitempty"`
	Sig      uint64   `json:"g,omitempty"`
	// PeerProc's: the process state and what it waits on (peerproc.go).
	State string `json:"st,omitempty"`
	WChan string `json:"w,omitempty"`
	File  string `json:"fl,omitempty"`
	Exit  string `json:"x,omitempty"`
}

// Shift moves the record's times by d nanoseconds (from one host's clock
// to another's); unknown times (0) stay unknown.
func (r *PeerRecord) Shift(d int64) {
	for _, t := range []*int64{&r.At, &r.First, &r.From} {
		if *t != 0 {
			*t += d
		}
	}
}

// mirror is a process traced by another engine, known from its records.
type mirror struct {
	from string // the sidecar that traces it
	pid  uint32 // its pid there
	// gone: the process exited or its sidecar left; its communicators
	// stay, like an exited process's own, until goneAt (the watermark
	// when that was first seen here) is windowWait+holdMax behind, so
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

// Bounds of a PeerRecord's fields: what any sidecar sends lies within them
// by far, and arithmetic on them cannot overflow.
const (
	maxPeerSeq   = int64(1) << 48 // collectives on one communicator
	maxPeerRanks = int32(1) << 20 // ranks of one communicator or job
	maxPeerTime  = int64(1) << 62 // Unix ns (year 2116)
)

// Check reports whether every field of r lies within what a sidecar sends.
// Records from the network or a recording are checked before use: the
// engine ignores one that fails, the transport drops its whole batch.
func (r *PeerRecord) Check() error {
	inTime := func(name string, t int64) error {
		if t < 0 || t >= maxPeerTime {
			return fmt.Errorf("peer record: %s %d out of range", name, t)
		}
		return nil
	}
	inSeq := func() error {
		if r.Seq < 0 || r.Seq >= maxPeerSeq {
			return fmt.Errorf("peer record: sequence number %d out of range [0, %d)", r.Seq, maxPeerSeq)
		}
		return nil
	}
	if r.Kind != PeerProc && r.State+r.WChan+r.File+r.Exit != "" {
		return fmt.Errorf("peer record: kind %d carries a process state", r.Kind)
	}
	switch r.Kind {
	case PeerComm:
		switch {
		case r.Ranks < 0 || r.Ranks > maxPeerRanks, r.Size < 0 || r.Size > maxPeerRanks:
			return fmt.Errorf("peer record: %d ranks (size %d) out of range [0, %d]", r.Ranks, r.Size, maxPeerRanks)
		case r.Rank < -1 || r.Rank >= maxPeerRanks || (r.Ranks > 0 && r.Rank >= r.Ranks):
			return fmt.Errorf("peer record: rank %d of %d out of range", r.Rank, r.Ranks)
		case r.Inferred && r.Ranks != 0:
			return fmt.Errorf("peer record: inferred communicator with %d ranks", r.Ranks)
		}
		return nil
	case PeerIssue:
		return errors.Join(inSeq(), inTime("issue time", r.At), inTime("work start", r.First))
	case PeerDone:
		return errors.Join(inSeq(), inTime("completion time", r.At), inTime("sync start", r.From))
	case PeerGone:
		return nil
	case PeerProc:
		return errors.Join(inTime("state time", r.At), r.checkProc())
	}
	return fmt.Errorf("peer record: unknown kind %d", r.Kind)
}

// SetPeerOut makes the engine report every change to its own
// communicators to out, for the other engines of the job (Peer). out is
// called from the goroutine feeding the engine and must not block.
func (e *Engine) SetPeerOut(out func(PeerRecord)) { e.peerOut = out }

// Peer takes records from the engine of another sidecar, from, whose times
// are already in this host's clock.
func (e *Engine) Peer(from string, recs []PeerRecord) {
	for i := range recs {
		e.peer(from, &recs[i])
	}
}

// PeerLeft says that the sidecar from is gone: the processes it traced are
// no longer seen, and no verdict waits for them.
func (e *Engine) PeerLeft(from string) {
	for k, pid := range e.mirrorOf {
		if k.from == from {
			e.mirrorGone(pid)
		}
	}
}

// forgetGoneMirrors drops the communicators of mirrored processes gone for
// windowWait+holdMax of watermark: every wait on them was decided.
func (w *world) forgetGoneMirrors(wm int64) {
	for m, mi := range w.mirrors {
		if !mi.gone || mi.forgotten {
			continue
		}
		if mi.goneAt == 0 {
			mi.goneAt = max(wm, 1)
			continue
		}
		if wm-mi.goneAt > windowWait+holdMax {
			mi.forgotten = true
			w.forgetComms(m)
		}
	}
}

// mirrorPID is the pid standing for process pid of sidecar from.
func (w *world) mirrorPID(from string, pid uint32) (uint32, bool) {
	k := mirrorKey{from: from, pid: pid}
	if m, ok := w.mirrorOf[k]; ok {
		return m, true
	}
	if w.mirrorOf == nil {
		w.mirrorOf, w.mirrors = map[mirrorKey]uint32{}, map[uint32]*mirror{}
	}
	if len(w.mirrors) >= maxMirrors {
		return 0, false
	}
	m := mirrorBase + w.nextMirror
	w.nextMirror++
	w.mirrorOf[k] = m
	w.mirrors[m] = &mirror{from: from, pid: pid}
	return m, true
}

// mirrorGone says that a mirrored process is gone: no wait waits for it
// any longer; forgetGoneMirrors drops its communicators later.
func (w *world) mirrorGone(m uint32) {
	if mi := w.mirrors[m]; mi != nil && !mi.gone {
		mi.gone, mi.goneAt = true, 0
	}
}

// realPID is the pid a process has where it is traced.
func (w *world) realPID(pid uint32) uint32 {
	if m := w.mirrors[pid]; m != nil {
		return m.pid
	}
	return pid
}

// mirrored reports whether pid stands for a process of another sidecar.
func (w *world) mirrored(pid uint32) bool {
	return w.mirrors[pid] != nil
}

// peer applies one record of sidecar from.
func (w *world) peer(from string, r *PeerRecord) {
	if r.Kind == PeerProc || r.Check() != nil {
		return
	}
	pid, ok := w.mirrorPID(from, r.PID)
	if !ok {
		return
	}
	if w.mirrors[pid].gone && r.Kind != PeerComm {
		return
	}
	k := commKey{pid: pid, comm: r.Comm}
	c := w.comms[k]
	switch r.Kind {
	case PeerComm:
		if mi := w.mirrors[pid]; mi.gone {
			// Back (a restart reusing its pid): what it had is stale.
			if !mi.forgotten {
				w.forgetComms(pid)
			}
			mi.gone, mi.forgotten, mi.goneAt = false, false, 0
			c = nil
		}
		if c == nil && (w.mirrorComms >= maxMirrorComms || len(w.comms) >= maxComms) {
			return // never at the cost of this engine's own
		}
		if r.Inferred {
			if c == nil {
				if c = w.inferComm(&event.Event{PID: pid, Comm: r.Comm}); c == nil {
					return
				}
				w.mirrorComms++
			}
			if c.inferred && c.group == nil && r.Rank >= 0 {
				c.rank, c.slot, c.ownRank, c.size = r.Rank, r.Rank, r.Rank, r.Size
			}
			return
		}
		if c != nil && !c.inferred && c.ranks == r.Ranks && c.rank == r.Rank {
			return // sent again to a sidecar that joined late
		}
		w.addComm(&event.Event{Kind: event.KindCommInit, PID: pid, Comm: r.Comm, Count: uint64(max(r.Ranks, 0)),
			PeerRank: r.Rank})
		if c == nil {
			w.mirrorComms++
		}
	case PeerIssue:
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
		w.link(c)
	case PeerDone:
		if c != nil {
			c.complete(r.Seq, r.At, r.From)
		}
	case PeerGone:
		w.mirrorGone(pid)
	}
}

// sidecarOf names the sidecar that traces a mirrored process ("" for this
// engine's own).
func (w *world) sidecarOf(pid uint32) string {
	if m := w.mirrors[pid]; m != nil {
		return m.from
	}
	return ""
}

// hasComms reports whether process pid has a communicator.
func (w *world) hasComms(pid uint32) bool {
	for k := range w.comms {
		if k.pid == pid {
			return true
		}
	}
	return false
}
