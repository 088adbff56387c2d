package attribute

import (
	"strings"

	"github.com/gaptrace/gaptrace/event"
)

// What a wait waited on: a data-loader worker, a sibling thread (a lock
// holder, a thread feeding a queue), or the interpreter's own lock.

// computing says whether a sibling woken from spent the wait on the CPU
// (runnable counts: it held the lock all the same). One that blocked in
// I/O or on the network was producing what the feeder waited for, and that
// blocking is the cause, not a lock. A futex call still running at the
// wait's end (wake), or one that woke a waiter (FUTEX_WAKE returns how many
// it woke) and returned before the feeder, woken in it, got a CPU back, is
// the unlock that woke the feeder, not a block: the release of a contended
// lock can take longer than the tracer's threshold.
func computing(segs []Segment, wake int64) bool {
	for _, ss := range segs {
		if ss.Ev == nil || ss.B <= ss.A || ss.Ev.Kind == event.KindRunqueue || BaseCause(ss.Ev) == CauseCPU {
			continue
		}
		if ss.Ev.Kind == event.KindSyscall && ss.Ev.Syscall == event.SysFutex && (ss.B >= wake || ss.Ev.Ret > 0) {
			continue
		}
		return false
	}
	return true
}

// etimedout is -ETIMEDOUT, a futex wait's return when its timeout expired.
const etimedout = -110

// maxRetries bounds the timed-out waits followed to the wait that was woken.
const maxRetries = 8

// retriedWait: a lock taken through a condition variable with a timeout
// shows as futex waits that time out, each followed at once by the next
// wait. CPython's take_gil is the common case: it waits the switch
// interval (5 ms), asks the holder to drop the GIL and waits again, and
// only that last wait is woken by the holder. A timed-out futex wait
// followed within absorbNS by another futex wait (through more timeouts)
// is part of the wait that one ended in: that wait is returned when its
// waker is another thread of the same process, else nil.
func retriedWait(th *Thread, ev *event.Event) *event.Event {
	cur := ev
	for range maxRetries {
		if cur.Kind != event.KindSyscall || cur.Syscall != event.SysFutex || cur.Ret != etimedout {
			return nil
		}
		var next *event.Event
		for i := range th.Overlaps(cur.End, cur.End+absorbNS) {
			c := &th.tl[i]
			if c != cur && c.Kind == event.KindSyscall && c.Syscall == event.SysFutex &&
				c.Start >= cur.End && c.Start-cur.End <= absorbNS && (next == nil || c.Start < next.Start) {
				next = c
			}
		}
		if next == nil {
			return nil
		}
		if next.WakerPID == th.PID && next.WakerTID != 0 && next.WakerTID != th.TID {
			return next
		}
		cur = next
	}
	return nil
}

// pythonLockWait: the stack of a wait whose innermost frames are system
// code (libc's condition or semaphore wait, libffi returning from a ctypes
// call, the interpreter, whose own frames are replaced by the Python ones)
// called from Python code: a wait of CPython's, for the GIL (take_gil, as
// a ctypes call takes it back on return) or a threading lock. The frame
// walk often loses the condition wait itself (libc's internals have no
// frame pointers, CPython is built without them), so any system frames
// will do; a native program's own wait has no Python frame above them. A
// Python frame names a .py file (or a <frozen …> module).
func pythonLockWait(stack []event.Frame) bool {
	lock, _ := pythonWait(stack)
	return lock
}

// gilWait: a Python lock wait (pythonLockWait) in a condition wait, which
// is how CPython waits for the GIL: take_gil waits timed (its switch
// interval), and a thread that dropped the GIL on another's request waits
// untimed in drop_gil until that thread has taken it (the forced switch,
// pthread_cond_wait); threading's locks, queues and events wait on a
// semaphore instead. The thread waited for the interpreter, not for what
// the holder was making: whatever the holder did meanwhile (a copy, a
// write it made without dropping the GIL, or with it dropped, a logging
// thread's write into a slow pipe that took the GIL between records) is
// the lock's time.
func gilWait(stack []event.Frame) bool {
	lock, cond := pythonWait(stack)
	return lock && cond
}

// pythonWait walks a wait's stack once, from its innermost frame to the
// first Python frame: lock is pythonLockWait, cond that a system frame
// on the way is a condition wait (timed or not).
func pythonWait(stack []event.Frame) (lock, cond bool) {
	for _, f := range stack {
		if strings.HasSuffix(f.File, ".py") || strings.HasPrefix(f.File, "<frozen ") {
			return true, cond
		}
		if !strings.HasPrefix(f.File, "/") || !event.SystemCode(f.File) {
			return false, false // a frame of the job's own code before any wait
		}
		if strings.Contains(f.Function, "pthread_cond_timedwait") || strings.Contains(f.Function, "pthread_cond_clockwait") ||
			strings.Contains(f.Function, "pthread_cond_wait") {
			cond = true
		}
	}
	return false, false
}

// timedOut reports a futex wait that ended by its timeout.
func timedOut(ev *event.Event) bool {
	return ev.Kind == event.KindSyscall && ev.Syscall == event.SysFutex && ev.Ret == etimedout
}

