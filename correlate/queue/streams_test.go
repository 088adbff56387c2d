package queue

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func streamSync(stream uint64, start int64) *event.Event {
	return &event.Event{Kind: event.KindSync, CUDA: event.CUStreamSynchronize, Stream: stream, Start: start, End: start + 10}
}

// A stream sync drains its stream and the side streams whose last work
// came before the synced stream's last work, not those enqueued later.
func TestStreamSyncDrainsItsStreamAndOlderSideWork(t *testing.T) {
	var q Streams[string]
	if !q.AllDrained() || q.LastEnqueue() != 0 {
		t.Fatal("a new queue holds work")
	}
	q.Enqueue(2, 100) // side stream: the batch copy
	q.Enqueue(1, 110) // main stream
	q.Enqueue(1, 120)
	q.Enqueue(3, 130) // another side stream, after the main stream's last work
	if got := q.WorkSince(1000); got != 100 {
		t.Errorf("WorkSince = %d, want 100 (the side stream's first enqueue)", got)
	}
	if q.LastEnqueue() != 130 {
		t.Errorf("LastEnqueue = %d, want 130", q.LastEnqueue())
	}
	if _, ok := q.Drain(streamSync(1, 140), 0, false); ok {
		t.Error("a collective where none was enqueued")
	}
	if q.AllDrained() {
		t.Fatal("stream 3's later work was drained by a sync of stream 1")
	}
	if got := q.WorkSince(1000); got != 130 {
		t.Errorf("WorkSince = %d after the sync, want 130 (stream 3 only)", got)
	}
	q.Drain(streamSync(3, 150), 0, false)
	if !q.AllDrained() {
		t.Error("stream 3 still pending after its own sync")
	}
	if got := q.WorkSince(1000); got != 1000 {
		t.Errorf("WorkSince = %d on a drained queue, want t", got)
	}
}

// Work enqueued after the sync began is not covered by it.
func TestSyncDoesNotCoverLaterWork(t *testing.T) {
	var q Streams[string]
	q.Enqueue(1, 100)
	q.Enqueue(1, 200) // enqueued by another thread while the sync waited
	q.Drain(streamSync(1, 150), 0, false)
	if q.AllDrained() {
		t.Error("work enqueued after the sync began was drained")
	}
}

// An event sync names no stream: it covers the stream its thread last
// queued to, and none when the thread never enqueued.
func TestEventSyncCoversTheThreadsLastStream(t *testing.T) {
	var q Streams[string]
	q.Enqueue(7, 100)
	ev := &event.Event{Kind: event.KindSync, CUDA: event.CUEventSynchronize, Start: 150, End: 160}
	q.Drain(ev, 7, false)
	if q.AllDrained() {
		t.Error("an event sync of a thread that never enqueued drained stream 7")
	}
	q.Drain(ev, 7, true)
	if !q.AllDrained() {
		t.Error("an event sync did not drain its thread's last stream")
	}
}

// A context sync or a free drains every stream, and returns the
// collective issued last among the pending work.
func TestContextSyncDrainsAllAndReturnsLastCollective(t *testing.T) {
	var q Streams[string]
	q.Enqueue(1, 100)
	q.Collective(1, "allreduce-a", 5)
	q.Enqueue(2, 110)
	q.Collective(2, "allreduce-b", 9)
	q.Enqueue(3, 120)
	ctx := &event.Event{Kind: event.KindSync, CUDA: event.CUCtxSynchronize, Start: 200, End: 210}
	c, ok := q.Drain(ctx, 0, false)
	if !ok || c != "allreduce-b" {
		t.Errorf("collective %q %v, want the one issued last", c, ok)
	}
	if !q.AllDrained() {
		t.Error("a context sync left work pending")
	}
	// Drained streams forget their collectives.
	q.Enqueue(1, 300)
	free := &event.Event{Kind: event.KindFree, Start: 400, End: 410}
	if c, ok := q.Drain(free, 0, false); ok {
		t.Errorf("collective %q survived its drain", c)
	}
	if !q.AllDrained() {
		t.Error("a free left work pending")
	}
}

// DrainAll empties the queue without a sync; LastEnqueue stays.
func TestDrainAll(t *testing.T) {
	var q Streams[int]
	q.Enqueue(1, 100)
	q.Collective(1, 42, 1)
	q.Enqueue(2, 90)
	q.DrainAll()
	if !q.AllDrained() || q.LastEnqueue() != 100 {
		t.Errorf("drained %v, last %d", q.AllDrained(), q.LastEnqueue())
	}
	q.Enqueue(1, 200)
	if c, ok := q.Drain(streamSync(1, 300), 0, false); ok {
		t.Errorf("collective %d kept across DrainAll", c)
	}
}
