package ranks

import (
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

const (
	t0 = int64(1_700_000_000) * int64(time.Second)
	ms = int64(time.Millisecond)
	// commHandle: the same address in every rank, as forked trainers have.
	commHandle = 0x7f00c0ffee00
	// after: how long a gone mirror's communicators stay (the engine
	// passes windowWait+holdMax, 2.35 s).
	after = int64(2350 * time.Millisecond)
)

// testRegistry is a registry whose own processes are live as live says
// (nil: none of them).
func testRegistry(live map[uint32]bool) *Registry {
	return New(func(pid uint32) bool { return live[pid] })
}

// Linking: ranks of one group link; a second live process claiming a rank
// (another job of the same shape) makes the group unusable; a rank that
// restarted after its predecessor exited takes its place.
func TestRanksGroupLinking(t *testing.T) {
	procs := map[uint32]bool{} // live
	w := testRegistry(procs)
	init := func(pid uint32, rank int32) {
		w.Add(&event.Event{Kind: event.KindCommInit, PID: pid, TID: pid, Comm: commHandle, Count: 2, PeerRank: rank})
	}
	issue := func(pid uint32, at int64) Ref {
		return w.Issue(&event.Event{Kind: event.KindCollective, PID: pid, TID: pid, Start: at, End: at,
			Op: event.NCCLAllReduce, Comm: commHandle}, 0)
	}
	init(100, 0)
	init(101, 1)
	procs[100], procs[101] = true, true
	r := issue(100, t0+ms)
	issue(101, t0+31*ms)
	if late, ok := w.Lateness(r, t0+40*ms); !ok || late.Rank != 1 || late.PID != 101 || late.By != 30*ms {
		t.Fatalf("lateness %+v %v, want rank 1 (pid 101) late by 30 ms", late, ok)
	}
	// A peer's collective issued after this rank's wait ended: misaligned.
	if _, ok := w.Lateness(r, t0+20*ms); ok {
		t.Errorf("a peer issue after the wait's end was accepted")
	}
	// The job restarts (elastic training restarts every rank): the old
	// processes exited, the new ones take their ranks.
	procs[100], procs[101] = false, false
	init(200, 0)
	init(201, 1)
	procs[200], procs[201] = true, true
	r = issue(200, t0+61*ms)
	issue(201, t0+62*ms)
	if late, ok := w.Lateness(r, t0+70*ms); !ok || late.PID != 201 || late.By != ms {
		t.Fatalf("after the restart: lateness %+v %v, want pid 201 late by 1 ms", late, ok)
	}
	// Another live process claims rank 1 of a 2-rank group: two jobs.
	init(300, 1)
	r = issue(200, t0+80*ms)
	issue(300, t0+81*ms)
	if late, ok := w.Lateness(r, t0+90*ms); ok {
		t.Errorf("two live processes with rank 1, yet matched: %+v", late)
	}
	// The sequence numbers of linked communicators count per process.
	if c := w.comms[commKey{pid: 200, comm: commHandle}]; c.n != 2 {
		t.Errorf("rank 0 issued %d collectives, want 2", c.n)
	}
}
