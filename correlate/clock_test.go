package correlate

import (
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestClockCountsStepsDespiteExtraSyncs: each step copies its batch, runs
// kernels with 0–3 scalar reads (a tiny copy and a sync) at varying points,
// then ends with its own sync; an io.read stall comes before every 5th
// step. The syncs per step vary, so only the work clock counts the steps;
// every step must end at its last sync and each stall land in its step.
func TestClockCountsStepsDespiteExtraSyncs(t *testing.T) {
	fullAndLite(t, func(t *testing.T, s *gpuSim) {
		var ends []int64
		stallStep := map[int64]bool{}
		scalar := func() {
			s.t += 5 * us
			s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
				CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: 4})
			s.sync()
		}
		const steps = 80
		for n := int64(1); n <= steps; n++ {
			if n%5 == 0 {
				stallStep[n] = true
				readStall(s, 20*ms)
			}
			s.copyAsync(100*us, s.stream)
			extra := (n*n*7 + n/3) % 4
			for i := int64(0); i < 10; i++ {
				s.kernel(300 * us)
				s.t += 20 * us
				if i < extra && (i*3+n)%2 == 0 || i == 9 && extra == 3 {
					scalar()
				}
			}
			s.sync()
			ends = append(ends, s.t)
			s.t += 300 * us // the next batch
		}
		wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
		c := &collect{}
		feed(newEngine(c, func(cfg *Config) {
			if s.lite {
				cfg.Probes = ProbesLite
			}
		}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
		byEnd := map[int64]int64{}
		for i, e := range ends {
			byEnd[e] = int64(i + 1)
		}
		matched, window := 0, 0
		stepOfEnd := map[int64]int64{} // engine step number → trainer step
		for _, st := range c.steps {
			if st.Window {
				window++
				continue
			}
			n, ok := byEnd[st.End]
			if !ok {
				t.Errorf("step %d [%d, %d] does not end at a step's last sync", st.Number, st.Start-t0, st.End-t0)
				continue
			}
			matched++
			stepOfEnd[st.Number] = n
		}
		if matched < steps-12 {
			t.Errorf("%d of %d steps found (%d windows)", matched, steps, window)
		}
		reads := 0
		for _, g := range bigGaps(c.gaps) {
			if g.Cause != CauseIORead {
				t.Errorf("unexpected gap %+v", g)
				continue
			}
			if n, ok := stepOfEnd[g.Step]; ok {
				reads++
				if !stallStep[n] {
					t.Errorf("io.read stall reported in step %d (trainer step %d)", g.Step, n)
				}
			}
		}
		if reads < len(stallStep)-3 {
			t.Errorf("%d io.read stalls placed in detected steps, want about %d", reads, len(stallStep))
		}
	})
}

// TestLiteLaunchesAndSyncsOnly: in lite a trainer that only launches and
// synchronizes (no async copies, no collectives; a Python loop driving the
// driver through ctypes) is seen to feed the GPU by its syncs alone: its
// stalls are gaps and its steps are counted.
func TestLiteLaunchesAndSyncsOnly(t *testing.T) {
	s := newSim()
	s.lite = true
	var stalls int
	for n := 1; n <= 40; n++ {
		if n%4 == 0 {
			readStall(s, 20*ms)
			stalls++
		}
		s.step(8, 500*us, 20*us)
	}
	c := &collect{}
	feed(newEngine(c, func(cfg *Config) { cfg.Probes = ProbesLite }), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
	var reads int
	for _, g := range bigGaps(c.gaps) {
		if g.Cause == CauseIORead {
			reads++
		}
	}
	if reads < stalls-2 || len(c.steps) < 30 {
		t.Errorf("lite: %d io.read gaps for %d stalls, %d steps for 40", reads, stalls, len(c.steps))
	}
}

// TestClockLaunchesCountedLate: a data-parallel step launches 8 kernels,
// copies the next batch and all-reduces, then syncs. The tracer emits the
// first launch after a blocking call and counts the rest until the
// thread's next sync, which comes after the copy that clocks the steps: 7
// of a step's launches are counted in the next one. On a busy host a
// preemption mid-step re-arms the event, so that a step counts 15 launches
// and the next 1, or 11 and 5. Every step must still be one iteration,
// ending at its sync, and no fixed window replace them.
func TestClockLaunchesCountedLate(t *testing.T) {
	s := newSim()
	s.stream = 0
	const steps = 80
	var ends []int64
	for n := int64(1); n <= steps; n++ {
		// Once the loop runs, preempted before the last launch in two
		// steps of five, irregularly: all of the step's launches are
		// counted before the copy, and none after it.
		at := 8
		if n > 20 && (n*n*7+n/3)%5 < 2 {
			at = 7
		}
		for i := 0; i < 8; i++ {
			if i == at && i > 0 {
				s.block(event.Event{Kind: event.KindRunqueue}, 300*us)
			}
			s.kernel(200 * us)
			s.t += 20 * us
		}
		s.copyAsync(50*us, 0)
		s.collective(event.NCCLAllReduce, 300*us)
		s.sync()
		ends = append(ends, s.t)
		s.t += 100 * us
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	byEnd := map[int64]bool{}
	for _, e := range ends {
		byEnd[e] = true
	}
	matched := 0
	for _, st := range c.steps {
		if st.Window {
			t.Errorf("step %d [%d, %d] is a fixed window", st.Number, st.Start-t0, st.End-t0)
			continue
		}
		if !byEnd[st.End] {
			t.Errorf("step %d [%d, %d] does not end at an iteration's sync", st.Number, st.Start-t0, st.End-t0)
			continue
		}
		matched++
	}
	// The first iterations pass before the clock is found; from then on
	// every one is a step.
	if matched < steps-8 || len(c.steps) > steps+1 {
		t.Errorf("%d steps, %d ending at an iteration's sync, for %d iterations", len(c.steps), matched, steps)
	}
}

// TestClockFirstIterationBurst: the backward copies each layer's gradient
// (twelve 4 MiB copies from the autograd thread, alike, with nothing else
// enqueued between them) before the iteration's loss read; the first
// iteration compiles for 400 ms after its batch copy, the others take
// about 10 ms. The per-layer copies repeat alike before any sync, yet are
// slices of an iteration; and the first iteration's compile, one step of
// the batch copy's, is no sign that its steps do not share the work.
// Under full and lite every iteration is one step, from the first on,
// and none is cut in pieces.
func TestClockFirstIterationBurst(t *testing.T) {
	fullAndLite(t, func(t *testing.T, s *gpuSim) {
		copyOf := func(bytes uint64) {
			s.t += 5 * us
			s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
				CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: bytes})
			start := max(s.t, s.gpuFree)
			s.gpuFree = start + 20*us
			s.addBusy(start, s.gpuFree)
		}
		const iters = 60
		var starts, ends []int64
		for n := 0; n < iters; n++ {
			starts = append(starts, s.t)
			copyOf(16 << 10) // the batch
			s.launches(20, 200*us, 20*us)
			if n == 0 {
				s.t += 400 * ms // compiling
			}
			s.tid = 101 // the autograd thread
			for l := 0; l < 12; l++ {
				s.launches(3, 100*us, 20*us)
				copyOf(4 << 20)
			}
			s.tid = 100
			copyOf(4) // the loss read
			s.sync()
			if n%3 == 0 {
				copyOf(4) // a metric logged every third iteration
				s.sync()
			}
			ends = append(ends, s.t)
			s.t += 2 * ms // the next batch
		}
		c := &collect{}
		feed(newEngine(c, func(cfg *Config) {
			if s.lite {
				cfg.Probes = ProbesLite
			}
		}), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
		var stepEnds []int64
		for _, st := range c.steps {
			if !st.Window {
				stepEnds = append(stepEnds, st.End)
			}
		}
		t.Logf("%d steps (%d fixed windows) for %d iterations", len(stepEnds), len(c.steps)-len(stepEnds), iters)
		// The first iteration, compiling, is one: its batch copy has
		// nothing before it, and its work comes after.
		if len(stepEnds) != iters || len(c.steps) != iters {
			t.Errorf("%d steps (%d fixed windows) for %d iterations", len(stepEnds), len(c.steps)-len(stepEnds), iters)
		}
		exact := 0
		for i := range starts {
			next := ends[i] + 1
			if i+1 < len(starts) {
				next = starts[i+1]
			}
			k := 0
			for _, e := range stepEnds {
				if e > starts[i] && e < next {
					k++
				}
			}
			if k == 1 {
				exact++
			}
		}
		if exact < iters-5 {
			t.Errorf("%d of %d iterations hold exactly one step end", exact, iters)
		}
	})
}

// TestClockLoopWithoutSyncs: a loop that never synchronises (no loss
// read: the host runs ahead until a stall) copies its batch and launches
// its kernels every iteration. Nothing bounds its first iteration but the
// batch copy that starts it, which it repeats from there: the clock counts
// its iterations from the first one under full and lite, without waiting
// for a sync that never comes.
func TestClockLoopWithoutSyncs(t *testing.T) {
	fullAndLite(t, func(t *testing.T, s *gpuSim) {
		const iters = 300
		var starts []int64
		for n := 0; n < iters; n++ {
			starts = append(starts, s.t)
			s.copyAsync(50*us, s.stream)
			s.launches(20, 200*us, 30*us)
			readStall(s, 2*ms)
		}
		c := &collect{}
		feed(newEngine(c, func(cfg *Config) {
			if s.lite {
				cfg.Probes = ProbesLite
			}
		}), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
		n, first := 0, int64(-1)
		for _, st := range c.steps {
			if st.Window {
				continue
			}
			if first < 0 {
				first = st.Start
			}
			n++
		}
		t.Logf("%d steps (%d fixed windows) for %d iterations, the first from %.1f ms", n, len(c.steps)-n, iters, float64(first-t0)/1e6)
		if first < 0 || first > starts[5] {
			t.Errorf("no step begins by iteration 6")
		}
		if n != iters {
			t.Errorf("%d steps for %d iterations", n, iters)
		}
	})
}

// fullAndLite runs f as subtests "full" and "lite", each on a fresh
// simulated job whose probe set is that one.
func fullAndLite(t *testing.T, f func(t *testing.T, s *gpuSim)) {
	for _, lite := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "lite"}[lite]
		t.Run(name, func(t *testing.T) {
			s := newSim()
			s.lite = lite
			f(t, s)
		})
	}
}

// TestClockCheckpointCopies: every tenth iteration ends with a checkpoint
// (torch.save of a CUDA state_dict): per tensor a copy to the host, a sync
// and the host serializing it, then a write and an fsync. Two of its
// tensors are the size of the batch, which every iteration copies to the
// device on the same stream: a copy to the host is not the batch's copy,
// so no checkpoint adds steps, and its copies never make the clock lose
// the loop. The first iteration is a step too.
func TestClockCheckpointCopies(t *testing.T) {
	fullAndLite(t, func(t *testing.T, s *gpuSim) {
		copyOf := func(bytes uint64, dir event.CUDA, dur int64) {
			s.t += 5 * us
			s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
				CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: bytes, CopyDir: dir})
			start := max(s.t, s.gpuFree)
			s.gpuFree = start + dur
			s.addBusy(start, s.gpuFree)
		}
		const iters = 80
		sizes := []uint64{3, 2, 4, 1, 1, 1, 3, 1, 2, 1, 1, 4}
		var saves [][2]int64
		for n := 1; n <= iters; n++ {
			copyOf(2<<20, event.CUMemcpyHtoD, 100*us) // the batch
			s.launches(30, 1300*us, 20*us)
			copyOf(4, event.CUMemcpyDtoH, 2*us) // the loss read
			s.sync()
			if n%10 == 0 {
				saves = append(saves, [2]int64{s.t, 0})
				for _, mb := range sizes {
					copyOf(mb<<20, event.CUMemcpyDtoH, int64(mb)*100*us)
					s.sync()
					s.t += 3 * ms // crc32 and the zip entry
				}
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFsync, Name: "fsync", FDKind: event.FDFile, Path: "/ckpt/evckpt.pt"}, 15*ms)
				saves[len(saves)-1][1] = s.t
			}
			s.t += 200 * us // the next batch
		}
		c := &collect{}
		feed(newEngine(c, func(cfg *Config) {
			if s.lite {
				cfg.Probes = ProbesLite
			}
		}), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
		n := 0
		for _, st := range c.steps {
			if !st.Window {
				n++
			}
		}
		if n != iters || len(c.steps) != iters {
			t.Errorf("%d steps (%d fixed windows) for %d iterations", n, len(c.steps)-n, iters)
		}
		// A save is one host operation between two iterations: no step
		// ends inside it (at one of its tensors' syncs). Lite cannot tell
		// a tensor's sync that waited for its copy from the step's own
		// read, and ends the step at the last of them.
		for _, st := range c.steps {
			if s.lite {
				break
			}
			for _, sv := range saves {
				if st.End > sv[0]+ms && st.End < sv[1]-ms {
					t.Errorf("step %d ends %.1f ms into a %.1f ms save", st.Number, float64(st.End-sv[0])/1e6,
						float64(sv[1]-sv[0])/1e6)
				}
			}
		}
	})
}

