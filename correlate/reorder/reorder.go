// Package reorder holds host events until a watermark passes their end and
// gives them back in end order, so that the engine decides a gap with
// every host event that ended before it already seen.
//
// # Rule
//
// A buffer that owns its events and knows nothing of what they mean: no
// engine state, only event and the standard library. The engine bounds it
// (Config.MaxBuffered) and moves the watermark.
package reorder

import "github.com/gaptrace/gaptrace/event"

// Queue holds events until the watermark passes their end, and
// gives them back in end order: a gap is decided with every host event
// that ended before it already seen. The engine bounds it
// (Config.MaxBuffered): past the bound it takes the oldest out early.
type Queue struct {
	h    evHeap
	slab []event.Event // buffered events; h orders their slots
	free []int32
	seq  uint64
}

// slabKeep: a slab grown past this many events by a burst is given back
// once the queue is empty.
const slabKeep = 4096

// Push buffers ev.
func (q *Queue) Push(ev event.Event) {
	q.seq++
	var slot int32
	if n := len(q.free); n > 0 {
		slot = q.free[n-1]
		q.free = q.free[:n-1]
		q.slab[slot] = ev
	} else {
		slot = int32(len(q.slab))
		q.slab = append(q.slab, ev)
	}
	q.h.push(queued{end: ev.End, start: ev.Start, seq: q.seq, slot: slot})
}

// Pop returns the next event ending at or before wm.
func (q *Queue) Pop(wm int64) (event.Event, bool) {
	if len(q.h) == 0 || q.h[0].end > wm {
		if len(q.h) == 0 && cap(q.slab) > slabKeep {
			// A burst is over: give its memory back.
			q.slab, q.free = nil, nil
		}
		return event.Event{}, false
	}
	k := q.h.pop()
	ev := q.slab[k.slot]
	q.slab[k.slot] = event.Event{}
	q.free = append(q.free, k.slot)
	return ev, true
}

// Len is the number of events buffered.
func (q *Queue) Len() int { return len(q.h) }

// MinEnd is the end of the next event Pop returns; the queue must not be
// empty.
func (q *Queue) MinEnd() int64 { return q.h[0].end }

// queued orders one buffered event (kept in Queue.slab, so the heap
// moves small pointer-free keys); seq keeps arrival order among equal keys.
type queued struct {
	end, start int64
	seq        uint64
	slot       int32
}

// evHeap is a binary min-heap of queued keys, typed: container/heap
// boxed each key in an interface, two allocations an event.
type evHeap []queued

func (h evHeap) less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.end != b.end {
		return a.end < b.end
	}
	// Intervals that end at t come before point events at t, so a gap
	// closed by an enqueue at t sees the blocking call that returned at t.
	if a.start != b.start {
		return a.start < b.start
	}
	return a.seq < b.seq
}

func (h *evHeap) push(k queued) {
	*h = append(*h, k)
	s := *h
	for j := len(s) - 1; j > 0; {
		i := (j - 1) / 2
		if !s.less(j, i) {
			break
		}
		s[i], s[j] = s[j], s[i]
		j = i
	}
}

// pop removes and returns the least key; h must not be empty.
func (h *evHeap) pop() queued {
	s := *h
	n := len(s) - 1
	top := s[0]
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && s.less(r, l) {
			j = r
		}
		if !s.less(j, i) {
			break
		}
		s[i], s[j] = s[j], s[i]
		i = j
	}
	*h = s
	return top
}
