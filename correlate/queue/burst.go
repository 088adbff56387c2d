package queue

import "github.com/gaptrace/gaptrace/event"

// Burst is the work one thread enqueued since the queue was last empty,
// while nothing else was enqueued: a trailing burst (GradScaler's update,
// an optimizer step after loss.item()) whose drain no sync shows. The zero
// value holds no burst.
type Burst struct {
	tid      uint32
	start    int64
	launches uint64 // flushed by the burst's events
	bytes    uint64 // copied and set by it
	ok       bool   // false once anything else was enqueued
}

// Note keeps the burst current at an enqueue ev of thread tid; wasDrained
// says whether the queue was empty before it.
func (b *Burst) Note(tid uint32, ev *event.Event, wasDrained bool) {
	work := ev.Kind == event.KindMemcpyAsync || ev.Kind == event.KindMemset ||
		ev.Kind == event.KindEnqueue && ev.CUDA != event.CUGraphLaunch
	switch {
	case !work:
		// A collective or a graph replay: work whose length the host
		// does not know.
		b.ok = false
	case wasDrained:
		*b = Burst{tid: tid, start: ev.Start, ok: true}
	case tid != b.tid:
		b.ok = false
	}
	if b.ok && b.tid == tid {
		if ev.Kind == event.KindEnqueue {
			b.launches += ev.Count
		} else {
			b.bytes += ev.Bytes
		}
	}
}

// End forgets the burst: the queue drained.
func (b *Burst) End() { b.ok = false }

// Of is the burst of thread tid: when it began and the bytes it copied
// and set; ok is false when the work queued is not one burst of tid's.
func (b *Burst) Of(tid uint32) (start int64, bytes uint64, ok bool) {
	if !b.ok || b.tid != tid {
		return 0, 0, false
	}
	return b.start, b.bytes, true
}

// LaunchesBefore is how many launches the burst held before ev, the
// thread's next CUDA event.
func (b *Burst) LaunchesBefore(ev *event.Event) uint64 {
	switch ev.Kind {
	case event.KindEnqueue:
		// Its count is the launches since the last flush and its own.
		return b.launches + max(ev.Count, 1) - 1
	case event.KindSync:
		return b.launches + ev.Count
	}
	return b.launches + ev.Pending
}
