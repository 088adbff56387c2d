package reorder

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestEndOrder: events come back in end order up to the watermark; at one
// end an interval comes before a point event (a gap closed by an enqueue
// at t sees the call that returned at t), then arrival order.
func TestEndOrder(t *testing.T) {
	var q Queue
	in := []event.Event{
		{TID: 1, Start: 5, End: 30},
		{TID: 2, Start: 20, End: 20}, // point at 20
		{TID: 3, Start: 10, End: 20}, // interval ending at 20
		{TID: 4, Start: 20, End: 20}, // second point at 20, arrived later
		{TID: 5, Start: 1, End: 40},
	}
	for _, ev := range in {
		q.Push(ev)
	}
	if q.Len() != 5 || q.MinEnd() != 20 {
		t.Fatalf("len %d, min end %d", q.Len(), q.MinEnd())
	}
	var got []uint32
	for {
		ev, ok := q.Pop(30)
		if !ok {
			break
		}
		got = append(got, ev.TID)
	}
	want := []uint32{3, 2, 4, 1}
	if len(got) != len(want) {
		t.Fatalf("popped %v up to 30, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("popped %v up to 30, want %v", got, want)
		}
	}
	if q.Len() != 1 || q.MinEnd() != 40 {
		t.Fatalf("left len %d, min end %d; want the event ending at 40", q.Len(), q.MinEnd())
	}
	// Freed slots are reused: the slab does not grow while the queue
	// holds as many events as before.
	n := len(q.slab)
	for i := range 4 {
		q.Push(event.Event{TID: uint32(10 + i), Start: 50, End: 50 + int64(i)})
	}
	if len(q.slab) != n {
		t.Errorf("slab grew from %d to %d with free slots", n, len(q.slab))
	}
}

// TestEndOrderRandom: interleaved pushes and pops of random events give
// back, at each watermark, every event ending by it in (end, start,
// arrival) order, as a stable sort of what was pushed would.
func TestEndOrderRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q Queue
	var held []event.Event // pushed and not yet popped, in arrival order
	wm := int64(0)
	for round := range 400 {
		for range rng.IntN(40) {
			start := wm + rng.Int64N(50)
			end := start
			if rng.IntN(2) == 0 {
				end += rng.Int64N(30)
			}
			ev := event.Event{TID: uint32(round), Start: start, End: end, Count: uint64(len(held))}
			q.Push(ev)
			held = append(held, ev)
		}
		wm += rng.Int64N(40)
		var want, keep []event.Event
		for _, ev := range held {
			if ev.End <= wm {
				want = append(want, ev)
			} else {
				keep = append(keep, ev)
			}
		}
		slices.SortStableFunc(want, func(a, b event.Event) int {
			return cmp.Or(cmp.Compare(a.End, b.End), cmp.Compare(a.Start, b.Start))
		})
		for i, w := range want {
			got, ok := q.Pop(wm)
			if !ok || got.TID != w.TID || got.Count != w.Count || got.Start != w.Start || got.End != w.End {
				t.Fatalf("round %d, pop %d up to %d: got %+v (ok %v), want %+v", round, i, wm, got, ok, w)
			}
		}
		if ev, ok := q.Pop(wm); ok {
			t.Fatalf("round %d: popped %+v past the events ending by %d", round, ev, wm)
		}
		held = keep
		if q.Len() != len(held) {
			t.Fatalf("round %d: len %d, want %d", round, q.Len(), len(held))
		}
	}
}

// BenchmarkQueue: a queue holding ~1,000 events (half a second of a
// busy job's records, ending out of order), one pushed an op and those
// past the watermark popped.
func BenchmarkQueue(b *testing.B) {
	var q Queue
	t, popped := int64(0), 0
	for ; t < 1000; t++ {
		q.Push(event.Event{Start: t, End: t + t%7})
	}
	b.ReportAllocs()
	for b.Loop() {
		q.Push(event.Event{Start: t, End: t + t%7})
		t++
		for {
			if _, ok := q.Pop(t - 1000); !ok {
				break
			}
			popped++
		}
	}
	if q.Len() > 1100 || popped == 0 {
		b.Fatalf("%d events held, %d popped", q.Len(), popped)
	}
}
