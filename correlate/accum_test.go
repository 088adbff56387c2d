package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// accumLoop simulates a PyTorch loop on two threads: the feeder copies a
// batch of three tensors of one size, launches the forward, then waits
// (a futex) while the autograd thread launches the backward, which
// moves nine gradients on the device in one burst. With accumulation, micro micro-batches
// make an iteration and only the last is followed by the optimizer's
// kernels and the loss read; without (micro 1, logEvery > 1) every
// iteration runs the optimizer and the loss is read every logEvery-th.
// Launches reach the engine as the tracer flushes them: at a sync, or at
// a thread's first launch after it blocked. It returns the iterations'
// ends and the time the first ended.
func accumLoop(s *gpuSim, iters, micro, logEvery int) []int64 {
	const feeder, autograd = 100, 101
	copyOf := func(bytes uint64, dir event.CUDA) {
		s.t += 5 * us
		s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
			CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: bytes, CopyDir: dir})
		start := max(s.t, s.gpuFree)
		s.gpuFree = start + 10*us
		s.addBusy(start, s.gpuFree)
	}
	futex := func(d int64) {
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", FDKind: event.FDUnknown}, d)
	}
	var ends []int64
	for n := 0; n < iters; n++ {
		for k := 0; k < micro; k++ {
			s.tid = feeder
			for i := 0; i < 3; i++ {
				copyOf(8<<10, event.CUMemcpyHtoD) // input ids, mask, labels
			}
			s.launches(40, 60*us, 15*us) // the forward
			t := s.t
			s.tid = autograd
			s.flushed[autograd] = false // it woke for the backward
			s.launches(60, 60*us, 15*us)
			for l := 0; l < 9; l++ {
				copyOf(768<<10, event.CUDANone) // gradients moved on the device
			}
			s.launches(25, 60*us, 15*us)
			bwd := s.t - t
			s.t = t
			s.tid = feeder
			futex(bwd) // waiting for the backward
		}
		s.tid = feeder
		s.launches(12, 200*us, 15*us) // clip_grad_norm_ and a fused AdamW step
		if (n+1)%logEvery == 0 {
			copyOf(4, event.CUMemcpyDtoH) // loss.item()
			s.sync()
			if s.lite {
				s.evs[len(s.evs)-1].Count = 0
			}
		}
		ends = append(ends, s.t)
		s.t += 300 * us // the next batch
	}
	return ends
}

// TestAccumulationSteps: gradient accumulation runs 4 micro-batches an
// iteration, each a copy of its batch's three tensors, then one optimizer
// step and one loss read. The batch copy clocks the micro-batches; where
// launches are seen, the micro-batch holding the sync launches clearly
// more (the optimizer's kernels, which also flush the forward's last
// launches into it), and full counts the loop's iterations. Lite, blind to
// launches, cannot tell this loop from one that reads its loss every 4th
// iteration (below) and counts the micro-batches; auto learns the grouping
// in its warm-up window and keeps it in its lite stretches. A loop that
// copies a batch every iteration and reads its loss every 4th is counted
// per iteration under every probe set.
func TestAccumulationSteps(t *testing.T) {
	for _, c := range []struct {
		name            string
		micro, logEvery int
		probes          string
		perIter         float64 // steps per iteration
	}{
		{"accum-full", 4, 1, ProbesFull, 1},
		{"accum-auto", 4, 1, ProbesAuto, 1},
		{"accum-lite", 4, 1, ProbesLite, 4},
		{"log4-full", 1, 4, ProbesFull, 1},
		{"log4-auto", 1, 4, ProbesAuto, 1},
		{"log4-lite", 1, 4, ProbesLite, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			s.lite = c.probes == ProbesLite
			iters := 60
			if c.micro == 1 {
				iters = 160
			}
			ends := accumLoop(s, iters, c.micro, c.logEvery)
			n, windows := simSteps(s, c.probes, ends[iters/4])
			want := int(c.perIter * float64(iters))
			t.Logf("%d steps (%d fixed windows) for %d iterations", n, windows, iters)
			if n != want || windows > 0 {
				t.Errorf("%d steps (%d fixed windows) for %d iterations, want %d", n, windows, iters, want)
			}
		})
	}
}

// prefetchLoop simulates a loop on one thread that double-buffers its
// batches: each iteration prepares on the host (1–3 ms, so its first
// launch is flushed), copies the next batch on a copy stream, launches 30
// kernels and, every logEvery-th iteration, reads the loss (a sync). With
// micro > 1 an iteration is micro such copies and forwards, then the
// optimizer's 8 kernels. The sync flushes the iteration's tail, which the
// next iteration's first launch would otherwise have flushed: counted by
// flush, the step holding the sync launches twice the others and the next
// one next to none. It returns the iterations' ends.
func prefetchLoop(s *gpuSim, iters, micro, logEvery int) []int64 {
	var ends []int64
	for n := 0; n < iters; n++ {
		for k := 0; k < micro; k++ {
			s.t += int64(1+(n*7+k)%3) * ms // the batch, prepared on the host
			s.copyAsync(50*us, 2)
			s.launches(30, 120*us, 20*us)
		}
		if micro > 1 {
			s.launches(8, 60*us, 20*us) // the optimizer
		}
		if (n+1)%logEvery == 0 {
			s.sync()
			if s.lite {
				s.evs[len(s.evs)-1].Count = 0
			}
		}
		ends = append(ends, s.t)
	}
	return ends
}

// TestPrefetchLogEvery: a loop on one thread that reads its loss only
// every 10th iteration is counted per iteration, under every probe set:
// the step holding the sync launches twice the others counted by flush
// (the sync flushes the tail that the next step's first launch would
// have), not by position. An accumulation loop on one thread (4
// micro-batches, the optimizer's 8 kernels and the loss read once an
// iteration) is still counted per iteration where launches are seen.
// The previous engine counted the first loop in steps of 10 under full
// (16 steps for 160 iterations).
func TestPrefetchLogEvery(t *testing.T) {
	for _, c := range []struct {
		name            string
		micro, logEvery int
		probes          string
		perIter         float64
	}{
		{"log10-full", 1, 10, ProbesFull, 1},
		{"log10-auto", 1, 10, ProbesAuto, 1},
		{"log10-lite", 1, 10, ProbesLite, 1},
		{"accum-full", 4, 1, ProbesFull, 1},
		{"accum-lite", 4, 1, ProbesLite, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			s.lite = c.probes == ProbesLite
			iters := 160
			if c.micro > 1 {
				iters = 60
			}
			ends := prefetchLoop(s, iters, c.micro, c.logEvery)
			n, windows := simSteps(s, c.probes, ends[iters/4])
			want := int(c.perIter * float64(iters))
			t.Logf("%d steps (%d fixed windows) for %d iterations", n, windows, iters)
			if d := n - want; d*50 > want || -d*50 > want || windows > 0 {
				t.Errorf("%d steps (%d fixed windows) for %d iterations, want %d", n, windows, iters, want)
			}
		})
	}
}
