package attribute

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// BenchmarkThreadAdd is a thread's timeline from empty to its cap and past
// it, as a rank's main thread waiting for a CPU hundreds of times a second
// fills it: 2*MaxIntervals run-queue waits in end order.
func BenchmarkThreadAdd(b *testing.B) {
	ev := event.Event{Kind: event.KindRunqueue, PID: 1, TID: 1}
	b.ReportAllocs()
	for b.Loop() {
		th := NewThread(1, 1, nil)
		for i := range int64(2 * MaxIntervals) {
			ev.Start, ev.End = i*1000, i*1000+500
			th.Add(&ev)
		}
	}
}

// ranBackByIndexes is RanBack as it was, over Overlapping's slice.
func ranBackByIndexes(t *Thread, from, to, run int64) int64 {
	x := to
	idx := t.Overlapping(from, to)
	for k := len(idx) - 1; k >= 0; k-- {
		ev := &t.tl[idx[k]]
		if !OffRun(ev) {
			continue
		}
		a, b := max(ev.Start, from), min(ev.End, x)
		if b <= a {
			continue
		}
		if x-b >= run {
			break
		}
		run -= x - b
		x = a
	}
	return max(x-run, from)
}

// TestOverlapsMatchesOverlapping: the iterator yields what Overlapping
// returns, and RanBack's backward walk ends where the walk over
// Overlapping's slice did, on random timelines.
func TestOverlapsMatchesOverlapping(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []event.Kind{event.KindRunqueue, event.KindOffCPU, event.KindSyscall, event.KindSync}
	for range 300 {
		th := NewThread(1, 1, nil)
		for range rng.IntN(60) {
			s := rng.Int64N(10_000)
			ev := event.Event{Kind: kinds[rng.IntN(len(kinds))], Start: s, End: s + rng.Int64N(800)}
			th.Add(&ev)
		}
		for range 40 {
			a := rng.Int64N(11_000) - 500
			b := a + rng.Int64N(3_000)
			var got []int
			for i := range th.Overlaps(a, b) {
				got = append(got, i)
			}
			if want := th.Overlapping(a, b); !slices.Equal(got, want) {
				t.Fatalf("Overlaps(%d, %d) = %v, Overlapping %v", a, b, got, want)
			}
			run := rng.Int64N(2_000)
			if got, want := th.RanBack(a, b, run), ranBackByIndexes(th, a, b, run); got != want {
				t.Fatalf("RanBack(%d, %d, %d) = %d, want %d", a, b, run, got, want)
			}
		}
	}
}
