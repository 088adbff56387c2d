package attribute

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// A timeline at its cap keeps exactly the latest MaxIntervals intervals, in
// order, and reuses its array: dropping one interval per event neither
// moves the whole timeline each time nor grows the array without bound.
func TestTimelineAtCapReusesArray(t *testing.T) {
	var dropped uint64
	th := NewThread(0, 0, &dropped)
	const n = 5 * MaxIntervals
	for i := range n {
		ev := event.Event{Kind: event.KindRunqueue, Start: int64(i) * 10, End: int64(i)*10 + 5}
		if i%7 == 3 {
			// Out of order: ends before the latest one.
			ev.Start, ev.End = int64(i)*10-12, int64(i)*10-11
		}
		th.Add(&ev)
		if len(th.tl) > MaxIntervals {
			t.Fatalf("after %d events: %d intervals, cap %d", i+1, len(th.tl), MaxIntervals)
		}
	}
	if len(th.tl) != MaxIntervals || dropped != n-MaxIntervals {
		t.Fatalf("%d intervals, %d dropped; want %d, %d", len(th.tl), dropped, MaxIntervals, n-MaxIntervals)
	}
	for i := 1; i < len(th.tl); i++ {
		if th.tl[i].End < th.tl[i-1].End {
			t.Fatalf("interval %d ends at %d, before %d", i, th.tl[i].End, th.tl[i-1].End)
		}
	}
	if last := th.tl[len(th.tl)-1].End; last != int64(n-1)*10+5 {
		t.Errorf("latest interval ends at %d, want %d", last, int64(n-1)*10+5)
	}
	if c := cap(th.base); c > 2*MaxIntervals {
		t.Errorf("array of %d events for a cap of %d", c, MaxIntervals)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		ev := event.Event{Kind: event.KindRunqueue, Start: th.Last + 10, End: th.Last + 15}
		th.Last = ev.End
		th.Add(&ev)
	})
	if allocs > 0.01 {
		t.Errorf("%.2f allocations per interval at the cap, want none", allocs)
	}
}

// A timeline that fills over a step and is trimmed to the step's start
// keeps its array from step to step, and one that stays small for long
// gives a large array back.
func TestTrimKeepsArrayAcrossSteps(t *testing.T) {
	th := NewThread(0, 0, nil)
	now := int64(0)
	step := func(n int) {
		from := now
		for range n {
			now += 10
			th.Add(&event.Event{Kind: event.KindRunqueue, Start: now, End: now + 5})
			th.Trim(from) // the engine keeps the pending step's intervals
		}
	}
	step(800)
	step(800)
	allocs := testing.AllocsPerRun(20, func() { step(800) })
	if allocs > 0.05 {
		t.Errorf("%.2f allocations per step of 800 intervals, want none", allocs)
	}
	big := cap(th.base)
	for range 2 * shrinkLook / 10 {
		step(10)
	}
	if c := cap(th.base); c >= big/4 || c < len(th.tl) {
		t.Errorf("array of %d intervals after %d trims holding %d (was %d)", c, 2*shrinkLook, len(th.tl), big)
	}
}
