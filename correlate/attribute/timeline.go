package attribute

import (
	"cmp"
	"iter"
	"slices"
	"sort"
	"time"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// Thread is one traced thread and its recent activity timeline: blocking
// intervals (syscalls, runqueue waits, off-CPU, CUDA calls), kept sorted by
// end time. Time not covered by any interval is on-CPU.
type Thread struct {
	TID, PID uint32
	Comm     string
	Last     int64 // end of its latest event
	Exited   int64 // when it exited, 0 while it lives
	// LastStream is the stream of its latest enqueue (Enqueued: it made
	// one), what an event sync of the thread most likely waits for.
	LastStream uint64
	Enqueued   bool

	tl []event.Event
	// base is tl's whole array (len == cap), from its first element:
	// dropFront moves tl's start, and appendTL moves tl back to base's
	// start rather than growing the array.
	base []event.Event
	// dropped counts intervals dropped past MaxIntervals, for every
	// thread of the engine (Losses.DroppedIntervals).
	dropped *uint64
	// peak is the most intervals tl held over the trims counted in trims
	// (Trim gives back an array much larger than that).
	peak, trims int
	// opens are the thread's latest file opens (most opens are too short
	// to be on the timeline): where a host operation began writing a file.
	opens [maxOpens]fileOpen
	nOpen int
}

// MaxIntervals caps one thread's timeline.
const MaxIntervals = 4096

// NewThread is thread tid of process pid with an empty timeline; the
// intervals it drops past MaxIntervals are added to *dropped (the
// engine's total; nil: not counted).
func NewThread(tid, pid uint32, dropped *uint64) *Thread {
	return &Thread{TID: tid, PID: pid, dropped: dropped}
}

// Len is how many intervals the timeline holds.
func (t *Thread) Len() int { return len(t.tl) }

// At is the timeline's i-th interval by end time (0: the oldest held).
// The caller must not change its times: the timeline stays sorted.
func (t *Thread) At(i int) *event.Event { return &t.tl[i] }

// maxOpens is how many of a thread's latest opens are kept.
const maxOpens = 8

type fileOpen struct {
	path string
	at   int64
}

// NoteOpen keeps ev, an open of a file, among the thread's latest opens.
func (t *Thread) NoteOpen(ev *event.Event) {
	if ev.Path == "" {
		return
	}
	t.opens[t.nOpen%maxOpens] = fileOpen{ev.Path, ev.Start}
	t.nOpen++
}

// OpenedSince says whether the thread opened a file at t or later.
func (t *Thread) OpenedSince(at int64) bool {
	for i := 0; i < min(t.nOpen, maxOpens); i++ {
		if o := t.opens[i]; o.path != "" && o.at >= at {
			return true
		}
	}
	return false
}

// OpenedAt is when the thread last opened path within [a, b], if it did.
func (t *Thread) OpenedAt(path string, a, b int64) (int64, bool) {
	var at int64
	found := false
	for i := 0; i < min(t.nOpen, maxOpens); i++ {
		o := t.opens[i]
		if o.path == path && o.at >= a && o.at <= b && (!found || o.at > at) {
			at, found = o.at, true
		}
	}
	return at, found
}

// Add puts ev on the timeline in end order.
func (t *Thread) Add(ev *event.Event) {
	n := len(t.tl)
	if n > 0 && t.tl[n-1].End > ev.End {
		t.Insert(ev)
		return
	}
	t.appendTL(ev)
	t.capTimeline()
}

// appendTL appends *ev (a zero event when nil). Where the array is full
// but dropFront left at least a quarter of it free at its front, tl moves
// back to the array's start (each interval is moved a few times in all)
// instead of growing into a new array: at the cap, a timeline drops one
// interval per event it takes. Otherwise the array doubles, up to
// maxArray: append's own growth (a quarter at a time past 256 intervals
// of 264 bytes) copied a thread's timeline about five times over on its
// way to the cap, 8% of the sidecar's CPU on 8 ranks.
func (t *Thread) appendTL(ev *event.Event) {
	n := len(t.tl)
	if n == cap(t.tl) && n > 0 && cap(t.base)-n > n/4 {
		copy(t.base, t.tl)
		clear(t.base[n:])
		t.tl = t.base[:n]
	}
	if n == cap(t.tl) {
		grown := make([]event.Event, n, min(max(2*n, 8), max(maxArray, n+1)))
		copy(grown, t.tl)
		t.tl = grown
		t.base = t.tl[:cap(t.tl)]
	}
	if ev != nil {
		t.tl = append(t.tl, *ev)
	} else {
		t.tl = append(t.tl, event.Event{})
	}
}

// maxArray is the array a timeline at its cap needs: MaxIntervals, one
// more taken before the oldest is dropped, and a quarter free at the
// front so that appendTL moves the timeline back rather than grow.
const maxArray = MaxIntervals + MaxIntervals/4 + 1

// capTimeline drops the oldest intervals past MaxIntervals, counted: a
// thread that blocks that often within one pending step loses the
// evidence of its oldest calls, which then count as on-CPU time.
func (t *Thread) capTimeline() {
	if k := len(t.tl) - MaxIntervals; k > 0 {
		t.dropFront(k)
		if t.dropped != nil {
			*t.dropped += uint64(k)
		}
	}
}

// Insert puts ev, which ends before the latest interval, in its place.
func (t *Thread) Insert(ev *event.Event) {
	i := sort.Search(len(t.tl), func(i int) bool { return t.tl[i].End > ev.End })
	t.appendTL(nil)
	copy(t.tl[i+1:], t.tl[i:])
	t.tl[i] = *ev
	t.capTimeline()
}

// dropFront forgets the k oldest intervals by moving the slice's start,
// not its contents: a timeline at its cap drops one interval per event,
// and moving 4096 events each time was half the sidecar's CPU on a job of
// 8 ranks. appendTL reuses the room; what was dropped is cleared for the
// GC.
func (t *Thread) dropFront(k int) {
	clear(t.tl[:k])
	t.tl = t.tl[k:]
}

// shrinkLook: Trim calls between two looks at whether a thread's array is
// much larger than its timeline has been since the last look.
const shrinkLook = MaxIntervals

// Trim forgets intervals that ended before keep.
func (t *Thread) Trim(keep int64) {
	t.peak = max(t.peak, len(t.tl))
	k := 0
	for k < len(t.tl) && t.tl[k].End < keep {
		k++
	}
	// Drop in batches: a stale head costs nothing (lookups binary-search
	// by end) while moving the timeline on every event would.
	if k > 0 && (4*k >= len(t.tl) || k >= 64) {
		t.dropFront(k)
	}
	// An array a burst grew is given back once the timeline stayed under
	// a quarter of it for shrinkLook calls: shrinking as soon as it was
	// under (each trim after a step) and growing again by doubling moved
	// the timeline and faulted in new pages over and over.
	if t.trims++; t.trims < shrinkLook {
		return
	}
	if cap(t.base) > 64 && t.peak < cap(t.base)/4 {
		t.tl = append(make([]event.Event, 0, 2*t.peak+8), t.tl...)
		t.base = t.tl[:cap(t.tl)]
	}
	t.trims, t.peak = 0, len(t.tl)
}

// wokenReturn bounds the time from the end of a post-wakeup run-queue wait
// to the sync's return for the wakeup to be the one that ended the wait:
// the driver returns a few µs after it runs again.
const wokenReturn = int64(500 * time.Microsecond)

// WokenSync ends a sync at its wakeup when the thread slept in it, was
// woken, and then waited for a CPU (a run-queue event marked Woken, which
// ends before the sync and so is already on the timeline): the GPU's work
// was done at the wakeup, and the wait for a CPU after it is contention
// inside the gap that follows, not time the GPU was busy.
func (t *Thread) WokenSync(sync *event.Event) {
	for i := len(t.tl) - 1; i >= 0; i-- {
		r := &t.tl[i]
		if r.End <= sync.Start {
			return
		}
		if r.Kind == event.KindRunqueue && r.Woken && r.Start > sync.Start && r.End <= sync.End &&
			sync.End-r.End <= wokenReturn {
			sync.End = r.Start
			return
		}
	}
}

// Returned is when a sync returned to its caller: a sync ended at its
// wakeup (WokenSync) returned once the thread got a CPU back.
func (t *Thread) Returned(sync *event.Event) int64 {
	for i := len(t.tl) - 1; i >= 0; i-- {
		r := &t.tl[i]
		if r.End <= sync.Start {
			break
		}
		if r.Kind == event.KindRunqueue && r.Woken && r.Start == sync.End {
			return r.End
		}
	}
	return sync.End
}

// Runnable is how long t waited for a CPU within [a,b): its run-queue
// intervals there (they end before a call around them does, so they are
// on the timeline when the call is processed).
func (t *Thread) Runnable(a, b int64) int64 {
	var ns int64
	for i := range t.Overlaps(a, b) {
		if ev := &t.tl[i]; ev.Kind == event.KindRunqueue {
			ns += min(ev.End, b) - max(ev.Start, a)
		}
	}
	return ns
}

// Overlapping returns the indexes of intervals that overlap [a,b).
func (t *Thread) Overlapping(a, b int64) []int {
	var out []int
	for i := range t.Overlaps(a, b) {
		out = append(out, i)
	}
	return out
}

// Overlaps yields the indexes of intervals that overlap [a,b), in timeline
// order, as Overlapping returns them without a slice: the run-queue and
// stop sums ask for them on every sync of a thread that waits for a CPU
// hundreds of times a step. The timeline must not change meanwhile.
func (t *Thread) Overlaps(a, b int64) iter.Seq[int] {
	return func(yield func(int) bool) {
		for i := t.overlapFrom(a); i < len(t.tl); i++ {
			if t.tl[i].Start < b && t.tl[i].End > t.tl[i].Start && !yield(i) {
				return
			}
		}
	}
}

// overlapFrom is the first interval that ends after a.
func (t *Thread) overlapFrom(a int64) int {
	return sort.Search(len(t.tl), func(i int) bool { return t.tl[i].End > a })
}

// priority orders overlapping intervals: a CUDA call owns the syscalls
// nested in it (a sync blocks in futex/ioctl/clock_nanosleep), runnable
// time inside a syscall is contention, off-CPU time is the weakest fact.
func priority(ev *event.Event) int {
	switch ev.Kind {
	case event.KindSync, event.KindMemcpy, event.KindAlloc, event.KindFree, event.KindGroupEnd:
		return 4
	case event.KindRunqueue:
		return 3
	case event.KindSyscall, event.KindMemcpyStaged:
		// A staged copy is the thread's own work on a CPU, like a
		// syscall's: preemption inside it is contention.
		return 2
	case event.KindOffCPU:
		return 1
	}
	return 0
}

// Segment is a piece of a thread's time: Ev is nil for on-CPU time.
type Segment struct {
	A, B int64
	Ev   *event.Event
}

// Segments splits [a,b) of t's time by the dominant interval, skipping the
// spans in mask (sorted, non-overlapping). The cuts are swept once in time
// order with the intervals open at each: comparing every interval with
// every cut took a step's walk of a thread waiting for a CPU hundreds of
// times a step quadratic time, the engine's largest cost on 8 ranks.
func (t *Thread) Segments(a, b int64, mask []interval.Span) []Segment {
	if b <= a {
		return nil
	}
	idx := t.Overlapping(a, b)
	pts := make([]int64, 0, 2*len(idx)+2)
	pts = append(pts, a, b)
	for _, i := range idx {
		if s := t.tl[i].Start; s > a {
			pts = append(pts, s)
		}
		if e := t.tl[i].End; e < b {
			pts = append(pts, e)
		}
	}
	for _, m := range mask {
		if m.A > a && m.A < b {
			pts = append(pts, m.A)
		}
		if m.B > a && m.B < b {
			pts = append(pts, m.B)
		}
	}
	slices.Sort(pts)
	// byStart holds positions in idx ordered by start; open, those of the
	// intervals begun by the current cut and not yet ended.
	byStart := make([]int32, len(idx))
	for k := range byStart {
		byStart[k] = int32(k)
	}
	slices.SortStableFunc(byStart, func(p, q int32) int { return cmp.Compare(t.tl[idx[p]].Start, t.tl[idx[q]].Start) })
	var open []int32
	next := 0
	var out []Segment
	mi := 0
	for k := 0; k+1 < len(pts); k++ {
		x, y := pts[k], pts[k+1]
		if y <= x {
			continue
		}
		for mi < len(mask) && mask[mi].B <= x {
			mi++
		}
		if mi < len(mask) && mask[mi].A <= x && mask[mi].B >= y {
			continue
		}
		for ; next < len(byStart) && t.tl[idx[byStart[next]]].Start <= x; next++ {
			open = append(open, byStart[next])
		}
		n := 0
		for _, p := range open {
			if t.tl[idx[p]].End > x {
				open[n] = p
				n++
			}
		}
		open = open[:n]
		// The highest priority covering [x,y); among equals, the first
		// in timeline order.
		var best *event.Event
		bp, bpos := 0, int32(len(idx))
		for _, p := range open {
			ev := &t.tl[idx[p]]
			if ev.End < y {
				continue
			}
			if pr := priority(ev); pr > bp || pr == bp && pr > 0 && p < bpos {
				best, bp, bpos = ev, pr, p
			}
		}
		if n := len(out); n > 0 && out[n-1].Ev == best && out[n-1].B == x {
			out[n-1].B = y
			continue
		}
		out = append(out, Segment{A: x, B: y, Ev: best})
	}
	return out
}

// OffRun says whether ev is time its thread could not run outside any
// call: a wait for a CPU, or blocking outside any traced call.
func OffRun(ev *event.Event) bool {
	return ev.Kind == event.KindRunqueue || ev.Kind == event.KindOffCPU
}

// Stopped is how long t could not run outside its calls within [a,b).
func (t *Thread) Stopped(a, b int64) int64 {
	var ns int64
	for i := range t.Overlaps(a, b) {
		if ev := &t.tl[i]; OffRun(ev) {
			ns += min(ev.End, b) - max(ev.Start, a)
		}
	}
	return ns
}

// StoppedFrom is when t first ran at or after a, before b: the end of the
// chain of times it could not run that begins at a.
func (t *Thread) StoppedFrom(a, b int64) int64 {
	for i := range t.Overlaps(a, b) {
		ev := &t.tl[i]
		if !OffRun(ev) {
			continue
		}
		if ev.Start > a {
			break
		}
		a = min(max(a, ev.End), b)
	}
	return a
}

// RanBack is when t's last `run` ns of running time before `to` began:
// the time it could not run in between does not count. No earlier than
// from.
func (t *Thread) RanBack(from, to, run int64) int64 {
	x := to
	// The intervals overlapping [from, to), latest first.
	first := t.overlapFrom(from)
	for i := len(t.tl) - 1; i >= first; i-- {
		ev := &t.tl[i]
		if ev.Start >= to || ev.End <= ev.Start || !OffRun(ev) {
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
