package correlate

import (
	"cmp"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// ddpJob simulates the ranks of one data-parallel job, each a process on
// its own device: every step a rank waits delay(rank, step) on the host,
// launches its kernels, issues an all-reduce and syncs. The all-reduce
// completes when the last rank's stream reached it, plus its own time.
type ddpJob struct {
	ranks []*gpuSim
	// late[r] is how long rank r's GPU spun on the others, over all steps;
	// lateSteps[r] the steps in which it did for at least a millisecond.
	late      []int64
	lateSteps []map[int]bool
	// lag delays a rank's return from its sync (its thread waited for a
	// CPU after the collective completed); done holds when it completed.
	lag func(rank, step int) int64
	// cpu is a rank's host time between two launches (default 50 µs).
	cpu func(rank int) int64
	// begin, when set, runs on each rank at the start of each step, after
	// the host delay (a batch copy, say).
	begin  func(rank int, s *gpuSim)
	done   []int64
	waited [][]int64 // per step, per rank: how long its GPU spun on the others
	// leaveClosed: the last rank's sidecar leaves (sidecars) as one does
	// at the end of its job: its engine closed, every record of it sent.
	leaveClosed bool
}

const commHandle = 0x7f00c0ffee00 // the same address in every rank: forked trainers

func newDDPJob(n int) *ddpJob {
	j := &ddpJob{late: make([]int64, n), lateSteps: make([]map[int]bool, n)}
	for r := 0; r < n; r++ {
		s := newSim()
		s.pid, s.tid = uint32(100+r), uint32(100+r)
		s.evs = append(s.evs, event.Event{Kind: event.KindCommInit, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
			Comm: commHandle, Count: uint64(n), PeerRank: int32(r)})
		j.ranks = append(j.ranks, s)
		j.lateSteps[r] = map[int]bool{}
	}
	return j
}

func (j *ddpJob) run(steps int, delay func(rank, step int) int64) {
	const coll = 2 * ms
	for step := 1; step <= steps; step++ {
		reach := make([]int64, len(j.ranks))
		issue := make([]int64, len(j.ranks))
		var last int64
		for r, s := range j.ranks {
			if d := delay(r, step); d > 0 {
				s.block(event.Event{Kind: event.KindOffCPU}, d)
			}
			if j.begin != nil {
				j.begin(r, s)
			}
			cpu := 50 * us
			if j.cpu != nil {
				cpu = j.cpu(r)
			}
			s.launches(20, 500*us, cpu)
			s.t += 5 * us
			issue[r] = s.t
			reach[r] = max(s.t, s.gpuFree)
			last = max(last, reach[r])
		}
		end := last + coll
		j.done = append(j.done, end)
		w := make([]int64, len(j.ranks))
		for r := range w {
			w[r] = last - reach[r]
		}
		j.waited = append(j.waited, w)
		for r, s := range j.ranks {
			s.gpuFree = end
			s.addBusy(reach[r], end)
			s.evs = append(s.evs, event.Event{Kind: event.KindCollective, PID: s.pid, TID: s.tid, Start: issue[r], End: issue[r],
				Op: event.NCCLAllReduce, Bytes: 64 << 20, Comm: commHandle, Stream: s.stream, PeerRank: -1})
			s.flushed[s.tid] = true
			s.sync()
			if j.lag != nil {
				if l := j.lag(r, step); l > 0 {
					s.evs[len(s.evs)-1].End += l
					s.t += l
				}
			}
			if w := last - reach[r]; w > 0 {
				j.late[r] += w
				if w >= ms {
					j.lateSteps[r][step] = true
				}
			}
		}
	}
}

// trace feeds the ranks in traced to one engine, with NVML windows per
// device (and GPM windows of SM activity sm when sm ≥ 0), and returns each
// rank's comm stalls.
func (j *ddpJob) trace(t *testing.T, traced []int, sm float64) map[int][]Gap {
	t.Helper()
	var evs []event.Event
	var wins []event.GPUWindow
	var until int64
	c := &collect{}
	e := newEngine(c, nil)
	for _, r := range traced {
		s := j.ranks[r]
		e.SetDevice(s.pid, r)
		evs = append(evs, s.evs...)
		add := func(ws []event.GPUWindow) {
			for _, w := range ws {
				w.Device = r
				wins = append(wins, w)
			}
		}
		add(s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil))
		if sm >= 0 {
			add(s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 { return sm }))
		}
		until = max(until, s.t+2e9)
	}
	feed(e, c, evs, wins, until, 20*ms, 250*ms)
	out := map[int][]Gap{}
	for _, g := range c.gaps {
		if g.Kind != GapStall {
			continue
		}
		if g.Cause != CauseComm || g.Evidence.Collective == nil {
			t.Fatalf("stall without comm evidence: %+v", g)
		}
		out[int(g.PID)-100] = append(out[int(g.PID)-100], g)
	}
	return out
}

