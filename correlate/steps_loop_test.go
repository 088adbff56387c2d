package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestLoopThread: the main thread becomes the loop's when it launches or
// copies to the device itself; other threads' syncs then stop counting.
// A main thread that only syncs or reads device data leaves every
// thread's syncs counting.
func TestLoopThread(t *testing.T) {
	const pid, bg = 100, 101
	cases := []struct {
		name string
		tid  uint32
		ev   event.Event
		loop bool
	}{
		{"background launches", bg, event.Event{Kind: event.KindEnqueue, Count: 6}, false},
		{"main copies out", pid, event.Event{Kind: event.KindMemcpyAsync, CopyDir: event.CUMemcpyDtoH}, false},
		{"main enqueue without launches", pid, event.Event{Kind: event.KindEnqueue}, false},
		{"main launches", pid, event.Event{Kind: event.KindEnqueue, Count: 6}, true},
		{"main batch copy", pid, event.Event{Kind: event.KindMemcpyAsync, CopyDir: event.CUMemcpyHtoD}, true},
	}
	for _, c := range cases {
		s := &stepper{pid: pid}
		s.noteFeed(c.tid, &c.ev)
		if got := !s.loopSync(bg); got != c.loop {
			t.Errorf("%s: background sync dropped = %v, want %v", c.name, got, c.loop)
		}
		if !s.loopSync(pid) {
			t.Errorf("%s: the main thread's sync was dropped", c.name)
		}
	}
}
