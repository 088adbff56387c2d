package correlate

import (
	"sort"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// unseenJob is a ddpJob whose communicator was created before the engine
// could see it: no KindCommInit event, pids from base, its clock started
// at t0+shift, its ranks on devices dev, dev+1, ...
func unseenJob(n int, base uint32, shift int64) *ddpJob {
	j := newDDPJob(n)
	for r, s := range j.ranks {
		s.pid, s.tid = base+uint32(r), base+uint32(r)
		s.evs = s.evs[:0]
		s.t += shift
	}
	return j
}

// jobFeed is one job of several traced by one engine: its ranks' devices
// start at dev; ranks, when set, are told to the engine (SetRank) with the
// job's size.
type jobFeed struct {
	j     *ddpJob
	dev   int
	ranks bool
}

// traceJobs feeds several jobs to one engine, each rank with its NVML
// windows (and GPM windows of SM activity sm when sm ≥ 0); late says by
// how much later than its end an event reaches the engine (nil: at once).
// It returns every stall by pid.
func traceJobs(t *testing.T, jobs []jobFeed, sm float64, late func(ev *event.Event) int64) (map[uint32][]Gap, *Engine) {
	t.Helper()
	type timed struct {
		ev event.Event
		at int64
	}
	var evs []timed
	var wins []event.GPUWindow
	var until int64
	c := &collect{}
	e := newEngine(c, nil)
	for _, jf := range jobs {
		for r, s := range jf.j.ranks {
			dev := jf.dev + r
			e.SetDevice(s.pid, dev)
			if jf.ranks {
				e.SetRank(s.pid, r, len(jf.j.ranks))
			}
			for _, ev := range s.evs {
				at := ev.End
				if late != nil {
					at += late(&ev)
				}
				evs = append(evs, timed{ev, at})
			}
			add := func(ws []event.GPUWindow) {
				for _, w := range ws {
					w.Device = dev
					wins = append(wins, w)
				}
			}
			add(s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil))
			if sm >= 0 {
				add(s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 { return sm }))
			}
			until = max(until, s.t+2e9)
		}
	}
	sort.SliceStable(evs, func(a, b int) bool { return evs[a].at < evs[b].at })
	sort.SliceStable(wins, func(a, b int) bool { return wins[a].End < wins[b].End })
	i, k := 0, 0
	for now := t0; now <= until; now += 20 * ms {
		c.now = now
		for ; i < len(evs) && evs[i].at <= now; i++ {
			e.Event(evs[i].ev)
		}
		for ; k < len(wins) && wins[k].End+250*ms <= now; k++ {
			e.Window(wins[k])
		}
		e.Advance(now)
	}
	e.Close(until)
	out := map[uint32][]Gap{}
	for _, g := range c.gaps {
		if g.Kind != GapStall {
			continue
		}
		if g.Cause != CauseComm || g.Evidence.Collective == nil {
			t.Fatalf("stall without comm evidence: %+v", g)
		}
		out[g.PID] = append(out[g.PID], g)
	}
	return out, e
}

// checkLinkedStalls checks rank 0's stalls of job j: one per step from the
// first, covering ≥ 0.9 of the time it spun on the late rank (and no more
// than that plus the host's jitter), each naming the late rank's pid, and
// its rank when the environment said it.
func checkLinkedStalls(t *testing.T, j *ddpJob, st map[uint32][]Gap, steps, lateRank int, ranked bool) {
	t.Helper()
	p0, late := j.ranks[0].pid, j.ranks[lateRank].pid
	gs := st[p0]
	got := total(gs)
	if float64(got) < 0.9*float64(j.late[0]) || got > j.late[0]+int64(steps)*50*us {
		t.Errorf("pid %d: %d ns of comm in %d stalls, the peer was late %d ns", p0, got, len(gs), j.late[0])
	}
	if len(gs) != steps {
		t.Errorf("pid %d: %d stalls, want one per step from the first (%d)", p0, len(gs), steps)
	}
	for _, g := range gs {
		c := g.Evidence.Collective
		if c.LatePID != late {
			t.Fatalf("pid %d: stall names pid %d, want %d: %+v", p0, c.LatePID, late, g)
		}
		switch {
		case ranked && (c.LateRank == nil || int(*c.LateRank) != lateRank):
			t.Fatalf("pid %d: stall names rank %v, want %d", p0, c.LateRank, lateRank)
		case !ranked && c.LateRank != nil:
			t.Fatalf("pid %d: stall names rank %d, which nothing said", p0, *c.LateRank)
		}
		if !near(c.LateByNS, 30*ms, ms) || g.Duration > c.LateByNS {
			t.Errorf("pid %d: stall of %d ns late by %d ns, want about 30 ms", p0, g.Duration, c.LateByNS)
		}
	}
	if n := len(st[late]); n != 0 {
		t.Errorf("the late rank (pid %d) itself waited on nobody, yet has %d stalls: %+v", late, n, st[late])
	}
}

