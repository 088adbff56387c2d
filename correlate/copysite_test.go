package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestPreemptedStagedCopyNamesTheCopy: a copy from pageable memory whose
// staging lost the CPU on a loaded host is a cpu.contention gap, and its
// evidence still names the copy, bytes and call site (the line to change),
// not the sync before it.
func TestPreemptedStagedCopyNamesTheCopy(t *testing.T) {
	s := newSim()
	syncSite := []event.Frame{{Function: "Driver.sync", File: "train.py", Line: 10}}
	copySite := []event.Frame{{Function: "load_batch", File: "train.py", Line: 42}}
	var a, b int64
	for n := 0; n < 30; n++ {
		s.launches(10, 300*us, 20*us)
		s.sync()
		s.evs[len(s.evs)-1].Stack = syncSite
		if n == 20 {
			a = s.t + 10*us
			b = a + 20*ms
			ev := event.Event{Kind: event.KindMemcpyStaged, PID: s.pid, TID: s.tid, Start: a, End: b,
				CUDA: event.CUMemcpyAsync, Stream: s.stream, Bytes: 64 << 20, CopyDir: event.CUMemcpyHtoD, Stack: copySite}
			s.evs = append(s.evs, event.Event{Kind: event.KindRunqueue, PID: s.pid, TID: s.tid, Start: a + 2*ms, End: a + 17*ms}, ev)
			s.t = b
			s.copyAsync(2*ms, s.stream)
		}
		s.t += 100 * us
	}
	c := &collect{}
	sum := feed(newEngine(c, nil), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
	var g *Gap
	for i := range c.gaps {
		if c.gaps[i].Start < b && c.gaps[i].End > a && c.gaps[i].Duration >= 10*ms {
			g = &c.gaps[i]
		}
	}
	switch {
	case g == nil:
		t.Fatalf("no gap over the staged copy %d..%d: %+v", a-t0, b-t0, bigGaps(c.gaps))
	case g.Cause != CauseCPUContention:
		t.Errorf("cause %s %v, want cpu.contention (15 of 20 ms without a CPU)", g.Cause, g.Breakdown)
	case g.Evidence.Copy == nil || g.Evidence.Copy.Bytes != 64<<20:
		t.Errorf("copy evidence %+v, want the 64 MiB pageable copy", g.Evidence.Copy)
	case len(g.Evidence.Stack) == 0 || g.Evidence.Stack[0] != copySite[0]:
		t.Errorf("stack %v, want the copy's site %v", g.Evidence.Stack, copySite)
	}
	checkTotals(t, c, sum)
}
