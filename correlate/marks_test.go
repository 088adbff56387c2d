package correlate

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// kernelFn launches a kernel of function fn. A function the tracer marked
// is emitted wherever its launch comes, as bpf/cuda.c does: amid a burst
// it flushes nothing and reports the launches not flushed yet, itself
// included; else it is the burst's first launch, which flushes.
func (s *gpuSim) kernelFn(dur int64, fn uint64, marked bool) {
	if !marked || s.lite {
		s.kernel(dur)
		return
	}
	s.t += 5 * us
	start := max(s.t, s.gpuFree)
	s.gpuFree = start + dur
	s.addBusy(start, s.gpuFree)
	prev := s.lastLaunch[s.tid]
	s.lastLaunch[s.tid] = s.t
	ev := event.Event{Kind: event.KindEnqueue, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
		CUDA: event.CULaunchKernel, Stream: s.stream, LastLaunch: prev, Mark: fn}
	if s.flushed[s.tid] && (prev == 0 || s.t-prev < ms) {
		s.pending[s.tid]++
		ev.Pending = s.pending[s.tid]
	} else {
		ev.Count = s.pending[s.tid] + 1
		s.pending[s.tid] = 0
		s.flushed[s.tid] = true
	}
	s.evs = append(s.evs, ev)
}

// benchLoop is a benchmark's loop: its input is on the device already, so
// it enqueues nothing but kernels: a forward of four layers of three
// functions each, a loss, the backward's functions (each layer's twice),
// an optimizer kernel, and every tenth iteration a metric's kernel and
// the loss read (the only sync). Marked holds the functions the tracer
// marked and markFrom the iteration from which it did. With copy, each
// iteration first copies a batch to the device. It returns the
// iterations' ends.
func benchLoop(s *gpuSim, iters, markFrom int, marked map[uint64]bool, copy bool) []int64 {
	const (
		fnLayer  = 0x1000 // + 0..2
		fnLoss   = 0x2000
		fnBwd    = 0x3000 // + 0..2
		fnOptim  = 0x4000
		fnMetric = 0x5000
	)
	var ends []int64
	for n := 0; n < iters; n++ {
		mark := func(fn uint64) bool { return n >= markFrom && marked[fn] }
		k := func(fn uint64) { s.kernelFn(150*us, fn, mark(fn)); s.t += 20 * us }
		if copy {
			s.copyAsync(200*us, s.stream)
		}
		for l := 0; l < 4; l++ {
			for f := uint64(0); f < 3; f++ {
				k(fnLayer + f)
			}
		}
		k(fnLoss)
		for l := 0; l < 4; l++ {
			for f := uint64(0); f < 3; f++ {
				k(fnBwd + f)
				k(fnBwd + f)
			}
		}
		k(fnOptim)
		if (n+1)%10 == 0 {
			k(fnMetric)
			s.sync()
		}
		ends = append(ends, s.t)
		s.t += 100 * us
	}
	return ends
}

// TestMarkedLaunchesClockSteps: a loop that enqueues only kernels and
// syncs every tenth iteration is counted by the launches of the functions
// the tracer marked, one of each rarity: the metric's (every tenth
// iteration), the loss's (once), a layer's (four times), a backward
// function's (eight times). Only the loss counts iterations; the layer's
// repeats alike at three of its four places, the metric's ten times more
// rarely is host code's choice. A loop that copies its batch keeps the
// copy's clock, marks or not.
func TestMarkedLaunchesClockSteps(t *testing.T) {
	all := map[uint64]bool{0x5000: true, 0x2000: true, 0x1001: true, 0x3002: true}
	frequent := map[uint64]bool{0x1001: true, 0x3002: true}
	for _, c := range []struct {
		name     string
		marked   map[uint64]bool
		markFrom int
		copy     bool
		probes   string
		min, max int // steps for 120 iterations
	}{
		{"marked from the start", all, 0, false, ProbesFull, 118, 120},
		// Marks come once the tracer has read the counts: the iterations
		// before are one window.
		{"marked from the 12th", all, 11, false, ProbesFull, 108, 110},
		// No function launched once an iteration is marked: the layer's,
		// four an iteration, clocks it.
		{"frequent marks only", frequent, 0, false, ProbesFull, 118, 120},
		{"copies, marked", all, 0, true, ProbesFull, 118, 120},
		// Without marks the loop repeats nothing but its syncs.
		{"unmarked", nil, 0, false, ProbesFull, 0, 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			s.lite = c.probes == ProbesLite
			ends := benchLoop(s, 120, c.markFrom, c.marked, c.copy)
			col := &collect{}
			e := newEngine(col, func(cfg *Config) {
				cfg.Probes = c.probes
				if os.Getenv("GT_DEBUG") != "" {
					cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
				}
			})
			feed(e, col, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
			n, windows := 0, 0
			for _, st := range col.steps {
				if st.Window {
					windows++
					continue
				}
				n++
			}
			t.Logf("%d steps, %d windows for 120 iterations (the last ended %.1f ms in)", n, windows, float64(ends[len(ends)-1]-t0)/1e6)
			if n < c.min || n > c.max {
				t.Errorf("%d steps for 120 iterations, want %d to %d", n, c.min, c.max)
			}
		})
	}
}