func lateRank1(rank, step int) int64 {
	if rank == 1 {
		return 30 * ms
	}
	return 0
}

// TestRanksLinkedFromCollectives: the communicator was created before
// tracing began (no creation event), rank 1 is late by 30 ms in every
// step. The ranks' collectives link their communicators, and rank 0's
// waits are judged by the ranks from the first step, naming the late
// process, and its rank where the environment says it.
func TestRanksLinkedFromCollectives(t *testing.T) {
	for _, ranked := range []bool{false, true} {
		for _, sm := range []float64{-1, 0.1} {
			j := unseenJob(2, 100, 0)
			j.run(20, lateRank1)
			st, _ := traceJobs(t, []jobFeed{{j: j, ranks: ranked}}, sm, nil)
			checkLinkedStalls(t, j, st, 20, 1, ranked)
		}
	}
}

// TestRanksLinkedThree: three ranks, created unseen; each waits for the
// last one.
func TestRanksLinkedThree(t *testing.T) {
	j := unseenJob(3, 100, 0)
	j.run(16, func(rank, step int) int64 {
		switch rank {
		case 1:
			return 10 * ms
		case 2:
			return 40 * ms
		}
		return 0
	})
	st, _ := traceJobs(t, []jobFeed{{j: j, ranks: true}}, -1, nil)
	for r := range 2 {
		gs := st[uint32(100+r)]
		if got := total(gs); float64(got) < 0.9*float64(j.late[r]) || got > j.late[r]+16*50*us {
			t.Errorf("rank %d: %d ns of comm, it waited %d ns on rank 2", r, got, j.late[r])
		}
		for _, g := range gs {
			if c := g.Evidence.Collective; c.LatePID != 102 || c.LateRank == nil || *c.LateRank != 2 {
				t.Fatalf("rank %d: stall names pid %d rank %v, want pid 102 rank 2", r, c.LatePID, c.LateRank)
			}
		}
	}
	if len(st[102]) != 0 {
		t.Errorf("rank 2 was the last, yet: %+v", st[102])
	}
}

// TestRanksLinkLateEvent: one of the late rank's collectives reaches the
// engine after rank 0's wait on it was due (the reader fell behind): it
// still takes its place in the sequence, the link holds, and that wait is
// judged by the ranks once it arrived.
func TestRanksLinkLateEvent(t *testing.T) {
	j := unseenJob(2, 100, 0)
	j.run(20, lateRank1)
	n := 0
	st, e := traceJobs(t, []jobFeed{{j: j}}, -1, func(ev *event.Event) int64 {
		if ev.PID == 101 && ev.Kind == event.KindCollective {
			if n++; n == 8 {
				return 530 * ms // past the watermark and rank 0's sync, before rank 1's next collective
			}
		}
		return 0
	})
	if e.lost.LateEvents == 0 {
		t.Fatalf("no event was late")
	}
	checkLinkedStalls(t, j, st, 20, 1, false)
}

// TestRanksIndependentNotLinked: two processes of two independent 1-rank
// jobs of the same shape (the same all-reduce every step, the same GPU
// work) traced by one engine. Whether their phase stays put or drifts, the
// collectives complete on each at its own time: their communicators are
// not linked, and no stall names the other process.
func TestRanksIndependentNotLinked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shift int64
		delay func(rank, step int) int64
	}{
		{name: "fixed phase 5 ms", shift: 5 * ms},
		{name: "fixed phase 8 ms", shift: 8 * ms},
		{name: "drifting", shift: 3 * ms, delay: func(rank, step int) int64 { return int64(step) * 300 * us }},
		{name: "one host late every step", shift: 7 * ms, delay: func(rank, step int) int64 { return 30 * ms }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := unseenJob(1, 100, 0), unseenJob(1, 200, tc.shift)
			a.run(40, func(rank, step int) int64 { return 0 })
			if tc.delay == nil {
				tc.delay = func(rank, step int) int64 { return 0 }
			}
			b.run(40, tc.delay)
			st, e := traceJobs(t, []jobFeed{{j: a}, {j: b, dev: 1}}, 0.1, nil)
			for pid, gs := range st {
				for _, g := range gs {
					if g.Evidence.Collective.LatePID != 0 {
						t.Fatalf("pid %d: a stall names pid %d of another job: %+v", pid, g.Evidence.Collective.LatePID, g)
					}
				}
			}
			for k, c := range e.comms {
				if c.group != nil {
					t.Errorf("pid %d's communicator is linked (%d members)", k.pid, len(c.group.members))
				}
			}
		})
	}
}

