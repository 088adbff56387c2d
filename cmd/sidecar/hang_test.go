package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/hang"
)

// The watch's bookkeeping from the events and peer records the pipeline
// routes: local collectives number per communicator, a sync names the last
// one on its stream issued before it began, remote ranks come from --peers
// and go with their sidecar.
func TestHangWatchBookkeeping(t *testing.T) {
	h := newHangWatch(time.Minute, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	h.commInit(&event.Event{Kind: event.KindCommInit, PID: 10, Comm: 0xc0, Count: 2, PeerRank: 0})
	for i := range 3 {
		h.collective(&event.Event{Kind: event.KindCollective, PID: 10, Comm: 0xc0, Stream: 0x5, Op: event.NCCLOp(1),
			Bytes: 4096, Start: int64(100 + i)})
	}
	h.peer(peers.Batch{From: "nodeb/rank1/77", Recs: []correlate.PeerRecord{
		{Kind: correlate.PeerComm, PID: 20, Comm: 0xd0, Ranks: 2, Rank: 1},
		{Kind: correlate.PeerIssue, PID: 20, Comm: 0xd0, Seq: 1, At: 101},
	}})
	c := &hang.Call{PID: 10, TID: 10, Kind: hang.Sync, Name: event.CUStreamSynchronize.String(), Stream: 0x5, Since: 150}
	got := h.waitedCollective(c)
	if got == nil || got.Seq != 2 || got.Rank != 0 || got.Ranks != 2 || got.Issued != 102 || got.Op != "AllReduce" {
		t.Fatalf("waited collective %+v, want all-reduce #2 of rank 0 of 2", got)
	}
	c.Since = 101 // the sync began before the last collective: not its wait
	if got := h.waitedCollective(c); got != nil {
		t.Errorf("a collective issued after the sync began: %+v", got)
	}
	m := h.remote[remoteKey{"nodeb/rank1/77", 20, 0xd0}]
	if m == nil || m.Rank != 1 || m.Ranks != 2 || m.Seq != 1 || m.Host != "nodeb" || m.Sidecar != "nodeb/rank1/77" {
		t.Fatalf("remote member %+v", m)
	}
	h.peer(peers.Batch{From: "nodeb/rank1/77", Left: true})
	if m.State != "sidecar left" {
		t.Errorf("remote member after its sidecar left: %+v", m)
	}
	h.exit(&event.Event{Kind: event.KindExit, PID: 30, TID: 30, Start: 5, Ret: 9})
	if p := h.exited[30]; p.State != hang.StateExited || p.Exit != "killed by SIGKILL" {
		t.Errorf("exited %+v", p)
	}
	h.exit(&event.Event{Kind: event.KindExit, PID: 31, TID: 31, Ret: 3 << 8})
	if p := h.exited[31]; p.Exit != "exit status 3" {
		t.Errorf("exited %+v", p)
	}
}

// Process states between sidecars: a change is told at once, the same
// state again only on refresh; what is heard names a remote rank's state,
// an exit the engine reported stands, and a sidecar's leaving drops its
// states.
func TestHangWatchPeerStates(t *testing.T) {
	h := newHangWatch(time.Minute, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	var sent []correlate.PeerRecord
	h.send = func(r correlate.PeerRecord) { sent = append(sent, r) }
	procs := map[uint32]hang.Proc{7: {PID: 7, State: hang.StateRunning}}
	h.tellStates(procs, 10e9)
	h.tellStates(procs, 11e9)
	procs[7] = hang.Proc{PID: 7, State: hang.StateDisk, WChan: "folio_wait_bit_common", File: "pread64 /mnt/x\n"}
	h.tellStates(procs, 12e9)
	h.tellStates(procs, 16e9)
	if len(sent) != 3 || sent[0].State != hang.StateRunning || sent[1].State != hang.StateDisk || sent[2] != sent[1] {
		t.Fatalf("sent %+v, want running, then disk-sleep at once and again on refresh", sent)
	}
	if r := sent[1]; r.At != 12e9 || r.File != "pread64 /mnt/x?" || r.Check() != nil {
		t.Errorf("disk-sleep record %+v (check: %v)", r, r.Check())
	}
	from := "nodeb/rank1/77"
	h.peer(peers.Batch{From: from, Recs: []correlate.PeerRecord{
		{Kind: correlate.PeerComm, PID: 7, Comm: 0xd0, Ranks: 2, Rank: 1}, sent[1]}})
	m := h.remoteMember(*h.remote[remoteKey{from, 7, 0xd0}])
	if m.State != hang.StateDisk || m.File != "pread64 /mnt/x?" || m.Host != "nodeb" || m.Since != 12e9 {
		t.Errorf("remote member %+v, want in D on the file since 12 s", m)
	}
	h.peer(peers.Batch{From: from, Recs: []correlate.PeerRecord{{Kind: correlate.PeerGone, PID: 7, At: 20e9}}})
	if m := h.remoteMember(*h.remote[remoteKey{from, 7, 0xd0}]); m.State != hang.StateExited {
		t.Errorf("after its engine said it exited: %+v", m)
	}
	h.peer(peers.Batch{From: from, Recs: []correlate.PeerRecord{{Kind: correlate.PeerProc, PID: 7, State: hang.StateExited,
		Exit: "killed by SIGKILL", At: 20e9}}})
	if m := h.remoteMember(*h.remote[remoteKey{from, 7, 0xd0}]); m.Exit != "killed by SIGKILL" || m.Since != 20e9 {
		t.Errorf("after its state said how it exited: %+v", m)
	}
	h.peer(peers.Batch{From: from, Left: true})
	if len(h.remoteProcs) != 0 {
		t.Errorf("states kept after their sidecar left: %+v", h.remoteProcs)
	}
	if got := clip("ab\u00e9cd", 3); got != "ab" {
		t.Errorf("clip cut inside a rune: %q", got)
	}
}

// TestHangStatesMatchPeers: every state the watch says can travel.
func TestHangStatesMatchPeers(t *testing.T) {
	for _, s := range []string{hang.StateRunning, hang.StateSleeping, hang.StateStopped, hang.StateDisk, hang.StateZombie,
		hang.StateExited, hang.StateUnknown} {
		r := correlate.PeerRecord{Kind: correlate.PeerProc, PID: 1, State: s}
		if err := r.Check(); err != nil {
			t.Errorf("state %q: %v", s, err)
		}
	}
}
