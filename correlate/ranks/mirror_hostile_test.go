package ranks

import (
	"math"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// Sequence numbers at the ends of int64 after a communicator record (a
// forged or damaged batch) are ignored, not a panic: the mirror's
// sequence would wrap to a negative ring index.
func TestPeersHostileSequence(t *testing.T) {
	e := testRegistry(nil)
	e.Peer("evil", []Record{
		{Kind: KindComm, PID: 7, Comm: 0xabc, Ranks: 2, Rank: 1},
		{Kind: KindIssue, PID: 7, Comm: 0xabc, Seq: math.MaxInt64, At: t0},
		{Kind: KindIssue, PID: 7, Comm: 0xabc, Seq: math.MinInt64 + 1, At: t0 + ms},
		{Kind: KindDone, PID: 7, Comm: 0xabc, Seq: math.MinInt64, At: t0, From: t0},
	})
	m, _ := e.mirrorPID("evil", 7)
	if c := e.comms[commKey{pid: m, comm: 0xabc}]; c == nil || c.n != 0 {
		t.Fatalf("mirror after out-of-range sequence numbers: %+v, want the communicator with nothing issued", c)
	}
}

// Check refuses every field out of range and accepts what a sidecar sends.
func TestPeerRecordCheck(t *testing.T) {
	good := []Record{
		{Kind: KindComm, PID: 7, Comm: 1, Ranks: 8, Rank: 7},
		{Kind: KindComm, PID: 7, Comm: 1, Rank: -1, Inferred: true},
		{Kind: KindComm, PID: 7, Comm: 1, Rank: 3, Size: 4, Inferred: true},
		{Kind: KindIssue, PID: 7, Comm: 1, Seq: 12, At: t0, First: t0 - ms, Sig: math.MaxUint64},
		{Kind: KindDone, PID: 7, Comm: 1, Seq: 0, At: t0, From: t0 - ms},
		{Kind: KindGone, PID: 7},
	}
	for _, r := range good {
		if err := r.Check(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := []Record{
		{Kind: 0, PID: 7},
		{Kind: KindGone + 1, PID: 7},
		{Kind: KindComm, Ranks: -1},
		{Kind: KindComm, Ranks: math.MaxInt32},
		{Kind: KindComm, Ranks: 2, Rank: 2},
		{Kind: KindComm, Ranks: 2, Rank: -2},
		{Kind: KindComm, Rank: 1, Size: -3, Inferred: true},
		{Kind: KindComm, Ranks: 2, Rank: 1, Inferred: true},
		{Kind: KindIssue, Seq: -1, At: t0},
		{Kind: KindIssue, Seq: math.MaxInt64, At: t0},
		{Kind: KindIssue, Seq: 1, At: -5},
		{Kind: KindIssue, Seq: 1, At: t0, First: math.MaxInt64},
		{Kind: KindDone, Seq: math.MinInt64 + 1, At: t0},
		{Kind: KindDone, Seq: 1, At: t0, From: math.MinInt64},
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
	e := testRegistry(nil)
	e.Add(&event.Event{Kind: event.KindCommInit, PID: 100, TID: 100, Start: t0, End: t0, Comm: commHandle, Count: 2, PeerRank: 0})
	recs := make([]Record, 0, 2*maxComms)
	for i := range 2 * maxComms {
		recs = append(recs, Record{Kind: KindComm, PID: uint32(i % 64), Comm: uint64(i), Ranks: 2, Rank: 1})
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
	e.ForgetGoneMirrors(t0+10*after, after)
	e.ForgetGoneMirrors(t0+20*after, after)
	if e.mirrorComms != 0 || e.comms[commKey{pid: 100, comm: commHandle}] == nil {
		t.Errorf("after the sidecar left: %d mirrored communicators, own one %v", e.mirrorComms,
			e.comms[commKey{pid: 100, comm: commHandle}] != nil)
	}
}
