package ranks

import (
	"testing"
	"time"
)

// Records sent again (a sidecar joining late gets every communicator
// again) and lost on the way (a sequence number skipped) keep the mirror
// aligned with its rank's sequence.
func TestPeersMirrorSequence(t *testing.T) {
	e := testRegistry(nil)
	comm := Record{Kind: KindComm, PID: 7, Comm: 0xabc, Ranks: 2, Rank: 1}
	e.Peer("b", []Record{comm})
	e.Peer("b", []Record{comm}) // again
	m, _ := e.mirrorPID("b", 7)
	c := e.comms[commKey{pid: m, comm: 0xabc}]
	if c == nil || c.group == nil || c.group.members[1] != c || len(e.groups) != 1 {
		t.Fatalf("mirror of rank 1 not in one group: %+v, %d groups", c, len(e.groups))
	}
	issue := func(seq int64) Record {
		return Record{Kind: KindIssue, PID: 7, Comm: 0xabc, Seq: seq, At: t0 + seq*ms, Sig: 1}
	}
	e.Peer("b", []Record{issue(0), issue(1), issue(3), issue(3), issue(2)})
	if c.n != 4 {
		t.Fatalf("mirror holds %d collectives, want 4", c.n)
	}
	for seq, want := range map[int64]bool{0: true, 1: true, 2: false, 3: true} {
		at, _, ok := c.issuedAt(seq)
		if ok != want || ok && at != t0+seq*ms {
			t.Errorf("collective %d: at %d, known %v; want known %v", seq, at, ok, want)
		}
	}
	e.Peer("b", []Record{issue(3 + issueRing + 5)})
	if at, _, ok := c.issuedAt(3 + issueRing + 5); !ok || at != t0+(3+issueRing+5)*ms {
		t.Errorf("a jump past the ring: %d %v", at, ok)
	}
	if _, _, ok := c.issuedAt(3 + issueRing + 4); ok {
		t.Errorf("the collective before the jump is known")
	}
	e.Peer("b", []Record{{Kind: KindGone, PID: 7}})
	if e.live(m) {
		t.Errorf("a process gone on its sidecar is still live")
	}
	// Its timeline stays for the other ranks' last waits, then goes.
	wm := t0 + int64(time.Second)
	e.ForgetGoneMirrors(wm, after)
	if e.comms[commKey{pid: m, comm: 0xabc}] == nil {
		t.Errorf("a process gone on its sidecar was forgotten at once")
	}
	e.ForgetGoneMirrors(wm+after, after)
	if e.comms[commKey{pid: m, comm: 0xabc}] == nil {
		t.Errorf("a gone process's communicators were forgotten before their time")
	}
	e.ForgetGoneMirrors(wm+after+1, after)
	if e.comms[commKey{pid: m, comm: 0xabc}] != nil {
		t.Errorf("a process gone on its sidecar is still mirrored after its time")
	}
}