// TestRanksTwoJobsSameShape: two 2-rank jobs of the same shape, each with
// its rank 1 late by 30 ms in every step, traced by one engine, none of
// their communicators seen created: each job's rank 0 names its own late
// rank, never the other job's, with ranks from the environment (both jobs
// have a rank 0 and a rank 1) or without.
func TestRanksTwoJobsSameShape(t *testing.T) {
	for _, ranked := range []bool{false, true} {
		a, b := unseenJob(2, 100, 0), unseenJob(2, 200, 11*ms)
		a.run(30, lateRank1)
		b.run(30, lateRank1)
		st, _ := traceJobs(t, []jobFeed{{j: a, ranks: ranked}, {j: b, dev: 2, ranks: ranked}}, -1, nil)
		checkLinkedStalls(t, a, st, 30, 1, ranked)
		checkLinkedStalls(t, b, st, 30, 1, ranked)
	}
}

// TestRanksLinkSizeBounds: the environment says the job has 4 ranks; only
// 2 are traced here (the others run under another gaptrace). The group
// is not whole, so the ranks do not judge its waits: the GPM path does, as
// for a peer the engine cannot see.
func TestRanksLinkSizeBounds(t *testing.T) {
	j := unseenJob(2, 100, 0)
	j.run(20, lateRank1)
	c := &collect{}
	e := newEngine(c, nil)
	var evs []event.Event
	var wins []event.GPUWindow
	for r, s := range j.ranks {
		e.SetDevice(s.pid, r)
		e.SetRank(s.pid, r, 4)
		evs = append(evs, s.evs...)
		for _, w := range append(s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil),
			s.windows(t0, s.t+200*ms, 100*ms, event.SourceGPM, func(a, b int64) float64 { return 0.1 })...) {
			w.Device = r
			wins = append(wins, w)
		}
	}
	feed(e, c, evs, wins, j.ranks[0].t+2e9, 20*ms, 250*ms)
	n := 0
	for _, g := range c.gaps {
		if g.Kind != GapStall {
			continue
		}
		n++
		if g.Evidence.Collective.LatePID != 0 || g.Evidence.SMActivity == nil {
			t.Fatalf("a wait of a group missing ranks was judged by the ranks seen: %+v", g)
		}
	}
	if n == 0 {
		t.Errorf("no comm stall from GPM")
	}
}

// TestRanksOneCreationSeen: the probes came in between the ranks'
// creations of their communicator: rank 0's was seen (2 ranks, rank 0),
// rank 1's not. The collectives link the two, and rank 1 is the one rank
// left: the stalls name it.
func TestRanksOneCreationSeen(t *testing.T) {
	j := newDDPJob(2)
	s1 := j.ranks[1]
	s1.evs = s1.evs[:0]
	j.run(20, lateRank1)
	st, _ := traceJobs(t, []jobFeed{{j: j}}, -1, nil)
	checkLinkedStalls(t, j, st, 20, 1, true)
}

// TestRanksCreationSeenFirstCollectiveMissed: both ranks' creations were
// seen, but rank 0 issued its first all-reduce before the libnccl probe on
// it was in (a trainer that creates its communicator and at once
// broadcasts its weights, the probes attaching one by one), while rank 1,
// 30 ms later, was seen issuing it. Counted from the creation, rank 0's
// k-th collective would be paired with rank 1's (k-1)-th, issued earlier:
// every wait judged on time, no stall. The collectives realign the pair
// within a few steps, and the stalls name rank 1 from then on.
func TestRanksCreationSeenFirstCollectiveMissed(t *testing.T) {
	for _, missed := range []int{0, 1} {
		j := newDDPJob(2)
		j.run(40, lateRank1)
		s := j.ranks[missed]
		for i, ev := range s.evs {
			if ev.Kind == event.KindCollective {
				s.evs = append(s.evs[:i], s.evs[i+1:]...)
				break
			}
		}
		st, _ := traceJobs(t, []jobFeed{{j: j}}, -1, nil)
		gs := st[j.ranks[0].pid]
		got := total(gs)
		// The first steps may go by before the sequences realign.
		if float64(got) < 0.8*float64(j.late[0]) {
			t.Errorf("rank %d's first collective missed: rank 0: %d ns of comm in %d stalls, the peer was late %d ns",
				missed, got, len(gs), j.late[0])
		}
		for _, g := range gs {
			c := g.Evidence.Collective
			if c.LatePID != j.ranks[1].pid || c.LateRank == nil || *c.LateRank != 1 {
				t.Fatalf("rank %d's first collective missed: stall names %v pid %d: %+v", missed, c.LateRank, c.LatePID, g)
			}
		}
		if n := len(st[j.ranks[1].pid]); n != 0 {
			t.Errorf("rank %d's first collective missed: the late rank has %d stalls", missed, n)
		}
	}
}
