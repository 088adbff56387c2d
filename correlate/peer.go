package correlate

import "github.com/gaptrace/gaptrace/correlate/ranks"

// Ranks traced by other engines: a job whose ranks are traced by several
// sidecars (a sidecar per pod, per node) has them exchange what each
// engine keeps of its communicators, and mirrors the others' here
// (correlate/ranks, mirror.go). These are the engine's side of it.

// PeerRecord is one change to a communicator of a process traced by
// another engine (ranks.Record).
type PeerRecord = ranks.Record

// PeerKind says what a PeerRecord reports.
type PeerKind = ranks.Kind

// What a PeerRecord reports (ranks.Kind).
const (
	PeerComm  = ranks.KindComm
	PeerIssue = ranks.KindIssue
	PeerDone  = ranks.KindDone
	PeerGone  = ranks.KindGone
	// PeerProc: a process's state, for the other sidecars' hang reports;
	// engines ignore it.
	PeerProc = ranks.KindProc
)

// PeerStates are the process states a PeerProc record may carry.
var PeerStates = ranks.States

// SetPeerOut makes the engine report every change to its own
// communicators to out, for the other engines of the job (Peer). out is
// called from the goroutine feeding the engine and must not block.
func (e *Engine) SetPeerOut(out func(PeerRecord)) { e.ranks.SetOut(out) }

// Peer takes records from the engine of another sidecar, from, whose times
// are already in this host's clock.
func (e *Engine) Peer(from string, recs []PeerRecord) { e.ranks.Peer(from, recs) }

// PeerLeft says that the sidecar from is gone: the processes it traced are
// no longer seen, and no verdict waits for them.
func (e *Engine) PeerLeft(from string) { e.ranks.PeerLeft(from) }
