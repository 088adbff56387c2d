package reorder

import (
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
