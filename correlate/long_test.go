package correlate

import (
	"runtime"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// dayStream generates a steady trainer directly into an Engine, without
// keeping the events: 10 steps/s, a read stall every 37 steps, a loader
// wait every 53, syscalls on a second thread, 100 ms GPU windows, and a
// data-loader worker process replaced every 2000 steps (pid churn).
type dayStream struct {
	e      *Engine
	t      int64
	step   int64
	worker uint32
	winAt  int64
	events int64
}

func newStream(e *Engine) *dayStream {
	s := &dayStream{e: e, t: t0, worker: 1000, winAt: t0}
	s.ev(event.Event{Kind: event.KindFork, PID: 100, TID: 100, Start: s.t, End: s.t, ChildPID: s.worker})
	return s
}

func (s *dayStream) ev(ev event.Event) {
	s.e.Event(ev)
	s.events++
}

// next emits one step and advances the engine past it.
func (s *dayStream) next() {
	t := s.t
	if s.step%2000 == 1999 {
		s.ev(event.Event{Kind: event.KindExit, PID: s.worker, TID: s.worker, Start: t, End: t})
		s.worker++
		s.ev(event.Event{Kind: event.KindFork, PID: 100, TID: 100, Start: t, End: t, ChildPID: s.worker})
	}
	switch {
	case s.step%37 == 36:
		s.ev(event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: t, End: t + 30*ms, Syscall: event.SysRead,
			Name: "pread64", FDKind: event.FDFile, Path: "/data/shard.bin", Ret: 1 << 20})
		t += 30 * ms
	case s.step%53 == 52:
		s.ev(event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: t, End: t + 20*ms, Syscall: event.SysRead,
			Name: "read", FDKind: event.FDPipe, WakerPID: s.worker, WakerTID: s.worker})
		s.ev(event.Event{Kind: event.KindSyscall, PID: s.worker, TID: s.worker, Start: t + ms, End: t + 15*ms,
			Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/img.jpg"})
		t += 20 * ms
	}
	s.ev(event.Event{Kind: event.KindEnqueue, PID: 100, TID: 100, Start: t + 20*us, End: t + 20*us, Stream: 1, Count: 1})
	s.ev(event.Event{Kind: event.KindMemcpyAsync, PID: 100, TID: 100, Start: t + 40*us, End: t + 40*us, Stream: 1, Bytes: 1 << 20})
	s.ev(event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: t + 5*ms, End: t + 7*ms, Syscall: event.SysFutex, Name: "futex"})
	s.ev(event.Event{Kind: event.KindRunqueue, PID: 100, TID: 100, Start: t + 9*ms, End: t + 9*ms + 200*us})
	s.ev(event.Event{Kind: event.KindSync, PID: 100, TID: 100, Start: t + 12*ms, End: t + 99*ms + 600*us, CUDA: event.CUStreamSynchronize,
		Stream: 1, Count: 199})
	s.t = t + 100*ms
	s.step++
	for s.winAt+100*ms <= s.t {
		s.e.Window(event.GPUWindow{Start: s.winAt, End: s.winAt + 100*ms, IdleFraction: 0.05, Source: event.SourceNVML,
			SMActivity: -1, TensorActivity: -1})
		s.winAt += 100 * ms
	}
	s.e.Advance(s.t)
}

type countSink struct{ gaps, steps int64 }

func (c *countSink) Gap(Gap)         { c.gaps++ }
func (c *countSink) Step(StepResult) { c.steps++ }

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestDayLongStreamMemory simulates 24 h of training at 10 steps/s and
// checks that the heap does not grow with time.
func TestDayLongStreamMemory(t *testing.T) {
	steps := int64(24 * 3600 * 10)
	if testing.Short() {
		steps /= 24
	}
	sink := &countSink{}
	e := New(Config{Logger: quiet()}, sink)
	s := newStream(e)
	start := time.Now()
	warm := int64(3600 * 10 / 4) // 15 simulated minutes
	if warm > steps/4 {
		warm = steps / 4
	}
	for s.step < warm {
		s.next()
	}
	h0 := heapNow()
	var peak uint64
	for s.step < steps {
		s.next()
		if s.step%(steps/16) == 0 {
			if h := heapNow(); h > peak {
				peak = h
			}
		}
	}
	h1 := heapNow()
	sum := e.Close(s.t + 2e9)
	el := time.Since(start)
	growth := int64(h1) - int64(h0)
	t.Logf("%d simulated steps (%.1f h), %d events, %d gaps, %d steps emitted in %v (%.2f M events/s); heap after warm-up %d KiB, at end %d KiB (growth %+d KiB), peak %d KiB",
		s.step, float64(s.t-t0)/3.6e12, s.events, sink.gaps, sink.steps, el.Round(time.Millisecond),
		float64(s.events)/el.Seconds()/1e6, h0>>10, h1>>10, growth>>10, peak>>10)
	if growth > 2<<20 {
		t.Errorf("heap grew by %d KiB over the run", growth>>10)
	}
	if peak > h0+4<<20 {
		t.Errorf("heap peaked at %d KiB, %d KiB above the warm heap", peak>>10, (peak-h0)>>10)
	}
	wantGaps := steps/37 + steps/53 - steps/(37*53)
	if sink.gaps < wantGaps-2 || sink.gaps > wantGaps+2 || sum.Gaps != sink.gaps {
		t.Errorf("gaps %d (summary %d), want ~%d", sink.gaps, sum.Gaps, wantGaps)
	}
	if sink.steps < steps-3 {
		t.Errorf("steps %d, want ~%d", sink.steps, steps)
	}
	if len(e.procs) > 3 || len(e.threads) > 4 {
		t.Errorf("state kept for %d processes, %d threads", len(e.procs), len(e.threads))
	}
}

func BenchmarkEngine(b *testing.B) {
	e := New(Config{Logger: quiet()}, &countSink{})
	s := newStream(e)
	b.ReportAllocs()
	b.ResetTimer()
	for s.events < int64(b.N) {
		s.next()
	}
	b.StopTimer()
	b.ReportMetric(float64(s.events)/b.Elapsed().Seconds(), "events/s")
}
