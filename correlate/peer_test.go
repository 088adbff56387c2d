package correlate

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// sidecars traces each rank of j with an engine of its own, as one
// sidecar per rank does, the engines exchanging their records (Peer) with
// a delay of lag ticks on the way. Both ranks may have the same pid (each
// in its own container). From leave on (0: never) the last rank's sidecar
// is gone: the others are told so, and hear nothing more from it. It
// returns each engine's comm stalls, and rank 0's collector.
func (j *ddpJob) sidecars(t *testing.T, lag int, leave int64, prep func(r int, e *Engine)) ([][]Gap, *collect) {
	t.Helper()
	const tick, winLate = 20 * ms, 250 * ms
	type queued struct {
		at   int
		from int
		r    PeerRecord
	}
	n := len(j.ranks)
	var inflight []queued
	engs := make([]*Engine, n)
	cols := make([]*collect, n)
	evs := make([][]event.Event, n)
	wins := make([][]event.GPUWindow, n)
	var until int64
	step := 0
	for r, s := range j.ranks {
		cols[r] = &collect{}
		engs[r] = newEngine(cols[r], nil)
		engs[r].SetDevice(s.pid, 0)
		from := r
		engs[r].SetPeerOut(func(rec PeerRecord) { inflight = append(inflight, queued{at: step + lag, from: from, r: rec}) })
		if prep != nil {
			prep(r, engs[r])
		}
		evs[r] = append([]event.Event(nil), s.evs...)
		sort.SliceStable(evs[r], func(a, b int) bool { return evs[r][a].End < evs[r][b].End })
		wins[r] = s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil)
		until = max(until, s.t+2e9)
	}
	next := make([]int, n)
	nextWin := make([]int, n)
	left := false
	for now := int64(t0); now <= until; now += tick {
		if leave > 0 && now >= leave && !left {
			left = true
			if j.leaveClosed {
				engs[n-1].Close(now)
				for _, q := range inflight {
					if q.from == n-1 {
						for _, e := range engs[:n-1] {
							e.Peer(fmt.Sprint("sidecar-", q.from), []PeerRecord{q.r})
						}
					}
				}
			}
			for _, e := range engs[:n-1] {
				e.PeerLeft(fmt.Sprint("sidecar-", n-1))
			}
		}
		for r, e := range engs {
			if left && r == n-1 {
				continue
			}
			cols[r].now = now
			for next[r] < len(evs[r]) && evs[r][next[r]].End <= now {
				e.Event(evs[r][next[r]])
				next[r]++
			}
			for nextWin[r] < len(wins[r]) && wins[r][nextWin[r]].End+winLate <= now {
				e.Window(wins[r][nextWin[r]])
				nextWin[r]++
			}
		}
		k := 0
		for _, q := range inflight {
			if q.at > step {
				inflight[k] = q
				k++
				continue
			}
			if left && q.from == n-1 {
				continue
			}
			for r, e := range engs {
				if r != q.from {
					e.Peer(fmt.Sprint("sidecar-", q.from), []PeerRecord{q.r})
				}
			}
		}
		inflight = inflight[:k]
		for r, e := range engs {
			if !left || r < n-1 {
				e.Advance(now)
			}
		}
		step++
	}
	out := make([][]Gap, n)
	for r, e := range engs {
		if !left || r < n-1 {
			e.Close(until)
		}
		for _, g := range cols[r].gaps {
			if g.Kind == GapStall && g.Cause == CauseComm {
				out[r] = append(out[r], g)
			}
		}
	}
	return out, cols[0]
}