// computingSibling is the thread of th's process that computed throughout
// [a,b) (on a CPU or runnable, never blocked), seen to run during it (an
// event that ended after a: a thread that computes emits little else),
// with the most time on a CPU or runnable; nil if none. A timed-out lock wait whose
// retry was too short to be traced (the holder dropped the lock at once
// on request) has no waker: the thread that held the CPU meanwhile is the
// holder.
func (at *Attribution) computingSibling(world World, th *Thread, a, b int64) *Thread {
	tids := world.TIDs(th.PID)
	if tids == nil {
		return nil
	}
	var best *Thread
	var bestCPU int64
	for tid := range tids {
		sib := world.Thread(tid)
		if sib == nil || sib == th || sib.PID != th.PID || sib.Last <= a {
			continue
		}
		segs := sib.Segments(a, b, nil)
		if !computing(segs, b) {
			continue
		}
		var cpu int64
		for _, ss := range segs {
			// Runnable counts: a holder starved of a CPU still holds the lock.
			if ss.Ev == nil || ss.Ev.Kind == event.KindRunqueue {
				cpu += ss.B - ss.A
			}
		}
		if 2*cpu < b-a {
			continue
		}
		if best == nil || cpu > bestCPU || (cpu == bestCPU && sib.TID < best.TID) {
			best, bestCPU = sib, cpu
		}
	}
	return best
}

// waitTarget is what a wait waited on: the data-loader worker process
// loader, the sibling thread sib, or (lock) a lock of the interpreter
// whose holder was not seen; zero when none of them.
type waitTarget struct {
	loader uint32
	sib    *Thread
	lock   bool
}

// waitedOn is what th's wait ev, over [a,b), waited on: its waker, or for
// a wait a timer ended, the wait it was retried in or the sibling that
// computed meanwhile. Siblings and the interpreter's lock are followed
// from the feeder only (depth 0), loader workers from anyone.
func (at *Attribution) waitedOn(world World, th *Thread, ev *event.Event, a, b int64, depth int) waitTarget {
	w, wtid := ev.WakerPID, ev.WakerTID
	timer := timedOut(ev) || strayWake(world, th, ev)
	if timer && (w != th.PID || wtid == th.TID) {
		// A timer ended it: the task it interrupted is recorded as the
		// waker. A sibling was at least on a CPU then; anyone else woke
		// nobody.
		w, wtid = 0, 0
		if depth == 0 {
			if r := retriedWait(th, ev); r != nil {
				w, wtid = r.WakerPID, r.WakerTID
			} else if sib := at.computingSibling(world, th, a, b); sib != nil {
				w, wtid = th.PID, sib.TID
			}
		}
	}
	if w != 0 && w != th.PID && world.LoaderWaker(ev, th.PID) {
		return waitTarget{loader: w}
	}
	if depth == 0 && w == th.PID && wtid != 0 && wtid != th.TID {
		if sib := world.Thread(wtid); sib != nil && sib.PID == th.PID {
			return waitTarget{sib: sib}
		}
	}
	if depth == 0 && w == 0 && timer && pythonLockWait(ev.Stack) {
		return waitTarget{lock: true}
	}
	return waitTarget{}
}

// strayWake reports a futex wait of th woken from another process that is
// no loader worker. A futex of the job's own is woken by its own threads;
// a waker elsewhere is the task a timer interrupt found running when the
// wait's timeout expired (CPython's GIL wait, woken by its timer, can
// still return 0 where the holder's signal came while it waited for a
// CPU). It is judged as a timed-out wait.
func strayWake(world World, th *Thread, ev *event.Event) bool {
	return ev.Kind == event.KindSyscall && ev.Syscall == event.SysFutex && ev.WakerPID != 0 &&
		ev.WakerPID != th.PID && !world.LoaderWaker(ev, th.PID)
}

// sibling charges ns of a feeder's wait ev on sibling sib over [a,b) to
// what sib did meanwhile. A futex it woke the feeder from is a lock (a
// mutex, the GIL, a condition) it held: what it did meanwhile is the
// lock's time, unless it waited on the job's data (heldWhile); all of it
// where the lock was the GIL (gilWait).
func (at *Attribution) sibling(world World, ev *event.Event, sib *Thread, a, b, ns int64) {
	if ev.Syscall == event.SysFutex {
		at.holder = at.lockHolder(sib)
		at.holder.ev.NS += ns
		at.gil = gilWait(ev.Stack)
	}
	segs := sib.Segments(a, b, nil)
	for i, ss := range segs {
		if c := at.absorbed(world, sib, segs, i); c != "" && at.holder != nil && !at.gil {
			// The holder's read loop: its slivers between reads are
			// reading, as the feeder's own are (Add).
			at.holder.did(c, ss.B-ss.A, "", "")
			at.byCause[heldWhile(c)] += ss.B - ss.A
			continue
		}
		at.segment(world, sib, ss, 1)
	}
	at.holder, at.gil = nil, false
}
