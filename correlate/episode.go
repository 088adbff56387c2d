package correlate

import (
	"time"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/ranks"
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// Host operations that move device data inside a gap.
//
// An async copy issued while the queue is drained is normally the next
// step's first work (x.to(device)), and it ends the gap. Two patterns say
// otherwise, and only later events tell them apart:
//
//   - Pageable copies: a copy from or to pageable host memory keeps the
//     host in the call while the driver stages it through a pinned buffer
//     (KindMemcpyStaged follows the copy). Compute stays idle until the
//     copy returns: the gap ends there, and the staging is cuda.memcpy.
//   - Episodes: torch.save of a CUDA state_dict copies each tensor to the
//     host and waits for it (a copy, then a sync, no kernel), serializes it
//     and writes it. The GPU does a few µs of copy work per tensor; compute
//     is idle throughout. Such copies and their syncs are host activity
//     inside one gap, and the gap is labelled by the operation's dominant
//     host activity (Evidence.Episode).
//
// So a copy issued into an open gap is held: the copy's own staged return
// and a sync of the same thread that only waited for it keep it inside the
// gap; anything else (a launch, other GPU work, a sync that waited for
// more, another call of the thread) releases it as the ordinary enqueue it
// was, at its staged return when it had one.

// episodeHop is how soon after a held copy returns a sync must begin to be
// the wait for that copy (.cpu() is a copy and a sync back to back); a step
// puts its launches between. A copy's return is known only when the driver
// kept the thread in it at least the tracer's staging threshold (200 µs),
// so the hop counts from its entry and allows for that much of the call.
const episodeHop = int64(400 * time.Microsecond)

// heldCopies are async copies one thread issued into an open gap, not yet
// known to be step work or part of a host operation.
type heldCopies struct {
	tid  uint32
	evs  []event.Event
	last int64 // the latest copy's return (its staged end) or entry
	// chained: each copy began within episodeHop of the previous one's
	// return, as a host operation's calls do; a step launches between.
	chained bool
}

// episode is what an open gap absorbed: device copies and the syncs that
// waited for them, issued by the blocked thread itself.
type episode struct {
	copies int
	bytes  uint64
	syncs  int
	// bulk: a copy moved more than a scalar read does. Scalar reads
	// absorbed alone (full probes saw no launch around them) keep the gap
	// open but make no episode of it.
	bulk bool
}

// episodeEvent handles the events of an open gap's host operations and
// releases held copies that turn out to be step work. It reports whether
// ev was consumed here (the engine then does nothing else with it).
func (p *proc) episodeEvent(x env, th *attribute.Thread, ev *event.Event) bool {
	if ev.Kind != event.KindMemcpyStaged && p.aside(th, ev) {
		// Another thread's copies (a saver beside the loop) are its own
		// activity: they neither join the loop's gap nor release the
		// loop's held copies (loopthread.go).
		return false
	}
	switch ev.Kind {
	case event.KindMemcpyStaged:
		th.Add(ev)
		p.onStaged(th, ev)
		return true
	case event.KindMemcpyAsync:
		if p.hold != nil && p.hold.tid != th.TID {
			p.release(x)
		}
		if p.gap.cur() != nil && p.everEnq {
			if p.hold == nil {
				p.hold = &heldCopies{tid: th.TID, chained: true}
			} else if !soonAfter(th, p.hold.last, ev.Start) {
				p.hold.chained = false
			}
			p.hold.evs = append(p.hold.evs, *ev)
			p.hold.last = max(p.hold.last, ev.End)
			return true
		}
		return false
	case event.KindSync:
		if p.absorbSync(x, th, ev) {
			return true
		}
	}
	if p.hold != nil && p.releasedBy(th, ev) {
		p.release(x)
	}
	return false
}

// onStaged: a copy kept its thread in the call. A held copy's gap lasts
// through it; a copy that was already enqueued (the queue held work) made
// its thread block like any other blocking call.
func (p *proc) onStaged(th *attribute.Thread, ev *event.Event) {
	if h := p.hold; h != nil && h.tid == th.TID {
		for i := range h.evs {
			if h.evs[i].Start == ev.Start {
				h.evs[i].End = ev.End
				h.last = max(h.last, ev.End)
				return
			}
		}
	}
	p.onBlocking(th, ev)
}

// releasedBy says whether ev shows that the held copies were step work:
// any call of their thread other than scheduling facts, or GPU work or a
// sync of another thread.
func (p *proc) releasedBy(th *attribute.Thread, ev *event.Event) bool {
	if th.TID == p.hold.tid {
		switch ev.Kind {
		case event.KindRunqueue, event.KindOffCPU:
			return false
		}
		return true
	}
	switch ev.Kind {
	case event.KindEnqueue, event.KindMemcpyAsync, event.KindMemset, event.KindCollective,
		event.KindSync, event.KindMemcpy, event.KindFree:
		return true
	}
	return false
}

// absorbSync takes a sync into the open gap when it only waited for the
// held copies of its own thread: the copies and the sync came back to back
// and no kernel ran in between. Full: the sync flushed no launches and no
// launch released the copies. Lite, where launches are invisible: the
// copies read device data (device to host, or a staged copy of unknown
// direction: a step starts with host-to-device batch copies) and the sync
// waited no longer than their transfer takes, where a step's sync waits for
// its compute.
func (p *proc) absorbSync(x env, th *attribute.Thread, ev *event.Event) bool {
	h := p.hold
	if h == nil || p.gap.cur() == nil || h.tid != th.TID || !h.chained || !soonAfter(th, h.last, ev.Start) {
		return false
	}
	// Launches the sync flushes (full) were made between the copies and the
	// sync, unless the thread's last launch came before the first copy
	// (a burst the gap began after, quiet.go).
	if ev.Count > 0 && (ev.LastLaunch == 0 || ev.LastLaunch >= h.evs[0].Start) {
		return false
	}
	lite := x.liteOver(p.gap.cur().start, ev.End)
	big := bulk(h.evs)
	if (p.gap.cur().ep == nil || !p.gap.cur().ep.bulk) && !big && lite && !th.OpenedSince(p.gap.cur().start) {
		// Lite: a scalar read (.item(): a few bytes and a sync) may follow
		// launches lite cannot see, so it is step work; only a copy of
		// real data, or one made after the thread opened a file in the
		// gap (torch.save's first tensors can be a bias or BatchNorm's
		// counter), starts a host operation, whose later small tensors
		// then belong to it. With launches seen, none came between the
		// drain and these copies: the GPU computes nothing either way.
		return false
	}
	th.WokenSync(ev)
	if lite {
		// Waiting for a CPU inside the call is not waiting for the GPU;
		// waiting for the copies' own transfer (to pinned memory the copy
		// returns at once and the sync waits for it), at a slow link's
		// rate, is not waiting for compute either.
		if ev.Duration()-th.Runnable(ev.Start, ev.End) > x.set.syncWaited+transferNS(h.evs) {
			return false
		}
		for i := range h.evs {
			c := &h.evs[i]
			if c.CopyDir != event.CUMemcpyDtoH && (c.CopyDir != event.CUMemcpyOther || c.End == c.Start) {
				return false
			}
		}
	}
	ep := p.gap.cur().ep
	if ep == nil {
		ep = &episode{}
		p.gap.cur().ep = ep
	}
	for i := range h.evs {
		ep.copies++
		ep.bytes += h.evs[i].Bytes
	}
	ep.syncs++
	ep.bulk = ep.bulk || big
	p.hold = nil
	// The step clock sees the copies and the sync as before: it counts
	// steps by the syncs and copies the loop makes, whatever the gap is
	// (a step's last copy and sync after a scalar read drained the queue
	// look the same as a checkpoint's tensor).
	for i := range h.evs {
		p.stepCopy(x, &h.evs[i])
	}
	p.patternSync(x, ev)
	if n := len(p.st.hist); n > 0 && p.st.hist[n-1].End == ev.End {
		p.st.hist[n-1].Absorbed = true
	}
	if ep.bulk {
		p.st.hostOp(p.gap.cur().start)
	}
	// On the timeline the sync is what it waited for: the copies.
	w := *ev
	w.Kind = event.KindMemcpy
	th.Add(&w)
	return true
}

// stepCopy is what an absorbed async copy tells the step clock
// (onEnqueue's part that does not touch the queue model or the gap). It
// reads device data for the host: the host's pause after the last sync
// goes on.
func (p *proc) stepCopy(x env, ev *event.Event) {
	p.copies++
	t := ev.Start
	p.st.dev = x.d
	p.stepToken(x, ev, -1, t)
}

// release hands the held copies to the queue model as the enqueues they
// were. A staged copy enqueued its last bytes at its return, and compute
// could not resume before: it ends the gap there.
func (p *proc) release(x env) {
	h := p.hold
	if h == nil {
		return
	}
	p.hold = nil
	th := x.w.threads[h.tid]
	if th == nil {
		return
	}
	for i := range h.evs {
		ev := h.evs[i]
		ev.Start = ev.End
		p.onEnqueue(x, th, &ev, nil, ranks.Ref{})
	}
}

// episodeResult labels a gap that absorbed a host operation's device
// copies by the operation's dominant host activity: serialization between
// the writes of one file is part of writing it (torch.save pickles a
// tensor, writes it, pickles the next). When writing wins, bd counts that
// serialization as io.write too, so that totals by cause say what the
// checkpoint cost; the evidence keeps the plain split.
func episodeResult(th *attribute.Thread, a, b int64, ep *episode, bd map[Cause]int64) (Cause, *EpisodeEvidence) {
	e := &EpisodeEvidence{Copies: ep.copies, CopyBytes: ep.bytes}
	segs := th.Segments(a, b, nil)
	for _, s := range segs {
		ev := s.Ev
		switch {
		case ev == nil:
			e.SerializeNS += s.B - s.A
		case ev.Kind == event.KindMemcpy || ev.Kind == event.KindMemcpyStaged:
			e.CopyNS += s.B - s.A
		case attribute.PathOp(ev):
			// Renaming the written file into place, removing an old
			// one: part of writing, but not the file whose writes
			// bound the operation (below).
			e.WriteNS += s.B - s.A
		case writesFile(ev):
			if ev.Syscall == event.SysFsync {
				e.FsyncNS += s.B - s.A
			} else {
				e.WriteNS += s.B - s.A
			}
		}
	}
	var best *fileSpan
	e.File, best = writtenFile(th, a, segs)
	// The thread's own calls: a write of ev counts once however many
	// segments it was split into.
	seen := map[*event.Event]bool{}
	for _, s := range segs {
		if ev := s.Ev; ev != nil && !seen[ev] && ev.Kind == event.KindSyscall && ev.Path == e.File &&
			ev.Syscall == event.SysWrite && e.File != "" {
			seen[ev] = true
			e.Writes++
			if ev.Ret > 0 {
				e.WriteBytes += uint64(ev.Ret)
			}
		}
	}
	// The operation writes its file from the moment it opened it to its
	// last write or fsync: torch.save pickles the object tree, copies each
	// tensor to the host, reads what it imports and faults pages in
	// between. All of that but the waits for a CPU is writing the file.
	var within, serial, copying int64
	// outside: the gap's host waits before the file's open or after its
	// last write, by cause; they stay what they were.
	outside := map[Cause]int64{}
	if best != nil {
		for _, s := range segs {
			lo, hi := max(s.A, best.first), min(s.B, best.last)
			if s.Ev != nil && s.Ev.Kind != event.KindRunqueue {
				if out := s.B - s.A - max(hi-lo, 0); out > 0 {
					outside[attribute.BaseCause(s.Ev)] += out
				}
			}
			if hi <= lo {
				continue
			}
			if ev := s.Ev; ev != nil && (ev.Kind == event.KindRunqueue || writesFile(ev)) {
				continue
			}
			within += hi - lo
			switch {
			case s.Ev == nil:
				serial += hi - lo
			case s.Ev.Kind == event.KindMemcpy || s.Ev.Kind == event.KindMemcpyStaged:
				copying += hi - lo
			}
		}
	}
	dom, top := CauseCPU, int64(-1)
	for _, c := range Causes {
		ns := bd[c]
		switch c {
		case CauseIOWrite:
			ns += within
		case CauseCPU:
			ns -= min(within, ns)
		}
		if ns > top {
			dom, top = c, ns
		}
	}
	e.Kind = "device-copies"
	if dom == CauseIOWrite {
		e.Kind = "checkpoint"
		// What the checkpoint cost is writing it: the totals count its
		// serialization, its own device-to-host copies and the rest of its
		// span as io.write (the evidence keeps the split).
		move := func(c Cause, ns int64) int64 {
			if ns = min(ns, bd[c]-outside[c]); ns <= 0 {
				return 0
			}
			bd[CauseIOWrite] += ns
			if bd[c] -= ns; bd[c] <= 0 {
				delete(bd, c)
			}
			return ns
		}
		left := within - move(CauseCPU, serial) - move(CauseCUDAMemcpy, copying)
		for _, c := range []Cause{CauseOther, CauseIORead, CauseLock, CauseSleep} {
			left -= move(c, left)
		}
	}
	return dom, e
}

// writesFile says whether ev is a write or fsync of a file.
func writesFile(ev *event.Event) bool {
	return ev.Kind == event.KindSyscall && attribute.IsFile(ev) && (ev.Syscall == event.SysWrite || ev.Syscall == event.SysFsync)
}

// fileSpan is where a host operation wrote one file: from the file's open
// (or its first write) to its last write, fsync, or the rename or unlink
// after them; ns is the time in its writes and fsyncs.
type fileSpan struct{ first, last, ns int64 }

// openLookback is how long before a gap the file it writes may have been
// opened and still be the operation the gap belongs to; a log file opened
// at the job's start is not.
const openLookback = int64(2 * time.Second)

// writtenFile is the file the thread spent longest writing and fsyncing
// among segs (a gap from a), and where it wrote it; nil when it wrote none.
func writtenFile(th *attribute.Thread, a int64, segs []attribute.Segment) (string, *fileSpan) {
	files := map[string]*fileSpan{}
	for _, s := range segs {
		if ev := s.Ev; ev != nil && !attribute.PathOp(ev) && writesFile(ev) {
			f := files[ev.Path]
			if f == nil {
				f = &fileSpan{first: s.A}
				files[ev.Path] = f
			}
			f.last, f.ns = s.B, f.ns+s.B-s.A
		}
	}
	var path string
	var best *fileSpan
	for p, f := range files {
		if best == nil || f.ns > best.ns || f.ns == best.ns && p < path {
			best, path = f, p
		}
	}
	if best == nil {
		return "", nil
	}
	// The file may have been opened before the gap: a host ahead of its
	// queue opens the checkpoint, and the gap begins when the first
	// tensor's copy waits the queue out. What follows in the gap is the
	// operation all the same.
	if at, ok := th.OpenedAt(path, a-openLookback, best.first); ok {
		best.first = max(at, a)
	}
	best.last = pathOpsAfter(segs, best.last)
	return path, best
}

// episodeSplit is where a checkpoint's gap [a, b) stops being the
// checkpoint: the end of its file's span, when what follows is mostly,
// and at least minGap of, waits on something else (a lock, the next
// batch's pageable copy, a read, the network): a gap of its own. A host that
// saves and then waits for another thread's lock has two causes back to
// back, and one gap labelled by the larger would hide the other. 0 when
// the gap is one operation.
func episodeSplit(th *attribute.Thread, a, b, minGap int64) int64 {
	segs := th.Segments(a, b, nil)
	_, f := writtenFile(th, a, segs)
	if f == nil || b-f.last < minGap {
		return 0
	}
	var waits int64
	for _, s := range segs {
		if s.Ev == nil || s.B <= f.last || s.Ev.Kind == event.KindRunqueue || s.Ev.Kind == event.KindOffCPU {
			continue
		}
		switch attribute.BaseCause(s.Ev) {
		case CauseCPU, CauseCPUContention, CauseIOWrite:
			continue
		}
		waits += s.B - max(s.A, f.last)
	}
	if waits < minGap || 2*waits < b-f.last {
		// Host work with short waits between (the loop's bookkeeping
		// after the save, the next batch's first copy) is no wait of its
		// own: the gap stays one.
		return 0
	}
	return f.last
}

// pathOpTail: the most host time between a file's last write and a rename
// or unlink that still finishes writing it (closing the file, the Python
// around os.replace).
const pathOpTail = int64(5 * time.Millisecond)

// pathOpsAfter extends an operation that ended writing its file at last
// through the calls on file names that follow it with nothing else between
// but short host work: os.replace of the temporary file it wrote over the
// checkpoint, the unlink of an older checkpoint. On ext4 or XFS replacing
// or removing a large file frees its blocks within the call: milliseconds
// of the save.
func pathOpsAfter(segs []attribute.Segment, last int64) int64 {
	end := last
	for _, s := range segs {
		if s.B <= end {
			continue
		}
		ev := s.Ev
		switch {
		case ev != nil && attribute.PathOp(ev):
			last, end = s.B, s.B
		case ev == nil:
			if s.B-max(s.A, end) > pathOpTail {
				return last
			}
			end = s.B
		case ev.Kind == event.KindRunqueue || ev.Kind == event.KindOpen || ev.Kind == event.KindClose ||
			ev.Kind == event.KindSyscall && (ev.Syscall == event.SysClose || ev.Syscall == event.SysOpen):
			end = s.B
		default:
			return last
		}
	}
	return last
}

// soonAfter says whether t's call at b followed its call that returned at
// a back to back: within episodeHop of running time (a preemption between
// the two is the machine's load, not the thread's work).
func soonAfter(t *attribute.Thread, a, b int64) bool {
	return b-a-t.Runnable(a, b) <= episodeHop
}

// transferNS is how long the copies take at most at burstCopyBps.
func transferNS(evs []event.Event) int64 {
	var b uint64
	for i := range evs {
		b += evs[i].Bytes
	}
	return int64(float64(b) / burstCopyBps * 1e9)
}

// bulk says whether any of the copies moved more than a scalar read does.
func bulk(evs []event.Event) bool {
	for i := range evs {
		if evs[i].Bytes > stepclock.ScalarBytes {
			return true
		}
	}
	return false
}
