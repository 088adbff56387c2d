package attribute

import (
	"sort"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// A feeder's wait for a CPU before a wait on another task.
//
// A feeder that waits for a CPU and then still blocks on a data-loader
// worker, a lock holder or another thread lost nothing to the wait for a
// CPU: given a CPU at once it would have blocked that much longer, and the
// gap would have ended when the worker delivered (the holder let go) all
// the same. Its run-queue time is charged as the wait that follows it is,
// for as long as the worker (holder) was working meanwhile: on a CPU,
// waiting for one or in a call of its own, not itself waiting on another
// task. Run-queue time after which the feeder blocks on nobody (its own
// work preempted, a wakeup left waiting for a CPU before a launch) stays
// cpu.contention: there the machine's load is what lengthened the gap.

// callAfter is, for each segment, the index of the first later segment
// that is a call (neither on-CPU time nor a run-queue wait) with only
// on-CPU time and run-queue waits between them and no hole (a masked
// span); -1 where there is none. Nil when no segment is a run-queue wait.
func callAfter(segs []Segment) []int {
	any := false
	for _, s := range segs {
		if s.Ev != nil && s.Ev.Kind == event.KindRunqueue {
			any = true
			break
		}
	}
	if !any {
		return nil
	}
	next := make([]int, len(segs))
	nxt := -1
	for i := len(segs) - 1; i >= 0; i-- {
		next[i] = nxt
		if e := segs[i].Ev; e != nil && e.Kind != event.KindRunqueue {
			nxt = i
		}
		if i > 0 && segs[i-1].B != segs[i].A {
			nxt = -1
		}
	}
	return next
}

// queued charges segs[i] of feeder th when it is a run-queue wait followed
// (next, from callAfter) by a wait on another task, and reports whether it
// did; the caller charges it as its own cause otherwise.
func (at *Attribution) queued(world World, th *Thread, segs []Segment, i int, next []int) bool {
	s := segs[i]
	if next == nil || s.Ev == nil || s.Ev.Kind != event.KindRunqueue || next[i] < 0 || s.B <= s.A {
		return false
	}
	w := segs[next[i]]
	if !isWait(w.Ev) {
		return false
	}
	if at.waitAt != next[i]+1 {
		// Run-queue waits before one wait (a thread preempted again and
		// again) ask what it waited on once.
		at.waitAt, at.waitT = next[i]+1, at.waitedOn(world, th, w.Ev, w.A, w.B, 0)
	}
	t := at.waitT
	ns := s.B - s.A
	switch {
	case t.loader != 0:
		work := workingProc(world, t.loader, s.A, s.B)
		at.total += ns
		at.byCause[CauseLoaderWait] += work
		at.byCause[CauseCPUContention] += ns - work
		at.note(world, th, s.Ev, ns)
		if work > 0 {
			at.worker(world, t.loader, s.A, s.B)
		}
	case t.sib != nil:
		at.total += ns
		at.note(world, th, s.Ev, ns)
		at.queuedOnSibling(world, w.Ev, t.sib, s.A, s.B)
	case t.lock:
		at.total += ns
		at.byCause[CauseLock] += ns
		at.note(world, th, s.Ev, ns)
	default:
		return false
	}
	return true
}

// queuedOnSibling charges the feeder's run-queue wait over [a,b), before
// its wait ev on sibling sib, as that wait is charged (sibling) where sib
// worked, and as cpu.contention where sib itself waited on another task
// (other than a loader worker, whose wait it passes on) or was idle.
func (at *Attribution) queuedOnSibling(world World, ev *event.Event, sib *Thread, a, b int64) {
	for _, ss := range sib.Segments(a, b, nil) {
		if ss.Ev != nil && (idle(ss.Ev) || isWait(ss.Ev) && at.waitedOn(world, sib, ss.Ev, ss.A, ss.B, 1).loader == 0) {
			at.byCause[CauseCPUContention] += ss.B - ss.A
			continue
		}
		if ev.Syscall == event.SysFutex {
			at.holder = at.lockHolder(sib)
			at.holder.ev.NS += ss.B - ss.A
			at.gil = gilWait(ev.Stack)
		}
		at.segment(world, sib, ss, 1)
		at.holder, at.gil = nil, false
	}
}

// idle reports time a thread was off its CPU outside any traced call:
// blocked on something the tracer does not see, not working.
func idle(ev *event.Event) bool {
	return ev.Kind == event.KindOffCPU && ev.Path == ""
}

// handOver reports a write into a pipe: a worker handing its batch over,
// blocked while the feeder has not read the last one; waiting on the
// feeder, not working for it.
func handOver(ev *event.Event) bool {
	return ev.Kind == event.KindSyscall && ev.Syscall == event.SysWrite && ev.FDKind == event.FDPipe
}

// workingProc is how much of [a,b) some thread of process pid worked: was
// on a CPU, runnable or in a call of its own, not waiting on another task
// (a loader worker's idle wait on its index queue, a queue feeder thread's
// condition, a write into the pipe the feeder has not emptied) nor idle. A process none of whose threads is known (a worker
// forked before an attach that has emitted nothing yet) counts as working,
// as the wait on it does.
func workingProc(world World, pid uint32, a, b int64) int64 {
	var spans []interval.Span
	known := false
	for tid := range world.TIDs(pid) {
		th := world.Thread(tid)
		if th == nil || th.PID != pid {
			continue
		}
		known = true
		for _, s := range th.Segments(a, b, nil) {
			if s.Ev == nil || !idle(s.Ev) && !isWait(s.Ev) && !handOver(s.Ev) {
				spans = append(spans, interval.Span{A: s.A, B: s.B})
			}
		}
	}
	if !known {
		return b - a
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].A < spans[j].A })
	var ns int64
	end := a
	for _, sp := range spans {
		if sp.B > end {
			ns += sp.B - max(sp.A, end)
			end = sp.B
		}
	}
	return ns
}
