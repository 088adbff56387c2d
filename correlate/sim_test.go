package correlate

import (
	"sort"
	"time"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

const (
	us = int64(time.Microsecond)
	ms = int64(time.Millisecond)
	t0 = int64(1_700_000_000) * int64(time.Second)
)

// gpuSim is a tiny simulated trainer: host threads launch kernels onto one
// virtual GPU timeline, syncs wait for it, and the ground truth (busy
// intervals) yields the GPU windows and the expected idle.
type gpuSim struct {
	t       int64
	pid     uint32
	tid     uint32
	gpuFree int64
	busy    []interval.Span
	evs     []event.Event
	// per thread: launches since the last flushed event, and whether the
	// first launch after a sync/blocking event was flushed.
	pending map[uint32]uint64
	flushed map[uint32]bool
	// lastLaunch: each thread's latest launch (Event.LastLaunch).
	lastLaunch map[uint32]int64
	stream     uint64
	lite       bool
}

func newSim() *gpuSim {
	return &gpuSim{t: t0, pid: 100, tid: 100, pending: map[uint32]uint64{}, flushed: map[uint32]bool{},
		lastLaunch: map[uint32]int64{}, stream: 1}
}

func (s *gpuSim) addBusy(a, b int64) {
	if n := len(s.busy); n > 0 && s.busy[n-1].B >= a {
		s.busy[n-1].B = max(s.busy[n-1].B, b)
		return
	}
	s.busy = append(s.busy, interval.Span{A: a, B: b})
}

// kernel launches one kernel of dur GPU time (5 µs of host time).
func (s *gpuSim) kernel(dur int64) {
	s.t += 5 * us
	start := max(s.t, s.gpuFree)
	s.gpuFree = start + dur
	s.addBusy(start, s.gpuFree)
	prev := s.lastLaunch[s.tid]
	if !s.lite {
		s.lastLaunch[s.tid] = s.t
	}
	// As the probe does: the first launch after a sync or a blocking event,
	// and one that follows the thread's previous launch after a pause of
	// 1 ms (it may have drained the queue meanwhile), are emitted.
	if !s.flushed[s.tid] || (prev != 0 && s.t-prev >= ms) {
		if !s.lite {
			s.evs = append(s.evs, event.Event{Kind: event.KindEnqueue, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
				CUDA: event.CULaunchKernel, Stream: s.stream, Count: s.pending[s.tid] + 1, LastLaunch: prev})
		}
		s.pending[s.tid] = 0
		s.flushed[s.tid] = true
		return
	}
	s.pending[s.tid]++
}

// launches runs n kernels of kdur each with cpu host time between them.
func (s *gpuSim) launches(n int, kdur, cpu int64) {
	for i := 0; i < n; i++ {
		s.kernel(kdur)
		s.t += cpu
	}
}

func (s *gpuSim) collective(op event.NCCLOp, dur int64) {
	s.t += 5 * us
	start := max(s.t, s.gpuFree)
	s.gpuFree = start + dur
	s.addBusy(start, s.gpuFree)
	s.evs = append(s.evs, event.Event{Kind: event.KindCollective, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
		Op: op, Bytes: 64 << 20, Comm: 0xc0ffee, Stream: s.stream, PeerRank: -1})
	s.flushed[s.tid] = true
}

func (s *gpuSim) copyAsync(dur int64, stream uint64) {
	s.t += 5 * us
	start := max(s.t, s.gpuFree)
	s.gpuFree = start + dur
	s.addBusy(start, s.gpuFree)
	s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
		CUDA: event.CUMemcpyAsync, Stream: stream, Bytes: 8 << 20, LastLaunch: s.lastLaunch[s.tid], Pending: s.pending[s.tid]})
}

// sync waits for the GPU (plus 10 µs of call overhead).
func (s *gpuSim) sync() {
	start := s.t
	end := max(start+10*us, s.gpuFree+5*us)
	s.evs = append(s.evs, event.Event{Kind: event.KindSync, PID: s.pid, TID: s.tid, Start: start, End: end,
		CUDA: event.CUStreamSynchronize, Stream: s.stream, Count: s.pending[s.tid], LastLaunch: s.lastLaunch[s.tid]})
	s.pending[s.tid] = 0
	s.flushed[s.tid] = false
	s.t = end
}

// block records a blocking host interval of dur on the current thread.
func (s *gpuSim) block(ev event.Event, dur int64) {
	ev.PID, ev.TID = s.pid, s.tid
	ev.Start, ev.End = s.t, s.t+dur
	s.evs = append(s.evs, ev)
	s.t += dur
	s.flushed[s.tid] = false
}

// step is one training step: k kernels of kdur, then a sync.
func (s *gpuSim) step(k int, kdur, cpu int64) {
	s.launches(k, kdur, cpu)
	s.sync()
}

// idle is the true GPU idle time in [a,b).
func (s *gpuSim) idle(a, b int64) int64 {
	return (b - a) - interval.Overlap(s.busy, a, b)
}

// windows returns NVML-like windows of period p covering [from,to).
func (s *gpuSim) windows(from, to, p int64, src event.WindowSource, sm func(a, b int64) float64) []event.GPUWindow {
	var out []event.GPUWindow
	for a := from; a < to; a += p {
		b := a + p
		w := event.GPUWindow{Start: a, End: b, IdleFraction: float64(s.idle(a, b)) / float64(p), Source: src,
			SMActivity: -1, TensorActivity: -1}
		if sm != nil {
			w.SMActivity = sm(a, b)
		}
		out = append(out, w)
	}
	return out
}

// collect is a Sink that also records when each result was emitted.
type collect struct {
	gaps  []Gap
	steps []Step
	gapAt []int64
	now   int64
}

func (c *collect) Gap(g Gap) {
	c.gaps = append(c.gaps, g)
	c.gapAt = append(c.gapAt, c.now)
}

func (c *collect) Step(s StepResult) { c.steps = append(c.steps, s.Step) }

// feed drives e like the live sidecar: events become visible at their end
// (plus delay), windows at their end + winLate, Advance every tick.
func feed(e *Engine, c *collect, evs []event.Event, wins []event.GPUWindow, until, tick, winLate int64) Summary {
	evs = append([]event.Event(nil), evs...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].End < evs[j].End })
	wins = append([]event.GPUWindow(nil), wins...)
	sort.SliceStable(wins, func(i, j int) bool { return wins[i].End < wins[j].End })
	start := t0
	if len(evs) > 0 && evs[0].Start < start {
		start = evs[0].Start
	}
	i, j := 0, 0
	for now := start; now <= until; now += tick {
		c.now = now
		for i < len(evs) && evs[i].End <= now {
			e.Event(evs[i])
			i++
		}
		for j < len(wins) && wins[j].End+winLate <= now {
			e.Window(wins[j])
			j++
		}
		e.Advance(now)
	}
	c.now = until
	for ; i < len(evs); i++ {
		e.Event(evs[i])
	}
	for ; j < len(wins); j++ {
		e.Window(wins[j])
	}
	return e.Close(until)
}

func bigGaps(gs []Gap) []Gap {
	var out []Gap
	for _, g := range gs {
		if g.Duration >= ms {
			out = append(out, g)
		}
	}
	return out
}

func near(got, want, tol int64) bool {
	d := got - want
	if d < 0 {
		d = -d
	}
	return d <= tol
}
