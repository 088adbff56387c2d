package hang

import (
	"strings"
	"testing"
	"time"
)

const sec = int64(time.Second)

// twoRanks is a job of two local ranks: rank 0 (pid 10) waits in a sync
// for all-reduce #5, rank 1 (pid 20) issued up to #4.
func twoRanks(now int64, state1 string) Snapshot {
	coll := &Collective{Op: "AllReduce", Comm: 0xc0, Seq: 5, Bytes: 1 << 20, Rank: 0, Ranks: 2, Issued: 10 * sec}
	return Snapshot{
		Now:      now,
		Calls:    []Call{{PID: 10, TID: 11, Kind: Sync, Name: "cuStreamSynchronize", Since: 10 * sec, Mono: 3, Collective: coll}},
		Progress: map[uint32]int64{10: 10*sec - 1, 20: 9 * sec},
		Procs: map[uint32]Proc{10: {PID: 10, State: StateRunning},
			20: {PID: 20, State: state1, Exit: map[bool]string{true: "killed by signal 9"}[state1 == StateExited]}},
		Members: []Member{{Proc: Proc{PID: 10}, Rank: 0, Ranks: 2, Seq: 5}, {Proc: Proc{PID: 20}, Rank: 1, Ranks: 2, Seq: 4}},
		Rank:    map[uint32]int32{10: 0, 20: 1},
	}
}

func TestCollectiveWaitNamesTheMissingRank(t *testing.T) {
	for _, state := range []string{StateStopped, StateDisk, StateExited, StateRunning} {
		t.Run(state, func(t *testing.T) {
			d := New(2 * time.Second)
			if st, en := d.Check(twoRanks(11*sec, state)); len(st)+len(en) != 0 {
				t.Fatalf("1 s in: started %d ended %d, want none", len(st), len(en))
			}
			st, _ := d.Check(twoRanks(12*sec, state))
			if len(st) != 1 {
				t.Fatalf("2 s in: started %d, want 1", len(st))
			}
			r := st[0]
			if r.PID != 10 || r.TID != 11 || r.Rank != 0 || r.Status != Ongoing || r.Since != 10*sec || r.Seconds != 2 {
				t.Errorf("report %+v", r)
			}
			if len(r.Missing) != 1 || r.Missing[0].Rank != 1 || r.Missing[0].PID != 20 || r.Missing[0].State != state {
				t.Fatalf("missing %+v, want rank 1 pid 20 %s", r.Missing, state)
			}
			if len(r.Arrived) != 1 || r.Arrived[0].Rank != 0 {
				t.Errorf("arrived %+v", r.Arrived)
			}
			if !strings.Contains(r.Reason, "AllReduce #5") || !strings.Contains(r.Reason, "rank 1 (pid 20") {
				t.Errorf("reason %q", r.Reason)
			}
			if state == StateExited && !strings.Contains(r.Reason, "killed by signal 9") {
				t.Errorf("reason %q lacks the exit", r.Reason)
			}
			// Still in flight: no new report, its time grows.
			st, en := d.Check(twoRanks(15*sec, state))
			if len(st)+len(en) != 0 || len(d.Active()) != 1 || d.Active()[0].Seconds != 5 {
				t.Fatalf("ongoing: started %d ended %d active %+v", len(st), len(en), d.Active())
			}
			// The call returned: the hang ends then.
			s := twoRanks(16*sec, state)
			s.Calls = nil
			_, en = d.Check(s)
			if len(en) != 1 || en[0].Status != Ended || en[0].End != 16*sec || en[0].Seconds != 6 || len(d.Active()) != 0 {
				t.Fatalf("ended %+v active %d", en, len(d.Active()))
			}
		})
	}
}

func TestArrivedPeerIsNotMissing(t *testing.T) {
	s := twoRanks(13*sec, StateRunning)
	s.Members[1].Seq = 5
	st, _ := New(2 * time.Second).Check(s)
	if len(st) != 1 || len(st[0].Missing) != 0 || len(st[0].Arrived) != 2 {
		t.Fatalf("got %+v", st)
	}
}

func TestNoHang(t *testing.T) {
	cases := map[string]func(*Snapshot){
		"progress since the call began": func(s *Snapshot) { s.Progress[10] = 12 * sec },
		"process itself stopped":        func(s *Snapshot) { s.Procs[10] = Proc{PID: 10, State: StateStopped} },
		"syscall of a helper thread": func(s *Snapshot) {
			s.Calls = []Call{{PID: 10, TID: 12, Kind: Syscall, Name: "futex", Since: sec}}
		},
		"below the threshold": func(s *Snapshot) { s.Calls[0].Since = 12*sec + 1 },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			s := twoRanks(14*sec, StateRunning)
			mod(&s)
			if st, _ := New(2 * time.Second).Check(s); len(st) != 0 {
				t.Fatalf("reported %+v", st[0])
			}
		})
	}
}

