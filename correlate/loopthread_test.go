package correlate

import (
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestSaverInsideLoopGap: the loop thread computes 60 ms between steps
// while a checkpoint saver (another thread, which only reads device data)
// waits on a futex, copies weights to the host on its own stream and
// syncs, three times. The gap is the loop's: it lasts from the loop's
// sync to its next launch, on the loop's timeline (cpu), in every probe
// mode; the saver is named among the gap's threads.
func TestSaverInsideLoopGap(t *testing.T) {
	const loop, saver = uint32(100), uint32(200)
	for _, mode := range []string{ProbesFull, ProbesLite, ProbesAuto} {
		t.Run(mode, func(t *testing.T) {
			s := newSim()
			s.lite = mode != ProbesFull
			step := func() {
				s.launches(20, 100*us, 20*us)
				s.copyAsync(10*us, 1)
				s.sync()
			}
			for i := 0; i < 30; i++ {
				step()
			}
			a := s.t
			// The saver, three times in the gap: a 4 MiB copy to pageable
			// host memory on stream 2 (the driver stages it: the saver
			// stays in the call), the interpreter's lock taken back after
			// the call (futex), then the sync.
			st := a
			futex := func(d int64) {
				s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: saver, Start: st, End: st + d,
					Syscall: event.SysFutex, Name: "futex", WakerPID: s.pid, WakerTID: loop, TaskComm: "ckpt-saver"})
				st += d
			}
			for i := 0; i < 3; i++ {
				st += 5 * ms
				futex(5 * ms)
				s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: saver, Start: st, End: st,
					CUDA: event.CUMemcpyAsync, CopyDir: event.CUMemcpyDtoH, Stream: 2, Bytes: 4 << 20, TaskComm: "ckpt-saver"},
					event.Event{Kind: event.KindMemcpyStaged, PID: s.pid, TID: saver, Start: st, End: st + 400*us,
						CUDA: event.CUMemcpyDtoH, Stream: 2, Bytes: 4 << 20, TaskComm: "ckpt-saver"})
				s.addBusy(st+5*us, st+400*us)
				st += 400 * us
				futex(5 * ms)
				s.evs = append(s.evs, event.Event{Kind: event.KindSync, PID: s.pid, TID: saver, Start: st, End: st + 20*us,
					CUDA: event.CUStreamSynchronize, Stream: 2, TaskComm: "ckpt-saver"})
			}
			s.t += 60 * ms // the loop computes in Python
			b := s.t
			for i := 0; i < 30; i++ {
				step()
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			e := newEngine(c, func(cfg *Config) { cfg.Probes = mode })
			if mode == ProbesAuto {
				e.ProbesLive(true, t0)
				e.ProbesLive(false, t0+20*ms)
			}
			sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var got *Gap
			for i := range c.gaps {
				if g := &c.gaps[i]; g.End > a && g.Start < b && g.Duration >= ms {
					if got != nil {
						t.Fatalf("two gaps in the loop's pause: %+v and %+v", *got, *g)
					}
					got = g
				}
			}
			if got == nil {
				t.Fatalf("no gap over %d..%d: %+v", a-t0, b-t0, c.gaps)
			}
			if got.TID != loop || got.Cause != CauseCPU {
				t.Errorf("gap of thread %d, cause %s %v: want the loop's (%d), cpu", got.TID, got.Cause, got.Breakdown, loop)
			}
			if got.Duration < 50*ms || got.End > b+ms {
				t.Errorf("gap %d..%d, want about %d..%d", got.Start-t0, got.End-t0, a-t0, b-t0)
			}
			if !slices.Contains(got.Evidence.Threads, saver) {
				t.Errorf("threads %v, want the saver %d among them", got.Evidence.Threads, saver)
			}
			checkTotals(t, c, sum)
		})
	}
}
