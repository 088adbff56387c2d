package attribute

import (
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