func TestFeederSyscall(t *testing.T) {
	s := Snapshot{Now: 100 * sec, Progress: map[uint32]int64{7: 10 * sec},
		Calls: []Call{{PID: 7, TID: 7, Kind: Syscall, Name: "read", Since: 20 * sec, FD: 5, File: "pipe:[42]", Feeder: true}}}
	st, _ := New(time.Minute).Check(s)
	if len(st) != 1 || st[0].Rank != -1 || !strings.Contains(st[0].Reason, "read on pipe:[42] for 80s") {
		t.Fatalf("got %+v", st)
	}
}

// The same call is one hang from tick to tick even when its Unix start
// moves by a clock offset measured again.
func TestSameCallAcrossClockUpdates(t *testing.T) {
	d := New(2 * time.Second)
	s := twoRanks(12*sec, StateStopped)
	if st, _ := d.Check(s); len(st) != 1 {
		t.Fatal("not started")
	}
	s = twoRanks(13*sec, StateStopped)
	s.Calls[0].Since += 31
	if st, en := d.Check(s); len(st)+len(en) != 0 {
		t.Fatalf("started %d ended %d after a 31 ns clock update", len(st), len(en))
	}
}

func TestUntracedRanks(t *testing.T) {
	s := twoRanks(12*sec, StateRunning)
	s.Calls[0].Collective.Ranks = 4
	for i := range s.Members {
		s.Members[i].Ranks = 4
	}
	st, _ := New(2 * time.Second).Check(s)
	if len(st) != 1 || len(st[0].Untraced) != 2 || st[0].Untraced[0] != 2 || len(st[0].Missing) != 1 {
		t.Fatalf("got %+v", st)
	}
}

// sockWait: pid 10 (rank 0) waits 3 s in a recv or a futex; pid 20 (rank
// 1, in state1) and pid 30 (rank 2, running) are its socket peers.
func sockWait(name string, peer uint32, state1 string) Snapshot {
	return Snapshot{
		Now: 13 * sec,
		Calls: []Call{{PID: 10, TID: 10, Kind: Syscall, Name: name, Since: 10 * sec, Feeder: true, FD: 5,
			File: "socket:[77]", PeerAddr: "127.0.0.1:4000", PeerPID: peer}},
		Progress: map[uint32]int64{10: 9 * sec},
		Procs: map[uint32]Proc{10: {PID: 10, State: StateSleeping}, 20: {PID: 20, State: state1},
			30: {PID: 30, State: StateRunning}},
		Rank:      map[uint32]int32{10: 0, 20: 1, 30: 2},
		Connected: map[uint32][]uint32{10: {30, 20}},
	}
}

// A wait outside NCCL names its socket's other end, whatever its state;
// without one (a helper thread polls), the socket peers that cannot answer.
func TestSocketWaitNamesThePeer(t *testing.T) {
	st, _ := New(2 * time.Second).Check(sockWait("recvfrom", 30, StateStopped))
	if len(st) != 1 || len(st[0].Missing) != 1 || st[0].Missing[0].PID != 30 || st[0].Missing[0].Rank != 2 {
		t.Fatalf("recv from pid 30: %+v", st)
	}
	if r := st[0].Reason; !strings.Contains(r, "to 127.0.0.1:4000") || !strings.Contains(r, "missing: rank 2 (pid 30, running)") {
		t.Errorf("reason %q", r)
	}
	st, _ = New(2 * time.Second).Check(sockWait("futex", 0, StateStopped))
	if len(st) != 1 || len(st[0].Missing) != 1 || st[0].Missing[0].PID != 20 || st[0].Missing[0].State != StateStopped {
		t.Fatalf("futex with a stopped socket peer: %+v", st)
	}
	st, _ = New(2 * time.Second).Check(sockWait("futex", 0, StateRunning))
	if len(st) != 1 || len(st[0].Missing) != 0 {
		t.Fatalf("futex with running socket peers: %+v", st)
	}
	s := sockWait("futex", 0, StateSleeping) // pid 20 blocked in a read since before
	s.Calls = append(s.Calls, Call{PID: 20, TID: 20, Kind: Syscall, Name: "read", Since: 9 * sec, Feeder: true})
	st, _ = New(2 * time.Second).Check(s)
	if len(st) < 1 || st[0].PID != 10 || len(st[0].Missing) != 1 || st[0].Missing[0].PID != 20 {
		t.Fatalf("futex with a socket peer stuck in a read since before: %+v", st)
	}
	s = sockWait("recvfrom", 99, StateRunning) // an untraced process
	s.Connected = nil
	if st, _ := New(2 * time.Second).Check(s); len(st) != 1 || len(st[0].Missing) != 0 {
		t.Fatalf("recv from an untraced process: %+v", st)
	}
}
