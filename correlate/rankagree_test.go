package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestRanksPrologueAgree: two ranks of one communicator under one engine,
// whose starts differ: rank 0 warms its GPU up before the loop (a prologue
// longer than an iteration), rank 1 enters the loop at once (its prologue
// is a sliver of the first iteration). Every rank must number the same
// iteration alike, and step N is iteration N.
func TestRanksPrologueAgree(t *testing.T) {
	j := newDDPJob(2)
	w := j.ranks[0]
	w.launches(40, ms, 50*us)
	w.sync()
	w.t += 2 * ms
	const iters = 40
	loopFrom := make([]int, 2)
	for r, s := range j.ranks {
		loopFrom[r] = len(s.evs)
	}
	j.run(iters, func(rank, step int) int64 { return 0 })
	c := &collect{}
	e := newEngine(c, nil)
	var evs []event.Event
	var wins []event.GPUWindow
	var until int64
	for r, s := range j.ranks {
		e.SetDevice(s.pid, r)
		evs = append(evs, s.evs...)
		for _, w := range s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil) {
			w.Device = r
			wins = append(wins, w)
		}
		until = max(until, s.t+2e9)
	}
	feed(e, c, evs, wins, until, 20*ms, 250*ms)
	// Each rank's loop syncs end its iterations; the step ending at the
	// k-th is iteration k's.
	for r, s := range j.ranks {
		byEnd := map[int64]Step{}
		for _, st := range c.steps {
			if st.PID == s.pid {
				byEnd[st.End] = st
			}
		}
		k, found := 0, 0
		for _, ev := range s.evs[loopFrom[r]:] {
			if ev.Kind != event.KindSync {
				continue
			}
			k++
			st, ok := byEnd[ev.End]
			if !ok {
				continue
			}
			found++
			if st.Number != int64(k) {
				t.Errorf("rank %d: iteration %d is step %d (window %v)", r, k, st.Number, st.Window)
			}
		}
		if found < iters-3 {
			t.Errorf("rank %d: %d of %d iterations end a step", r, found, iters)
		}
	}
}

// TestRanksSeparateSidecarsAgree: the ranks of one job each traced by
// their own sidecar (an engine per rank, as a sidecar per pod runs), with
// different starts: rank 0 works 40 ms on its GPU before the loop (its
// first collective waits for nothing), rank 1 enters the loop at once (its
// first sync waits 40 ms for rank 0 to reach the all-reduce). No engine
// sees the other rank, yet the same iteration must carry the same step
// number on both (it names the step's trace), and step N is iteration N:
// the steps are numbered by the communicator's sequence of collectives.
func TestRanksSeparateSidecarsAgree(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup: what both ranks do before the loop after rank 0's warm-up
		// (DDP broadcasts the parameters from rank 0 on the communicator).
		setup func(s *gpuSim)
		begin func(rank int, s *gpuSim)
	}{
		{name: "all-reduce only"},
		{
			name: "broadcast in setup, batch copy each step",
			setup: func(s *gpuSim) {
				s.collective(event.NCCLBroadcast, 3*ms)
				s.evs[len(s.evs)-1].Comm, s.evs[len(s.evs)-1].Bytes = commHandle, 16<<20
				s.sync()
			},
			begin: func(rank int, s *gpuSim) { s.copyAsync(300*us, s.stream) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newDDPJob(2)
			j.begin = tc.begin
			w := j.ranks[0]
			w.launches(40, ms, 50*us)
			w.sync()
			w.t += 2 * ms
			if tc.setup != nil {
				for _, s := range j.ranks {
					tc.setup(s)
				}
			}
			const iters = 40
			loopFrom := make([]int, 2)
			for r, s := range j.ranks {
				loopFrom[r] = len(s.evs)
			}
			// Rank 1's host is late every third step: gaps to number.
			j.run(iters, func(rank, step int) int64 {
				if rank == 1 && step%3 == 0 {
					return 5 * ms
				}
				return 0
			})
			// byIter[r][k]: rank r's step ending at its k-th loop sync.
			byIter := make([]map[int]Step, 2)
			for r, s := range j.ranks {
				c := &collect{}
				e := newEngine(c, nil)
				e.SetDevice(s.pid, 0)
				feed(e, c, s.evs, s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
				byEnd := map[int64]Step{}
				seen := map[int64]bool{}
				for _, st := range c.steps {
					if st.PID != s.pid {
						t.Fatalf("rank %d's engine emitted a step of pid %d", r, st.PID)
					}
					if seen[st.Number] {
						t.Errorf("rank %d: step number %d emitted twice", r, st.Number)
					}
					seen[st.Number] = true
					byEnd[st.End] = st
				}
				// A gap carries the number of the step it lies in.
				byNum := map[int64]Step{}
				for _, st := range c.steps {
					byNum[st.Number] = st
				}
				if len(c.gaps) == 0 {
					t.Errorf("rank %d: no gaps", r)
				}
				for _, g := range c.gaps {
					mid := g.Start + g.Duration/2
					if st, ok := byNum[g.Step]; !ok || mid < st.Start || mid >= st.End {
						t.Errorf("rank %d: gap at %d carries step %d, which does not hold it", r, mid-t0, g.Step)
					}
				}
				byIter[r] = map[int]Step{}
				k := 0
				for _, ev := range s.evs[loopFrom[r]:] {
					if ev.Kind != event.KindSync {
						continue
					}
					k++
					if st, ok := byEnd[ev.End]; ok {
						byIter[r][k] = st
					}
				}
				if len(byIter[r]) < iters-3 {
					t.Errorf("rank %d: %d of %d iterations end a step", r, len(byIter[r]), iters)
				}
				// The warm-up before the loop is no iteration: a prologue
				// numbered below step 1, not a step that shifts the rest.
				for _, st := range c.steps {
					if st.End <= s.evs[loopFrom[r]].Start && st.Number > 0 {
						t.Errorf("rank %d: the setup before the loop is step %d", r, st.Number)
					}
				}
			}
			for k := 1; k <= iters; k++ {
				a, okA := byIter[0][k]
				b, okB := byIter[1][k]
				if okA && a.Number != int64(k) {
					t.Errorf("rank 0: iteration %d is step %d (window %v)", k, a.Number, a.Window)
				}
				if okB && b.Number != int64(k) {
					t.Errorf("rank 1: iteration %d is step %d (window %v)", k, b.Number, b.Window)
				}
				if okA && okB && a.Number != b.Number {
					t.Errorf("iteration %d: rank 0 numbers it %d, rank 1 %d", k, a.Number, b.Number)
				}
			}
		})
	}
}