func total(gs []Gap) int64 {
	var n int64
	for _, g := range gs {
		n += g.Duration
	}
	return n
}

// checkNamed checks that every stall of a rank names the late rank and
// says by how much it was late (within the host's launch jitter).
func checkNamed(t *testing.T, rank int, gs []Gap, lateRank int, by int64) {
	t.Helper()
	for _, g := range gs {
		c := g.Evidence.Collective
		if c.LateRank == nil || int(*c.LateRank) != lateRank || c.LatePID != uint32(100+lateRank) {
			t.Fatalf("rank %d stall names rank %v pid %d, want rank %d pid %d: %+v", rank, c.LateRank, c.LatePID, lateRank, 100+lateRank, g)
		}
		if by > 0 && !near(c.LateByNS, by, ms) {
			t.Errorf("rank %d stall: late by %d ns, want about %d", rank, c.LateByNS, by)
		}
		if g.Duration > c.LateByNS || g.Duration > g.Ops[0].End-g.Ops[0].Start {
			t.Errorf("rank %d stall of %d ns is longer than the lateness %d or the wait %+v", rank, g.Duration, c.LateByNS, g.Ops)
		}
	}
}

// A peer late by 30 ms in every step from the first: no baseline can set
// the lateness apart, and GPM is not needed either: the peer's own
// timeline shows when it issued the collective.
func TestRanksLateEveryStep(t *testing.T) {
	for _, sm := range []float64{-1, 0.1} {
		j := newDDPJob(2)
		j.run(20, func(rank, step int) int64 {
			if rank == 1 {
				return 30 * ms
			}
			return 0
		})
		st := j.trace(t, []int{0, 1}, sm)
		got := total(st[0])
		// Stalls and the GPM path must not both count a wait.
		if float64(got) < 0.9*float64(j.late[0]) || got > j.late[0]+20*50*us {
			t.Errorf("sm %v: rank 0: %d ns of comm in %d stalls, the peer was late %d ns", sm, got, len(st[0]), j.late[0])
		}
		if len(st[0]) != 20 {
			t.Errorf("sm %v: rank 0: %d stalls, want one per step from the first", sm, len(st[0]))
		}
		checkNamed(t, 0, st[0], 1, 30*ms)
		if len(st[1]) != 0 {
			t.Errorf("sm %v: the late rank itself waited on nobody, yet: %+v", sm, st[1])
		}
	}
}

// A rank whose thread gets a CPU late after the collective completed: its
// wait on the peer ends where the peer's sync saw the collective complete,
// not where its own sync returned.
func TestRanksWakeupLag(t *testing.T) {
	j := newDDPJob(2)
	j.lag = func(rank, step int) int64 {
		if rank == 0 {
			return 8 * ms
		}
		return 0
	}
	j.run(12, func(rank, step int) int64 {
		if rank == 1 {
			return 30 * ms
		}
		return 0
	})
	st := j.trace(t, []int{0, 1}, -1)
	if len(st[0]) != 12 {
		t.Fatalf("rank 0: %d stalls, want 12", len(st[0]))
	}
	slices.SortFunc(st[0], func(a, b Gap) int { return cmp.Compare(a.Start, b.Start) })
	for i, g := range st[0] {
		// The lag delays rank 0's next step: after the first, rank 1 is
		// late by 30 ms less the lag.
		if !near(g.End, j.done[i], 100*us) || !near(g.Duration, j.waited[i][0], 100*us) {
			t.Errorf("step %d: stall [%d,%d] (%d ns), want it to end where the collective completed, %d, after %d ns",
				i+1, g.Start-t0, g.End-t0, g.Duration, j.done[i]-t0, j.waited[i][0])
		}
		if c := g.Evidence.Collective; c.LateRank == nil || *c.LateRank != 1 {
			t.Errorf("step %d: stall names rank %v, want 1", i+1, c.LateRank)
		}
	}
}

// A rank that launches slowly has less work queued when it issues the
// collective than a peer that launched fast: the issue times alone would
// understate how long it waited. The step's work began 30 ms later on the
// late rank, and the stall says so.
func TestRanksLaunchPacing(t *testing.T) {
	j := newDDPJob(2)
	j.cpu = func(rank int) int64 {
		if rank == 0 {
			return 450 * us // 20 kernels of 500 µs: the queue stays nearly empty
		}
		return 20 * us
	}
	j.run(12, func(rank, step int) int64 {
		if rank == 1 {
			return 30 * ms
		}
		return 0
	})
	st := j.trace(t, []int{0, 1}, -1)
	if len(st[0]) != 12 {
		t.Fatalf("rank 0: %d stalls, want 12", len(st[0]))
	}
	slices.SortFunc(st[0], func(a, b Gap) int { return cmp.Compare(a.Start, b.Start) })
	for i, g := range st[0] {
		if !near(g.Duration, j.waited[i][0], ms) {
			t.Errorf("step %d: stall of %d ns, rank 0 waited %d ns", i+1, g.Duration, j.waited[i][0])
		}
	}
}

