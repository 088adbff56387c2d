package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// siteTID is the thread whose calls of the running call site end the
// steps (stepsite.go), when steps end at a site found in the stacks.
func (s *stepper) siteTID() (uint32, bool) {
	c := &s.sites
	if s.mode != modeSite || c.source != stepclock.SourceCallSite || c.tid == 0 {
		return 0, false
	}
	return c.tid, true
}

// loopThreads counts each thread's kernel launches (enqueued, or flushed
// by a sync where lite sees no enqueue) to name the process's main
// feeder: the thread with the most, the first to reach a count keeping it.
type loopThreads struct {
	launches map[uint32]uint64
	main     uint32
}

func (l *loopThreads) note(tid uint32, n uint64) {
	if n == 0 {
		return
	}
	if l.launches == nil {
		l.launches = map[uint32]uint64{}
	}
	l.launches[tid] += n
	if l.main == 0 || l.launches[tid] > l.launches[l.main] {
		l.main = tid
	}
}

// launched says whether tid ever launched a kernel.
func (l *loopThreads) launched(tid uint32) bool { return l.launches[tid] > 0 }

// loopTID is the thread that feeds the step clock: the running call
// site's thread, else the main feeder.
func (p *proc) loopTID() (uint32, bool) {
	if tid, ok := p.st.siteTID(); ok {
		return tid, true
	}
	return p.loop.main, p.loop.main != 0
}

// aside says whether th's activity ev is another thread's while the
// loop's gap is open: a thread that never launched a kernel (a checkpoint
// saver's copies and syncs, a metrics reader) beside the known loop
// thread. Such activity neither ends the gap nor rejects it nor becomes
// its feeder; it stays on th's own timeline. A thread that launches
// kernels feeds the GPU (autograd's backward thread, a second launcher):
// its work ends the gap as before.
func (p *proc) aside(th *attribute.Thread, ev *event.Event) bool {
	if p.gap == nil {
		return false
	}
	loop, ok := p.loopTID()
	if !ok || th.TID == loop || p.loop.launched(th.TID) {
		return false
	}
	if ev.Kind == event.KindEnqueue && ev.Count > 0 {
		return false
	}
	return true
}
