package queue

import (
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// First operations after a sync. Lite cannot see kernel launches, so a gap
// that opens at a sync's return ends, as far as it knows, anywhere up to
// the next operation it sees: it takes the end of the feeder's last
// blocking call, and the usual lead for the rest. Many loops launch
// nothing between their last sync and the next operation lite sees: they
// read a scalar, fetch the next batch and copy it before the forward pass.
// Where launches are seen (full, and auto's windows) the engine learns,
// per operation, whether it is the first GPU work after a sync; auto's
// lite stretches then end such a gap at that operation, as full would.

// FirstOps learns which operations lite sees are the first GPU work after
// a sync. The zero value has learnt nothing and seen no sync.
type FirstOps struct {
	ops map[stepclock.Key]*quietCount
	// sinceSync counts the enqueues lite sees since the last sync, which
	// returned at syncEnd.
	sinceSync int
	syncEnd   int64
}

const (
	// firstOpMin observations at least, with at most one in
	// firstOpLoudRatio preceded by launches, make an operation quiet.
	firstOpMin       = 8
	firstOpLoudRatio = 20
	// firstOpHalve: the counts halve past this total, so a loop that
	// changes (an evaluation phase) is relearnt.
	firstOpHalve = 64
)

// firstOpKey identifies the operation: its kind, stream and size (a
// batch copy has the same size every step), or the collective.
func firstOpKey(ev *event.Event) stepclock.Key {
	return stepclock.Key{Kind: ev.Kind, Stream: ev.Stream, Bytes: ev.Bytes, Op: ev.Op, Comm: ev.Comm}
}

// liteVisible says whether lite sees the enqueue: everything but kernel
// launches (graph launches are seen).
func liteVisible(ev *event.Event) bool {
	return ev.Kind != event.KindEnqueue || ev.CUDA == event.CUGraphLaunch
}

type quietCount struct{ quiet, loud int }

// Sync notes a sync that returned at end: the next operation lite sees is
// the first after it.
func (f *FirstOps) Sync(end int64) { f.sinceSync, f.syncEnd = 0, end }

// SyncEnd is when the last sync returned, 0 before the first.
func (f *FirstOps) SyncEnd() int64 { return f.syncEnd }

// Learn records, for an enqueue that lite sees and that is the first such
// since the last sync, whether kernels were launched before it
// (launchesBefore of them) where launches are seen over the time from the
// sync's return to it (launchesSeen). It reports whether ev is that first
// operation.
func (f *FirstOps) Learn(ev *event.Event, launchesBefore uint64, launchesSeen func(from, to int64) bool) bool {
	if !liteVisible(ev) {
		return false
	}
	first := f.sinceSync == 0 && f.syncEnd > 0
	f.sinceSync++
	if !first || !launchesSeen(f.syncEnd, ev.Start) {
		return first
	}
	if f.ops == nil {
		f.ops = map[stepclock.Key]*quietCount{}
	}
	k := firstOpKey(ev)
	q := f.ops[k]
	if q == nil {
		if len(f.ops) >= stepclock.MaxKeys*4 {
			return first // a loop has few; a flood of sizes learns nothing
		}
		q = &quietCount{}
		f.ops[k] = q
	}
	if launchesBefore == 0 {
		q.quiet++
	} else {
		q.loud++
	}
	if q.quiet+q.loud > firstOpHalve {
		q.quiet, q.loud = q.quiet/2, q.loud/2
	}
	return first
}

// Quiet says whether ev, the first operation lite sees after a sync, is
// known to follow no launch since it: the GPU idled until it.
func (f *FirstOps) Quiet(ev *event.Event) bool {
	q := f.ops[firstOpKey(ev)]
	return q != nil && q.quiet >= firstOpMin && q.loud*firstOpLoudRatio <= q.quiet
}