// TestMarkedLaunchesAccumulation: gradient accumulation (accumLoop's
// shape: four micro-batches of a copy, a forward on the feeder and a
// backward on the autograd thread, then clip_grad_norm_, a fused AdamW
// step and the loss read) with the functions the tracer would mark: the
// optimizer's (once an iteration), the loss's (once a micro-batch), a
// clip kernel's (six an iteration). Full counts the iterations.
func TestMarkedLaunchesAccumulation(t *testing.T) {
	marked := map[uint64]bool{0x4100: true, 0x2000: true, 0x4000: true}
	if os.Getenv("GT_NOMARK") != "" {
		marked = nil
	}
	const feeder, autograd = 100, 101
	s := newSim()
	copyOf := func(bytes uint64, dir event.CUDA) {
		s.t += 5 * us
		s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
			CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: bytes, CopyDir: dir, Pending: s.pending[s.tid]})
		start := max(s.t, s.gpuFree)
		s.gpuFree = start + 10*us
		s.addBusy(start, s.gpuFree)
	}
	k := func(fn uint64) { s.kernelFn(60*us, fn, marked[fn]); s.t += 15 * us }
	const iters, micro = 60, 4
	for n := 0; n < iters; n++ {
		for m := 0; m < micro; m++ {
			s.tid = feeder
			for i := 0; i < 3; i++ {
				copyOf(8<<10, event.CUMemcpyHtoD)
			}
			for i := 0; i < 39; i++ {
				k(0x1000 + uint64(i%3))
			}
			k(0x2000) // the loss
			t0 := s.t
			s.tid = autograd
			s.flushed[autograd] = false
			for i := 0; i < 85; i++ {
				k(0x3000 + uint64(i%3))
			}
			bwd := s.t - t0
			s.t = t0
			s.tid = feeder
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", FDKind: event.FDUnknown}, bwd)
		}
		for i := 0; i < 6; i++ {
			k(0x4000) // clip_grad_norm_'s foreach kernels
		}
		k(0x4100) // fused AdamW
		copyOf(4, event.CUMemcpyDtoH)
		s.sync()
		s.t += 300 * us
	}
	col := &collect{}
	e := newEngine(col, func(cfg *Config) {
		cfg.Probes = ProbesFull
		if os.Getenv("GT_DEBUG") != "" {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	})
	feed(e, col, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
	n, windows := 0, 0
	for _, st := range col.steps {
		if st.Window {
			windows++
			continue
		}
		n++
	}
	t.Logf("%d steps, %d windows for %d iterations", n, windows, iters)
	if n != iters {
		t.Errorf("%d steps for %d iterations", n, iters)
	}
}

// TestDataPickedKernels: a loop whose data picks its kernels (a router,
// buckets of sequence lengths), as testdata/simgpu/pyroute.py runs on the
// simulated GPU: per iteration a batch copy, 3 to 24 kernels, each but the
// last of one of five functions, the last of its own, the loss read with
// a sync; every 7th iteration sleeps 20 ms. The tracer marks all six
// functions from the 20th iteration on, a few at a time or all at once.
// The launch counts between two batch copies spread over an eightfold
// range: no count is the step's, which made the copy's clock fail its
// launch-count match and coarsen to two or three iterations a step, whose
// sums spread less; and an iteration of 24 marked launches after a few of
// 3 held many more tokens than the steps before it, which made the copy's
// clock look stopped. Every iteration must end exactly one step.
func TestDataPickedKernels(t *testing.T) {
	// The iteration from which each function is marked: the tracer marks
	// one rarity at a time as its counts settle, or all six at once.
	apart := map[uint64]int{0x2000: 20, 0x1003: 20, 0x1000: 28, 0x1004: 36, 0x1001: 44, 0x1002: 52}
	together := map[uint64]int{0x2000: 20, 0x1003: 20, 0x1000: 20, 0x1004: 20, 0x1001: 20, 0x1002: 20}
	for _, c := range []struct {
		marks    string
		markFrom map[uint64]int
		seed     uint64
	}{
		{"apart", apart, 1}, {"apart", apart, 2}, {"apart", apart, 3},
		{"together", together, 5}, {"together", together, 6}, {"together", together, 9},
	} {
		markFrom, seed := c.markFrom, c.seed
		t.Run(fmt.Sprintf("marked %s, seed %d", c.marks, seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			s := newSim()
			const iters = 300
			var ends []int64
			// The routed functions' kernels last 120 µs to 1.5 ms, the last
			// one 60 µs: the host, 15 µs a launch, runs ahead of the GPU
			// within an iteration.
			dur := map[uint64]int64{0x1000: 120 * us, 0x1001: 300 * us, 0x1002: 450 * us, 0x1003: 800 * us, 0x1004: 1500 * us, 0x2000: 60 * us}
			for n := 0; n < iters; n++ {
				k := func(fn uint64) {
					from, ok := markFrom[fn]
					s.kernelFn(dur[fn], fn, ok && n >= from)
					s.t += 15 * us
				}
				if n%7 == 3 {
					s.t += 20 * ms // a synchronous logger
				}
				s.copyAsync(100*us, s.stream)
				kn := 3 + rng.IntN(22)
				for i := 0; i < kn-1; i++ {
					k(0x1000 + uint64(rng.IntN(5)))
				}
				k(0x2000)
				s.sync()
				ends = append(ends, s.t)
				s.t += 200 * us
			}
			col := &collect{}
			e := newEngine(col, func(cfg *Config) {
				cfg.Probes = ProbesFull
				if os.Getenv("GT_DEBUG") != "" {
					cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
				}
			})
			feed(e, col, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
			var stepEnds []int64
			windows := 0
			for _, st := range col.steps {
				if st.Window {
					windows++
				}
				stepEnds = append(stepEnds, st.End)
			}
			slices.Sort(stepEnds)
			exact := 0
			for i, end := range ends {
				from := t0
				if i > 0 {
					from = ends[i-1]
				}
				// The step ends at the iteration's sync (give or take its
				// return), before the next batch's copy.
				a, _ := slices.BinarySearch(stepEnds, from+us)
				b, _ := slices.BinarySearch(stepEnds, end+us)
				if b-a == 1 {
					exact++
				}
			}
			t.Logf("%d steps (%d windows) for %d iterations, %d ending exactly one", len(col.steps), windows, iters, exact)
			if len(col.steps) != iters || windows > 0 || exact < iters-1 {
				t.Errorf("%d steps, %d windows, %d of %d iterations ending exactly one step; want every iteration one step",
					len(col.steps), windows, exact, iters)
			}
		})
	}
}

// TestMarkedBurstIsNoClock: before its loop a PyTorch job launches one
// kernel per parameter back to back (initialising the model; an
// optimizer's first step creating its state), and the tracer may mark that
// function while it runs: it repeats alike, but with nothing launched
// between, which no iteration does. On the H100 such a burst of 44 became
// 44 empty steps, the clock was lost right after and the loop's first
// iterations went to a window (122 steps for 70 iterations). Here the
// burst's function is marked and launched by the loop too (its kernel
// zeroes the gradients once an iteration); the loop copies its batch.
func TestMarkedBurstIsNoClock(t *testing.T) {
	const fnInit = 0x6000
	for _, c := range []struct {
		name string
		copy bool
	}{{"copies", true}, {"kernels only", false}} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			for p := 0; p < 44; p++ {
				s.kernelFn(20*us, fnInit, true)
			}
			s.sync()
			s.t += 5 * ms
			marked := map[uint64]bool{0x5000: true, 0x2000: true, 0x1001: true, 0x3002: true}
			ends := benchLoop(s, 120, 0, marked, c.copy)
			col := &collect{}
			e := newEngine(col, func(cfg *Config) {
				cfg.Probes = ProbesFull
				if os.Getenv("GT_DEBUG") != "" {
					cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
				}
			})
			feed(e, col, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
			n, short := 0, 0
			for _, st := range col.steps {
				if st.Window {
					continue
				}
				n++
				if st.End-st.Start < 500*us {
					short++
				}
			}
			t.Logf("%d steps (%d under 0.5 ms) for 120 iterations (the last ended %.1f ms in)", n, short, float64(ends[len(ends)-1]-t0)/1e6)
			if n < 117 || n > 120 || short > 0 {
				t.Errorf("%d steps, %d of them under 0.5 ms, for 120 iterations of 6 ms: want 117 to 120, none that short", n, short)
			}
		})
	}
}
