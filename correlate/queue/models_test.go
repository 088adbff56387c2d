package queue

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// A burst is one thread's launches and copies since the queue was empty;
// another thread's work or a collective ends it.
func TestBurstIsOneThreadsWorkSinceTheDrain(t *testing.T) {
	var b Burst
	if _, _, ok := b.Of(1); ok {
		t.Fatal("a zero Burst holds a burst")
	}
	b.Note(1, &event.Event{Kind: event.KindEnqueue, CUDA: event.CULaunchKernel, Start: 100, Count: 3}, true)
	b.Note(1, &event.Event{Kind: event.KindMemcpyAsync, Start: 110, Bytes: 4096}, false)
	start, bytes, ok := b.Of(1)
	if !ok || start != 100 || bytes != 4096 {
		t.Fatalf("burst of 1: start %d bytes %d ok %v", start, bytes, ok)
	}
	if _, _, ok := b.Of(2); ok {
		t.Error("thread 1's burst reported for thread 2")
	}
	// The next event: a sync flushing 2 more launches; an enqueue
	// flushing its own and the pending ones.
	if n := b.LaunchesBefore(&event.Event{Kind: event.KindSync, Count: 2}); n != 5 {
		t.Errorf("launches before a sync = %d, want 5", n)
	}
	if n := b.LaunchesBefore(&event.Event{Kind: event.KindEnqueue, Count: 2}); n != 4 {
		t.Errorf("launches before an enqueue = %d, want 4", n)
	}
	if n := b.LaunchesBefore(&event.Event{Kind: event.KindMemcpyAsync, Pending: 1}); n != 4 {
		t.Errorf("launches before a copy = %d, want 4", n)
	}
	b.Note(2, &event.Event{Kind: event.KindEnqueue, Start: 120, Count: 1}, false)
	if _, _, ok := b.Of(1); ok {
		t.Error("another thread's work kept the burst")
	}
	b.Note(1, &event.Event{Kind: event.KindEnqueue, Start: 200, Count: 1}, true)
	b.Note(1, &event.Event{Kind: event.KindCollective, Start: 210}, false)
	if _, _, ok := b.Of(1); ok {
		t.Error("a collective kept the burst")
	}
	b.Note(1, &event.Event{Kind: event.KindEnqueue, Start: 300, Count: 1}, true)
	b.End()
	if _, _, ok := b.Of(1); ok {
		t.Error("End kept the burst")
	}
}

// An operation becomes quiet after firstOpMin syncs it followed with no
// launch between, where launches were seen; where they were not, or when
// launches came first, it learns nothing or turns loud.
func TestFirstOpsLearnsQuietOperations(t *testing.T) {
	var f FirstOps
	copyEv := func(start int64) *event.Event {
		return &event.Event{Kind: event.KindMemcpyAsync, Stream: 1, Bytes: 8 << 20, Start: start}
	}
	seen := func(from, to int64) bool { return true }
	unseen := func(from, to int64) bool { return false }
	if f.Learn(copyEv(10), 0, seen) {
		t.Error("first operation before any sync")
	}
	launch := &event.Event{Kind: event.KindEnqueue, CUDA: event.CULaunchKernel, Start: 5}
	for i := range firstOpMin {
		at := int64(1000 * (i + 1))
		f.Sync(at)
		if f.SyncEnd() != at {
			t.Fatalf("SyncEnd %d, want %d", f.SyncEnd(), at)
		}
		if f.Learn(launch, 0, seen) {
			t.Fatal("a kernel launch, which lite does not see, counted as the first operation")
		}
		if !f.Learn(copyEv(at+10), 0, seen) {
			t.Fatal("the first copy after a sync is not the first operation")
		}
		if f.Learn(copyEv(at+20), 0, seen) {
			t.Fatal("the second copy after a sync is the first operation")
		}
		if i < firstOpMin-1 && f.Quiet(copyEv(0)) {
			t.Fatalf("quiet after %d observations", i+1)
		}
	}
	if !f.Quiet(copyEv(0)) {
		t.Fatal("not quiet after firstOpMin quiet observations")
	}
	// Unseen launches teach nothing; launches before it make it loud.
	var g FirstOps
	for i := range 2 * firstOpMin {
		g.Sync(int64(1000 * (i + 1)))
		g.Learn(copyEv(int64(1000*(i+1)+10)), 0, unseen)
	}
	if g.Quiet(copyEv(0)) {
		t.Error("learnt from stretches where launches were not seen")
	}
	for i := range firstOpMin {
		f.Sync(int64(100000 * (i + 1)))
		f.Learn(copyEv(int64(100000*(i+1)+10)), 5, seen)
	}
	if f.Quiet(copyEv(0)) {
		t.Error("still quiet after as many loud observations")
	}
}

// A CPU-ahead candidate spans from the first blocking to its end, and
// only when the feeders blocked for minGap in all.
func TestAheadCountsBlockingInTotal(t *testing.T) {
	var a Ahead
	if _, _, found := a.End(100, true, 10); found {
		t.Fatal("a candidate from nothing")
	}
	a.Block(7, 200, 4) // a read loop: no call reaches minGap
	a.Block(8, 150, 4) // an earlier blocking of another feeder
	a.Block(7, 220, 4)
	if a.Start() != 150 {
		t.Errorf("Start %d, want 150", a.Start())
	}
	if tid, lo, found := a.End(300, true, 10); !found || tid != 8 || lo != 150 {
		t.Errorf("candidate %d [%d, 300] %v, want thread 8 from 150", tid, lo, found)
	}
	if a.Start() != 0 {
		t.Error("End kept tracking")
	}
	a.Block(7, 400, 9)
	if _, _, found := a.End(500, true, 10); found {
		t.Error("a candidate blocked less than minGap")
	}
	a.Block(7, 600, 20)
	if _, _, found := a.End(700, false, 10); found {
		t.Error("a candidate the caller ruled out")
	}
	a.Block(7, 800, 20)
	if _, _, found := a.End(800, true, 10); found {
		t.Error("a candidate ending at its start")
	}
	a.Block(7, 900, 20)
	a.Reset()
	if a.Start() != 0 {
		t.Error("Reset kept tracking")
	}
}
