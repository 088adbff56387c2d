package correlate

import (
	"math"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// Sequence numbers at the ends of int64 after a communicator record (a
// forged or damaged batch) are ignored, not a panic: the mirror's
// sequence would wrap to a negative ring index.
func TestPeersHostileSequence(t *testing.T) {
	e := newEngine(&collect{}, nil)
	e.Peer("evil", []PeerRecord{
		{Kind: PeerComm, PID: 7, Comm: 0xabc, Ranks: 2, Rank: 1},
		{Kind: PeerIssue, PID: 7, Comm: 0xabc, Seq: math.MaxInt64, At: t0},
		{Kind: PeerIssue, PID: 7, Comm: 0xabc, Seq: math.MinInt64 + 1, At: t0 + ms},
		{Kind: PeerDone, PID: 7, Comm: 0xabc, Seq: math.MinInt64, At: t0, From: t0},
	})
	m, _ := e.mirrorPID("evil", 7)
	if c := e.comms[commKey{pid: m, comm: 0xabc}]; c == nil || c.n != 0 {
		t.Fatalf("mirror after out-of-range sequence numbers: %+v, want the communicator with nothing issued", c)
	}
	e.Close(t0 + 2*ms)
}

// Check refuses every field out of range and accepts what a sidecar sends.
func TestPeerRecordCheck(t *testing.T) {
	good := []PeerRecord{
		{Kind: PeerComm, PID: 7, Comm: 1, Ranks: 8, Rank: 7},
		{Kind: PeerComm, PID: 7, Comm: 1, Rank: -1, Inferred: true},
		{Kind: PeerComm, PID: 7, Comm: 1, Rank: 3, Size: 4, Inferred: true},
		{Kind: PeerIssue, PID: 7, Comm: 1, Seq: 12, At: t0, First: t0 - ms, Sig: math.MaxUint64},
		{Kind: PeerDone, PID: 7, Comm: 1, Seq: 0, At: t0, From: t0 - ms},
		{Kind: PeerGone, PID: 7},
	}
	for _, r := range good {
		if err := r.Check(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := []PeerRecord{
		{Kind: 0, PID: 7},
		{Kind: PeerGone + 1, PID: 7},
		{Kind: PeerComm, Ranks: -1},
		{Kind: PeerComm, Ranks: math.MaxInt32},
		{Kind: PeerComm, Ranks: 2, Rank: 2},
		{Kind: PeerComm, Ranks: 2, Rank: -2},
		{Kind: PeerComm, Rank: 1, Size: -3, Inferred: true},
		{Kind: PeerComm, Ranks: 2, Rank: 1, Inferred: true},
		{Kind: PeerIssue, Seq: -1, At: t0},
		{Kind: PeerIssue, Seq: math.MaxInt64, At: t0},
		{Kind: PeerIssue, Seq: 1, At: -5},
		{Kind: PeerIssue, Seq: 1, At: t0, First: math.MaxInt64},
		{Kind: PeerDone, Seq: math.MinInt64 + 1, At: t0},
		{Kind: PeerDone, Seq: 1, At: t0, From: math.MinInt64},
	}
	for _, r := range bad {
		if err := r.Check(); err == nil {
			t.Errorf("%+v: accepted", r)
		}
	}
}

// A flood of communicators from another sidecar never evicts this
// engine's own: past half the table, further remote ones are ignored, and
// the table never resets for them.
func TestPeersFloodKeepsLocalComms(t *testing.T) {
	e := newEngine(&collect{}, nil)
	e.Event(event.Event{Kind: event.KindCommInit, PID: 100, TID: 100, Start: t0, End: t0, Comm: commHandle, Count: 2, PeerRank: 0})
	recs := make([]PeerRecord, 0, 2*maxComms)
	for i := range 2 * maxComms {
		recs = append(recs, PeerRecord{Kind: PeerComm, PID: uint32(i % 64), Comm: uint64(i), Ranks: 2, Rank: 1})
	}
	for i := 0; i < len(recs); i += 512 {
		e.Peer("evil", recs[i:i+512])
	}
	if e.comms[commKey{pid: 100, comm: commHandle}] == nil {
		t.Fatalf("the engine's own communicator was dropped by %d remote ones", len(recs))
	}
	if e.mirrorComms != maxMirrorComms || len(e.comms) != maxMirrorComms+1 {
		t.Errorf("%d mirrored communicators (%d in all), want %d (+1)", e.mirrorComms, len(e.comms), maxMirrorComms)
	}
	e.PeerLeft("evil")
	e.Advance(t0 + 10*windowWait + 10*holdMax)
	e.Advance(t0 + 20*windowWait + 20*holdMax)
	if e.mirrorComms != 0 || e.comms[commKey{pid: 100, comm: commHandle}] == nil {
		t.Errorf("after the sidecar left: %d mirrored communicators, own one %v", e.mirrorComms,
			e.comms[commKey{pid: 100, comm: commHandle}] != nil)
	}
}
