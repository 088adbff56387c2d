package ranks

import (
	"errors"
	"fmt"
)

// Kind says what a Record reports.
type Kind uint8

const (
	// KindComm: a communicator of PID exists: Ranks and Rank from its
	// creation or, Inferred, first seen by a collective (Rank and Size
	// from its process's environment, -1 and 0 when unknown).
	KindComm Kind = iota + 1
	// KindIssue: the Seq-th collective on Comm was issued at At; First is
	// when the GPU work it ends began (0: unknown); Sig what it is.
	KindIssue
	// KindDone: a sync that began at From and returned at At saw the
	// Seq-th collective on Comm complete.
	KindDone
	// KindGone: process PID exited; its communicators are gone.
	KindGone
	// KindProc: process PID's state since At (State, and WChan, File,
	// Exit where they apply), for the hang reports of the other sidecars;
	// the registry ignores it (proc.go).
	KindProc
)

// Record is one change to a communicator of a process traced by
// another engine.
type Record struct {
	Kind     Kind   `json:"k"`
	PID      uint32 `json:"p"`
	Comm     uint64 `json:"c,omitempty"`
	Ranks    int32  `json:"n,omitempty"`
	Rank     int32  `json:"r"`
	Size     int32  `json:"s,omitempty"`
	Inferred bool   `json:"i,omitempty"`
	Seq      int64  `json:"q,omitempty"`
	At       int64  `json:"a,omitempty"`
	First    int64  `json:"f,omitempty"`
	From     int64  `json:"b,omitempty"`
	Sig      uint64 `json:"g,omitempty"`
	// KindProc's: the process state and what it waits on (proc.go).
	State string `json:"st,omitempty"`
	WChan string `json:"w,omitempty"`
	File  string `json:"fl,omitempty"`
	Exit  string `json:"x,omitempty"`
}

// Shift moves the record's times by d nanoseconds (from one host's clock
// to another's); unknown times (0) stay unknown.
func (r *Record) Shift(d int64) {
	for _, t := range []*int64{&r.At, &r.First, &r.From} {
		if *t != 0 {
			*t += d
		}
	}
}

// Bounds of a Record's fields: what any sidecar sends lies within them
// by far, and arithmetic on them cannot overflow. A recording's calls are
// held to the same bounds (record.Check).
const (
	maxSeq = int64(1) << 48 // collectives on one communicator
	// MaxRanks bounds the ranks of one communicator or job.
	MaxRanks = int32(1) << 20
	// MaxTime bounds a time: Unix ns (year 2116).
	MaxTime = int64(1) << 62
)

// Check reports whether every field of r lies within what a sidecar sends.
// Records from the network or a recording are checked before use: the
// engine ignores one that fails, the transport drops its whole batch.
func (r *Record) Check() error {
	inTime := func(name string, t int64) error {
		if t < 0 || t >= MaxTime {
			return fmt.Errorf("peer record: %s %d out of range", name, t)
		}
		return nil
	}
	inSeq := func() error {
		if r.Seq < 0 || r.Seq >= maxSeq {
			return fmt.Errorf("peer record: sequence number %d out of range [0, %d)", r.Seq, maxSeq)
		}
		return nil
	}
	if r.Kind != KindProc && r.State+r.WChan+r.File+r.Exit != "" {
		return fmt.Errorf("peer record: kind %d carries a process state", r.Kind)
	}
	switch r.Kind {
	case KindComm:
		switch {
		case r.Ranks < 0 || r.Ranks > MaxRanks, r.Size < 0 || r.Size > MaxRanks:
			return fmt.Errorf("peer record: %d ranks (size %d) out of range [0, %d]", r.Ranks, r.Size, MaxRanks)
		case r.Rank < -1 || r.Rank >= MaxRanks || (r.Ranks > 0 && r.Rank >= r.Ranks):
			return fmt.Errorf("peer record: rank %d of %d out of range", r.Rank, r.Ranks)
		case r.Inferred && r.Ranks != 0:
			return fmt.Errorf("peer record: inferred communicator with %d ranks", r.Ranks)
		}
		return nil
	case KindIssue:
		return errors.Join(inSeq(), inTime("issue time", r.At), inTime("work start", r.First))
	case KindDone:
		return errors.Join(inSeq(), inTime("completion time", r.At), inTime("sync start", r.From))
	case KindGone:
		return nil
	case KindProc:
		return errors.Join(inTime("state time", r.At), r.checkProc())
	}
	return fmt.Errorf("peer record: unknown kind %d", r.Kind)
}
