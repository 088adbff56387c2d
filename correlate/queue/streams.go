package queue

import "github.com/gaptrace/gaptrace/event"

// Streams is the GPU queue of one process: per CUDA stream, whether work
// was enqueued since the stream was last known drained, and the last
// collective among that work. C is what the caller keeps of a collective
// (its evidence, its place in its communicator's sequence). The zero value
// is an empty queue, every stream drained.
type Streams[C any] struct {
	m map[uint64]*stream[C]
	// last is the latest enqueue on any stream (0: none yet).
	last int64
}

// stream is the queue model of one CUDA stream.
type stream[C any] struct {
	pending int64 // first enqueue since the stream was last drained; 0 when drained
	lastEnq int64
	// coll is the last collective enqueued since the drain (when hasColl),
	// issued at collAt: of several streams' collectives, the one issued
	// last completes last.
	coll    C
	collAt  int64
	hasColl bool
}

func (q *Streams[C]) stream(id uint64) *stream[C] {
	s := q.m[id]
	if s == nil {
		if q.m == nil {
			q.m = map[uint64]*stream[C]{}
		}
		s = &stream[C]{}
		q.m[id] = s
	}
	return s
}

// Enqueue notes work enqueued on stream id at t.
func (q *Streams[C]) Enqueue(id uint64, t int64) {
	s := q.stream(id)
	if s.pending == 0 {
		s.pending = t
	}
	s.lastEnq = t
	if t > q.last {
		q.last = t
	}
}

// Collective notes that the work enqueued last on stream id is the
// collective c, issued at `at` in its communicator's order.
func (q *Streams[C]) Collective(id uint64, c C, at int64) {
	s := q.stream(id)
	s.coll, s.collAt, s.hasColl = c, at, true
}

// LastEnqueue is the latest enqueue on any stream, 0 before the first.
func (q *Streams[C]) LastEnqueue() int64 { return q.last }

// AllDrained says whether no stream has work pending.
func (q *Streams[C]) AllDrained() bool {
	for _, s := range q.m {
		if s.pending != 0 {
			return false
		}
	}
	return true
}

// WorkSince is when the GPU work queued now began: the first enqueue
// since its stream drained, earliest over the streams with work pending;
// t when none has any (work enqueued at t begins it).
func (q *Streams[C]) WorkSince(t int64) int64 {
	for _, s := range q.m {
		if s.pending != 0 && s.pending < t {
			t = s.pending
		}
	}
	return t
}

// Drain marks the streams the sync ev covers as drained and returns the
// collective their pending work held, if any (the one issued last: it
// completes last). Work enqueued after the sync began is not covered. A
// context sync or a free covers every stream; a stream sync its stream
// and the other streams whose last work predates the synced stream's last
// work: training loops hand side streams' results (batch copies) to the
// main stream through events, which are not traced, so that work is done
// when the main stream is.
//
// An event sync names no stream (cuEventRecord is not probed: PyTorch
// records events around every cross-stream free and collective). The
// event is most often recorded right after the work it marks, on the
// stream the thread last queued to (end.record(); end.synchronize(), a
// loss copied and its event recorded): the sync covers that stream,
// threadStream, where the thread enqueued any (threadEnqueued). A guess
// wrong the other way (an event of a stream with less work) opens a gap
// the next sync that still waits rejects.
func (q *Streams[C]) Drain(ev *event.Event, threadStream uint64, threadEnqueued bool) (c C, ok bool) {
	// The legacy default stream (0) is not special here: frameworks create
	// their side streams non-blocking, so syncing stream 0 does not wait
	// for them; the rule above covers their earlier work.
	all := ev.CUDA == event.CUCtxSynchronize || ev.Kind == event.KindFree
	synced := ev.Stream
	if ev.CUDA == event.CUEventSynchronize && threadEnqueued {
		synced = threadStream
	}
	var ref int64
	if !all {
		if s := q.m[synced]; s != nil {
			ref = s.lastEnq
		}
	}
	var at int64
	for id, s := range q.m {
		if s.pending == 0 || s.lastEnq > ev.Start {
			continue
		}
		if all || id == synced || s.lastEnq <= ref {
			if s.hasColl && (!ok || s.collAt >= at) {
				c, at, ok = s.coll, s.collAt, true
			}
			s.drained()
		}
	}
	return c, ok
}

// DrainAll marks every stream drained: the queue ran dry with no sync to
// show it (a trailing burst's work done).
func (q *Streams[C]) DrainAll() {
	for _, s := range q.m {
		s.drained()
	}
}

func (s *stream[C]) drained() {
	var zero C
	s.pending, s.coll, s.collAt, s.hasColl = 0, zero, 0, false
}
