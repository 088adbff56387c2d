package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// eventSync waits for the GPU like sync, through cuEventSynchronize: the
// call names no stream.
func (s *gpuSim) eventSync() {
	start := s.t
	end := max(start+10*us, s.gpuFree+5*us)
	s.evs = append(s.evs, event.Event{Kind: event.KindSync, PID: s.pid, TID: s.tid, Start: start, End: end,
		CUDA: event.CUEventSynchronize, Count: s.pending[s.tid], LastLaunch: s.lastLaunch[s.tid]})
	s.pending[s.tid] = 0
	s.flushed[s.tid] = false
	s.t = end
}

func sleepFor(s *gpuSim, d int64) {
	s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysSleep, Name: "clock_nanosleep"}, d)
}

// idleShare is how much of the gaps' time the GPU truly idled.
func idleShare(s *gpuSim, gaps []Gap) (idle, total int64) {
	for _, g := range gaps {
		if g.Kind == GapIdle {
			idle += s.idle(g.Start, g.End)
			total += g.End - g.Start
		}
	}
	return idle, total
}

// TestEventSyncDrainsItsStream: a loop that prefetches its batch on a side
// stream and waits for its loss through an event (cuEventSynchronize names
// no stream), then reads the next batch's data with the queue empty. The
// event was recorded on the stream the thread last queued to: the sync
// drains it and the side stream's earlier copy, and each read is a gap
// the host bounds. Before, no stream drained, no gap opened, and the reads
// were left to the GPU windows (a 100 ms window's idle placed in them).
func TestEventSyncDrainsItsStream(t *testing.T) {
	for _, lite := range []bool{false, true} {
		t.Run(map[bool]string{false: "full", true: "lite"}[lite], func(t *testing.T) {
			s := newSim()
			s.lite = lite
			var reads []interval.Span
			for n := 0; n < 60; n++ {
				s.copyAsync(300*us, 9) // the next batch, on the copy stream
				s.launches(20, 200*us, 20*us)
				s.copyAsync(5*us, 1) // the loss, to the host
				s.eventSync()
				a := s.t
				readStall(s, 4*ms)
				reads = append(reads, interval.Span{A: a, B: s.t})
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			feed(newEngine(c, func(cfg *Config) {
				if lite {
					cfg.Probes = ProbesLite
				}
			}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			exact := 0
			for _, r := range reads[5:] {
				for _, g := range c.gaps {
					if g.Cause == CauseIORead && g.Evidence.Source == "host" && g.Start <= r.A+100*us && g.End >= r.B-100*us {
						exact++
						break
					}
				}
			}
			if exact < len(reads[5:])*9/10 {
				t.Errorf("%d of %d reads after the warm-up are gaps the host bounds, want nine in ten", exact, len(reads[5:]))
			}
			if idle, total := idleShare(s, c.gaps); total == 0 || float64(idle) < 0.95*float64(total) {
				t.Errorf("gaps hold %d ns of idle in %d", idle, total)
			}
		})
	}
}

// TestAheadWindowsKnownIdle: a loop whose host runs ahead of its queue
// sleeps each step while the GPU works through the steps queued before,
// and reads its loss every 10th step; every 25th it saves a checkpoint
// (the queue drained, 80 ms of writing). The windows (100 ms) that hold a
// sleep also hold the loop's start, before any work was queued, or the
// first part of a checkpoint still open when they arrive: that idle is
// known, and none is left for the sleeps, during which the GPU ran.
// Before, each window's idle went to its first sleeps (a fifth of the
// gaps' time was the GPU computing).
func TestAheadWindowsKnownIdle(t *testing.T) {
	s := newSim()
	s.t += 40 * ms // the interpreter starting, the model loading
	for n := 0; n < 100; n++ {
		sleepFor(s, 2*ms)
		s.launches(30, 180*us, 20*us) // 5.4 ms of GPU time, 0.75 ms of host
		if n%10 == 9 {
			s.sync()
		}
		if n%25 == 24 {
			s.sync()
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile,
				Path: "/ckpt/model.pt", Ret: 64 << 20}, 80*ms)
		}
	}
	s.sync()
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	idle, total := idleShare(s, c.gaps)
	if total == 0 || float64(idle) < 0.97*float64(total) {
		t.Errorf("gaps hold %d ns of idle in %d (%.3f): the GPU computed in the rest", idle, total, float64(idle)/float64(max(total, 1)))
	}
	for _, g := range c.gaps {
		if b := g.End - g.Start - s.idle(g.Start, g.End); b > ms {
			t.Errorf("gap [%d, %d] %s (%s): %d ns of it the GPU computed", g.Start-t0, g.End-t0, g.Cause, g.Evidence.Source, b)
		}
	}
}