// A peer late only in some steps: the other steps' waits are compute.
func TestRanksLateSometimes(t *testing.T) {
	j := newDDPJob(2)
	j.run(24, func(rank, step int) int64 {
		if rank == 1 && step%3 == 0 {
			return 25 * ms
		}
		return 0
	})
	st := j.trace(t, []int{0, 1}, 0.1)
	got := total(st[0])
	if float64(got) < 0.9*float64(j.late[0]) || got > j.late[0]+8*50*us {
		t.Errorf("rank 0: %d ns of comm, the peer was late %d ns", got, j.late[0])
	}
	for _, g := range st[0] {
		if g.Duration > 26*ms || g.Duration < 20*ms {
			t.Errorf("stall of %d ns, want about 25 ms: %+v", g.Duration, g)
		}
	}
	if len(st[0]) != len(j.lateSteps[0]) {
		t.Errorf("%d stalls for %d late steps", len(st[0]), len(j.lateSteps[0]))
	}
	checkNamed(t, 0, st[0], 1, 25*ms)
	if len(st[1]) != 0 {
		t.Errorf("rank 1 stalls: %+v", st[1])
	}
}

// Three ranks: each waits for the last one, and the stall names it with
// the lateness as seen from that rank.
func TestRanksThree(t *testing.T) {
	j := newDDPJob(3)
	j.run(16, func(rank, step int) int64 {
		switch rank {
		case 1:
			return 10 * ms
		case 2:
			return 40 * ms
		}
		return 0
	})
	st := j.trace(t, []int{0, 1, 2}, -1)
	for r, by := range map[int]int64{0: 40 * ms, 1: 30 * ms} {
		got := total(st[r])
		if float64(got) < 0.9*float64(j.late[r]) || got > j.late[r]+16*50*us {
			t.Errorf("rank %d: %d ns of comm, it waited %d ns on rank 2", r, got, j.late[r])
		}
		if len(st[r]) != 16 {
			t.Errorf("rank %d: %d stalls, want 16", r, len(st[r]))
		}
		checkNamed(t, r, st[r], 2, by)
	}
	if len(st[2]) != 0 {
		t.Errorf("rank 2 was the last, yet: %+v", st[2])
	}
}

// With a rank the engine cannot see (one sidecar per rank), the wait is
// judged as before, by GPM when the peer is late from the first step, and
// the evidence names no late rank.
func TestRanksPeerUnseen(t *testing.T) {
	for _, sm := range []float64{0.1, 0.9} {
		j := newDDPJob(2)
		j.run(20, func(rank, step int) int64 {
			if rank == 1 {
				return 30 * ms
			}
			return 0
		})
		st := j.trace(t, []int{0}, sm)
		if sm > smStallMax {
			if len(st[0]) != 0 {
				t.Errorf("sm %v: %d stalls where GPM shows compute", sm, len(st[0]))
			}
			continue
		}
		// GPM splits busy time into spin and compute only roughly.
		if got := total(st[0]); float64(got) < 0.5*float64(j.late[0]) || got > j.late[0]*12/10 {
			t.Errorf("sm %v: %d ns of comm from GPM, the peer was late %d ns", sm, got, j.late[0])
		}
		for _, g := range st[0] {
			if g.Evidence.Collective.LateRank != nil || g.Evidence.SMActivity == nil {
				t.Fatalf("sm %v: a stall judged without the peer names a late rank or lacks GPM: %+v", sm, g)
			}
		}
	}
}

// Sends and receives are not matched across ranks: a stage sends where the
// next receives, so the k-th of them is not one operation on every rank.
// The waits fall back to GPM.
func TestRanksP2PNotMatched(t *testing.T) {
	j := newDDPJob(2)
	j.run(12, func(rank, step int) int64 {
		if rank == 1 {
			return 30 * ms
		}
		return 0
	})
	for _, s := range j.ranks {
		for i := range s.evs {
			if s.evs[i].Kind == event.KindCollective {
				s.evs[i].Op = event.NCCLSend
			}
		}
	}
	st := j.trace(t, []int{0, 1}, 0.1)
	if len(st[0]) == 0 {
		t.Fatalf("no comm stall from GPM")
	}
	for _, g := range st[0] {
		if g.Evidence.Collective.LateRank != nil || g.Evidence.SMActivity == nil {
			t.Fatalf("a send matched across ranks: %+v", g)
		}
	}
}
