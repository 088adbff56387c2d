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

// loopThreads names the process's main feeder and the threads that feed
// the GPU at all. A thread feeds it by a launch, a memset, a collective
// or a copy other than a read of device data; one that only reads device
// data and waits (a checkpoint saver, a metrics reader) is a reader. The
// main feeder is the thread with the most launches, or where the probes
// see none (lite), the most feeding calls, or where none fed (a CUDA
// graph replayed by a loop that reads its loss, in lite), the most GPU
// calls. The first thread to reach a count keeps it, so the choice does
// not flip on ties.
type loopThreads struct {
	launches, feeds, calls map[uint32]uint64
	byLaunch, byFeed       uint32 // 0 before any
	byCalls                uint32
}

// feeds says whether ev gives the GPU work other than reading its data.
func feeds(ev *event.Event) bool {
	switch ev.Kind {
	case event.KindEnqueue, event.KindMemset, event.KindCollective:
		return true
	case event.KindMemcpyAsync:
		return ev.CopyDir != event.CUMemcpyDtoH
	case event.KindSync:
		return ev.Count > 0
	}
	return false
}

func bump(m map[uint32]uint64, best *uint32, tid uint32, n uint64) {
	m[tid] += n
	if *best == 0 || m[tid] > m[*best] {
		*best = tid
	}
}

// note counts ev, a GPU call (enqueue, copy, memset, collective or sync).
func (l *loopThreads) note(ev *event.Event) {
	if l.calls == nil {
		l.launches, l.feeds, l.calls = map[uint32]uint64{}, map[uint32]uint64{}, map[uint32]uint64{}
	}
	bump(l.calls, &l.byCalls, ev.TID, 1)
	if !feeds(ev) {
		return
	}
	bump(l.feeds, &l.byFeed, ev.TID, 1)
	if ev.Count > 0 && (ev.Kind == event.KindEnqueue || ev.Kind == event.KindSync) {
		bump(l.launches, &l.byLaunch, ev.TID, ev.Count)
	}
}

// main is the main feeder, 0 before any call.
func (l *loopThreads) main() uint32 {
	switch {
	case l.byLaunch != 0:
		return l.byLaunch
	case l.byFeed != 0:
		return l.byFeed
	}
	return l.byCalls
}

// reader says whether tid never fed the GPU.
func (l *loopThreads) reader(tid uint32) bool { return l.feeds[tid] == 0 }

// loopTID is the thread that feeds the step clock: the running call
// site's thread, else the main feeder.
func (p *proc) loopTID() (uint32, bool) {
	if tid, ok := p.st.siteTID(); ok {
		return tid, true
	}
	main := p.loop.main()
	return main, main != 0
}

// aside says whether ev, a reader's GPU call, is another thread's activity
// while the loop's gap is open: the loop thread is known and th is a
// reader beside it (loopThreads). Its copies and syncs neither end the
// gap nor reject it nor become its feeder; they stay on th's own timeline
// and its tid in the gap's threads. A thread that feeds the GPU
// (autograd's backward thread, a second launcher) ends the gap as before.
func (p *proc) aside(th *attribute.Thread, ev *event.Event) bool {
	if p.gap.cur() == nil || feeds(ev) || !p.loop.reader(th.TID) {
		return false
	}
	loop, ok := p.loopTID()
	return ok && th.TID != loop
}