// One sidecar per rank: the peer late by 30 ms in every step from the
// first is named from its own sidecar's records, as if one engine traced
// both, though the two ranks have the same pid in their containers and
// the records arrive up to 100 ms late.
func TestPeersLateEveryStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		lag  int
		// unseen: the communicators' creation was not seen; the ranks'
		// environments say RANK and WORLD_SIZE.
		unseen bool
	}{
		{name: "at once", lag: 0},
		{name: "100 ms late", lag: 5},
		{name: "created unseen", lag: 2, unseen: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newDDPJob(2)
			for _, s := range j.ranks {
				s.pid, s.tid = 1, 1
				for i := range s.evs {
					s.evs[i].PID, s.evs[i].TID = 1, 1
				}
				if tc.unseen {
					s.evs = s.evs[1:] // the KindCommInit
				}
			}
			j.run(20, func(rank, step int) int64 {
				if rank == 1 {
					return 30 * ms
				}
				return 0
			})
			for _, s := range j.ranks {
				for i := range s.evs {
					s.evs[i].PID, s.evs[i].TID = 1, 1
				}
			}
			st, _ := j.sidecars(t, tc.lag, 0, func(r int, e *Engine) {
				if tc.unseen {
					e.SetRank(1, r, 2)
				}
			})
			got := total(st[0])
			if float64(got) < 0.9*float64(j.late[0]) || got > j.late[0]+20*50*us {
				t.Errorf("rank 0: %d ns of comm in %d stalls, the peer was late %d ns", got, len(st[0]), j.late[0])
			}
			min := 20
			if tc.unseen {
				min = 20 - 64/8 // linking takes a few collectives (ranks: linkEager)
			}
			if len(st[0]) < min {
				t.Errorf("rank 0: %d stalls, want %d or more", len(st[0]), min)
			}
			for _, g := range st[0] {
				c := g.Evidence.Collective
				if c.LateRank == nil || *c.LateRank != 1 || c.LatePID != 1 || c.LateSidecar != "sidecar-1" {
					t.Fatalf("rank 0's stall names rank %v pid %d of %q, want rank 1 pid 1 of sidecar-1: %+v", c.LateRank, c.LatePID, c.LateSidecar, g)
				}
				if !near(c.LateByNS, 30*ms, ms) {
					t.Errorf("late by %d ns, want about 30 ms", c.LateByNS)
				}
			}
			if len(st[1]) != 0 {
				t.Errorf("the late rank waited on nobody, yet: %+v", st[1])
			}
		})
	}
}

// The late rank's sidecar goes away after 20 steps, without sending what
// it had not processed yet: rank 0's verdicts do not wait for it (every
// gap within the second), and no later stall names it.
func TestPeersLeft(t *testing.T) {
	j := newDDPJob(2)
	j.run(40, func(rank, step int) int64 {
		if rank == 1 {
			return 30 * ms
		}
		return 0
	})
	leave := j.done[19]
	st, c := j.sidecars(t, 2, leave, nil)
	named := 0
	for _, g := range st[0] {
		if g.Evidence.Collective.LateSidecar == "" {
			continue
		}
		named++
		if g.End > leave {
			t.Errorf("a stall at %d ms, after rank 1's sidecar left at %d ms, names it: %+v", (g.End-t0)/ms, (leave-t0)/ms, g)
		}
	}
	// Its records of the last emit delay before it left never came.
	if named < 6 {
		t.Errorf("%d stalls named rank 1's sidecar before it left, want ≥ 6", named)
	}
	for i, g := range c.gaps {
		if d := c.gapAt[i] - g.End; d > int64(time.Second) {
			t.Errorf("gap ending at %d ms emitted %d ms after its end", (g.End-t0)/ms, d/ms)
		}
	}
}

// The late rank's job ends and its sidecar leaves as soon as it has sent
// its records of the last step: rank 0's last waits, decided after that,
// are still judged by the gone rank's timeline and name it, every step's.
func TestPeersLeftAfterLastStep(t *testing.T) {
	j := newDDPJob(2)
	j.run(20, func(rank, step int) int64 {
		if rank == 1 {
			return 30 * ms
		}
		return 0
	})
	j.leaveClosed = true
	st, _ := j.sidecars(t, 2, j.done[len(j.done)-1]+ms, nil)
	if len(st[0]) != 20 {
		t.Fatalf("rank 0: %d comm stalls, want 20", len(st[0]))
	}
	for i, g := range st[0] {
		if c := g.Evidence.Collective; c.LateSidecar != "sidecar-1" || !near(c.LateByNS, 30*ms, ms) {
			t.Errorf("stall %d (%d ms) names %q late by %d ns, want sidecar-1 late 30 ms", i+1, (g.End-t0)/ms,
				c.LateSidecar, c.LateByNS)
		}
	}
}