// syncCopy is a synchronous copy (cuMemcpyHtoD / cuMemcpyDtoH on the
// legacy stream): it waits for the work queued before it, then copies for
// dur with the host in the call.
func (s *gpuSim) syncCopy(dir event.CUDA, bytes uint64, dur int64) {
	s.t += 5 * us
	start := s.t
	from := max(s.t, s.gpuFree)
	s.gpuFree = from + dur
	s.addBusy(from, s.gpuFree)
	end := s.gpuFree + 5*us
	s.evs = append(s.evs, event.Event{Kind: event.KindMemcpy, PID: s.pid, TID: s.tid, Start: start, End: end,
		CUDA: dir, CopyDir: dir, Bytes: bytes, Count: s.pending[s.tid], LastLaunch: s.lastLaunch[s.tid]})
	s.pending[s.tid] = 0
	s.flushed[s.tid] = false
	s.t = end
}

// TestClockSyncCopiesAndEvaluation: a loop written against the driver API
// copies its batch with cuMemcpyHtoD (synchronous, from pageable memory),
// runs 27 kernels, reads its loss with cuMemcpyDtoH and every fifth
// iteration a metric after cuCtxSynchronize; every E iterations it
// evaluates N batches of another size (a copy, 8 kernels, a read each).
// The batch copy clocks the steps though it is no async copy, and lite,
// which sees no launch and so a drained queue at every read, takes the
// loss reads for the syncs they are. An evaluation pauses the loop's clock:
// it must not take over (its batches would be steps, and the loop's first
// iterations after it would be lost until the clock switched back).
func TestClockSyncCopiesAndEvaluation(t *testing.T) {
	for _, c := range []struct {
		name        string
		every, nval int
	}{
		{"no evaluation", 0, 0},
		{"30 batches every 50 iterations", 50, 30},
		{"60 batches every 40 iterations", 40, 60},
	} {
		t.Run(c.name, func(t *testing.T) {
			fullAndLite(t, func(t *testing.T, s *gpuSim) {
				const iters = 300
				var ends []int64
				for n := 0; n < iters; n++ {
					if n%9 == 4 {
						readStall(s, 10*ms)
					}
					s.syncCopy(event.CUMemcpyHtoD, 4<<20, 300*us)
					for range 27 {
						s.kernel(250 * us)
						s.t += 15 * us
					}
					s.syncCopy(event.CUMemcpyDtoH, 4, 5*us)
					if n%5 == 2 {
						s.sync()
						s.syncCopy(event.CUMemcpyDtoH, 8, 5*us)
					}
					if c.every > 0 && n%c.every == c.every-1 {
						for range c.nval {
							s.syncCopy(event.CUMemcpyHtoD, 1<<20, 80*us)
							for range 8 {
								s.kernel(250 * us)
								s.t += 15 * us
							}
							s.syncCopy(event.CUMemcpyDtoH, 4, 5*us)
						}
					}
					ends = append(ends, s.t)
					s.t += 200 * us
				}
				col := &collect{}
				feed(newEngine(col, func(cfg *Config) {
					if s.lite {
						cfg.Probes = ProbesLite
					}
				}), col, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
				var stepEnds []int64
				windows := 0
				for _, st := range col.steps {
					if st.Window {
						windows++
						continue
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
					a, _ := slices.BinarySearch(stepEnds, from+us)
					b, _ := slices.BinarySearch(stepEnds, end+us)
					if b-a == 1 {
						exact++
					}
				}
				t.Logf("%d steps and %d fixed windows for %d iterations, %d ending exactly one", len(stepEnds), windows, iters, exact)
				if d := len(stepEnds) - iters; d > iters/50 || -d > iters/50 || exact < iters*9/10 {
					t.Errorf("%d steps for %d iterations (%d ending exactly one); want within 2%% and nine in ten exact", len(stepEnds), iters, exact)
				}
			})
		})
	}
}
