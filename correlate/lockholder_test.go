package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// Lock holders and GIL waits: a feeder that waited on a lock held by a
// sibling computing is charged what the sibling did.

// TestLockHolderComputing: the feeder waits on a futex that a sibling
// thread holds while it computes (a mutex, the GIL), and the sibling wakes
// it: the gap is lock, with the sibling as holder, also while the holder
// waited for a CPU (a loaded machine) or was slow to release. A sibling that instead
// read a file meanwhile was producing, and stays io.read (golden replay).
func TestLockHolderComputing(t *testing.T) {
	s := newSim()
	const sib = 101
	var waits int64
	for n := int64(1); n <= 40; n++ {
		if n == 1 {
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: sib, Start: s.t, End: s.t + 10*us,
				Syscall: event.SysSleep, Name: "nanosleep", TaskComm: "bg-worker"})
		}
		if n%8 == 0 {
			// On a loaded machine the feeder, woken at the unlock, waits
			// for a CPU, and the holder is already back in its blocking
			// read of the next request when the feeder's wait returns:
			// that read began after the lock was released.
			s.evs = append(s.evs, event.Event{Kind: event.KindRunqueue, PID: s.pid, TID: sib, Start: s.t + 5*ms, End: s.t + 12*ms},
				event.Event{Kind: event.KindSyscall, PID: s.pid, TID: sib, Start: s.t + 17*ms, End: s.t + 21*ms,
					Syscall: event.SysRead, Name: "read", FD: 5, FDKind: event.FDPipe})
		} else if n%4 == 0 {
			// The holder is preempted for a while: it still holds the lock.
			// Its unlock's FUTEX_WAKE is slow enough to be traced, and
			// returns after the feeder's wait, or (n 12, 28: the feeder,
			// woken in it, got a CPU first) just before.
			end := s.t + 20*ms + 5*us
			if n == 12 || n == 28 {
				end = s.t + 20*ms - 10*us
			}
			s.evs = append(s.evs, event.Event{Kind: event.KindRunqueue, PID: s.pid, TID: sib, Start: s.t + 5*ms, End: s.t + 12*ms},
				event.Event{Kind: event.KindSyscall, PID: s.pid, TID: sib, Start: s.t + 20*ms - 70*us, End: end,
					Syscall: event.SysFutex, Name: "futex", Ret: 1})
		}
		if n%4 == 0 {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: s.pid, WakerTID: sib}, 20*ms)
			waits += 20 * ms
		}
		s.step(8, 500*us, 20*us)
		s.t += 100 * us
	}
	checkLockGaps(t, s, sib, "bg-worker", waits)
}

// checkLockGaps feeds s's job to an engine: every gap must be lock, held
// by thread sib alone (named comm), and the gaps' lock time must be at
// least 0.9 of waits.
func checkLockGaps(t *testing.T, s *gpuSim, sib uint32, comm string, waits int64) {
	t.Helper()
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	var lock int64
	for _, g := range bigGaps(c.gaps) {
		if g.Cause != CauseLock {
			t.Errorf("gap %+v, want cause lock", g)
			continue
		}
		lock += g.Breakdown[CauseLock]
		if h := g.Evidence.LockHolders; len(h) != 1 || h[0].TID != sib || h[0].Comm != comm {
			t.Errorf("lock holders %+v, want thread %d %s", h, sib, comm)
		}
	}
	if lock < waits*9/10 {
		t.Errorf("lock %d ns of %d ns waited", lock, waits)
	}
}

// TestPythonLockWaitUnseenHolder: the feeder's GIL wait times out (the
// switch interval) and no sibling was seen at all (a thread that computes
// emits nothing): the wait is lock when CPython itself waited (a condition
// wait, or any system code, called from Python code), and stays other for a
// native program's own timed wait.
func TestPythonLockWaitUnseenHolder(t *testing.T) {
	libc := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	for _, c := range []struct {
		name  string
		stack []event.Frame
		want  Cause
	}{
		{"python", []event.Frame{{Function: "libc.so.6+0x85f16", File: libc}, {Function: "pthread_cond_timedwait", File: libc},
			{Function: "Driver.sync", File: "/srv/job/pytrain.py", Line: 80}, {Function: "main", File: "/srv/job/pytrain.py", Line: 200}}, CauseLock},
		// A ctypes call taking the GIL back on return: the walk lost the
		// condition wait (libc's internals, CPython without frame
		// pointers) and shows libffi under the Python caller.
		{"ctypes", []event.Frame{{Function: "libc.so.6+0x85f16", File: libc},
			{Function: "libffi.so.8.1.2+0x640e", File: "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2"},
			{Function: "Driver.launch", File: "/srv/job/pytrain.py", Line: 104}}, CauseLock},
		{"native", []event.Frame{{Function: "pthread_cond_timedwait", File: libc},
			{Function: "main", File: "/srv/job/trainer"}}, CauseOther},
		{"native-no-symbol", []event.Frame{{Function: "libc.so.6+0x85f16", File: libc},
			{Function: "trainer+0x1234", File: "/srv/job/trainer"}}, CauseOther},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			var waits int64
			for n := int64(1); n <= 40; n++ {
				if n%4 == 0 {
					s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", Ret: -110 /* -ETIMEDOUT */, Stack: c.stack}, 5*ms)
					waits += 5 * ms
				}
				s.step(8, 500*us, 20*us)
				s.t += 100 * us
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			col := &collect{}
			feed(newEngine(col, nil), col, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var got int64
			for _, g := range bigGaps(col.gaps) {
				got += g.Breakdown[c.want]
			}
			if got < waits*9/10 {
				t.Errorf("%s: %d ns of %d ns waited", c.want, got, waits)
			}
		})
	}
}

// TestLockHolderShortLived: the holder is a thread that emits nothing of
// its own (it only computes) and exits just before the feeder's wait ends,
// long before the gap is decided; and one that was never seen to start
// (tracing attached after it was created). Both are lock, named by the
// wake-up alone.
func TestLockHolderShortLived(t *testing.T) {
	for _, forked := range []bool{true, false} {
		s := newSim()
		var waits int64
		for n := int64(1); n <= 40; n++ {
			if n%4 == 0 {
				hog := uint32(500 + n)
				if forked {
					s.evs = append(s.evs, event.Event{Kind: event.KindFork, PID: s.pid, TID: s.pid, Start: s.t, End: s.t, ChildPID: hog, IsThread: true})
				}
				s.evs = append(s.evs, event.Event{Kind: event.KindExit, PID: s.pid, TID: hog, Start: s.t + 30*ms - 40*us, End: s.t + 30*ms - 40*us})
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: s.pid, WakerTID: hog,
					Stack: []event.Frame{{Function: "take_gil", File: "/usr/bin/python3.12"}, {Function: "start_hog", File: "/job/train.py", Line: 254}}}, 30*ms)
				waits += 30 * ms
			}
			s.step(8, 500*us, 20*us)
			s.t += 100 * us
		}
		c := &collect{}
		feed(newEngine(c, nil), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
		var lock int64
		for _, g := range bigGaps(c.gaps) {
			lock += g.Breakdown[CauseLock]
			if g.Cause != CauseLock || len(g.Evidence.LockHolders) != 1 || g.Evidence.LockHolders[0].TID < 500 {
				t.Errorf("forked=%v: gap %s holders %+v, want lock held by the short-lived thread", forked, g.Cause, g.Evidence.LockHolders)
			}
			// The gap is charged to the wait's call site, not to the sync
			// that opened it: the lock is charged through the waker.
			if f, ok := SiteFrame(g.Evidence.Stack); !ok || f.Function != "start_hog" {
				t.Errorf("forked=%v: lock gap's call site %+v, want the wait's start_hog", forked, f)
			}
		}
		if lock < waits*9/10 {
			t.Errorf("forked=%v: lock %d ns of %d ns waited", forked, lock, waits)
		}
	}
}

// TestGILTimedWait: CPython's take_gil waits the switch interval on a
// condition variable; the wait times out (the timer's interrupted task,
// another process, is recorded as the waker), the thread asks the holder
// to drop the GIL and waits again, and the holder wakes that second wait
// (or it is too short to be traced). Both shapes are lock, with the
// computing background thread as holder.
func TestGILTimedWait(t *testing.T) {
	s := newSim()
	const sib, foreign = 101, 4242
	var waits int64
	for n := int64(1); n <= 40; n++ {
		if n == 1 {
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: sib, Start: s.t, End: s.t + 10*us,
				Syscall: event.SysSleep, Name: "nanosleep", TaskComm: "python3"})
		}
		if n%4 == 0 {
			// The holder computes, preempted once in a while.
			s.evs = append(s.evs, event.Event{Kind: event.KindRunqueue, PID: s.pid, TID: sib, Start: s.t + 2*ms, End: s.t + 2*ms + 80*us})
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", Ret: -110, WakerPID: foreign, WakerTID: foreign}, 5*ms)
			waits += 5 * ms
			s.t += 10 * us
			if n%8 == 0 {
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: s.pid, WakerTID: sib}, 300*us)
				waits += 300 * us
			}
		}
		s.step(8, 500*us, 20*us)
		s.t += 100 * us
	}
	checkLockGaps(t, s, sib, "python3", waits)
}

// TestLockHolderActivity: the feeder waits on a futex a sibling holds
// while it does something other than compute: sleeps (time.sleep inside
// `with lock:`), or uploads to a peer. Sleeping with the lock held is the
// lock's time (it was sleep, as if the feeder slept); an upload is the
// network's, passed on as a loader thread's read is. Either way the holder
// is in the evidence with what it did, and its peer.
func TestLockHolderActivity(t *testing.T) {
	const sib = 101
	for _, c := range []struct {
		name  string
		held  event.Event
		cause Cause
		peer  string
	}{
		{"sleeping", event.Event{Kind: event.KindSyscall, Syscall: event.SysSleep, Name: "clock_nanosleep"}, CauseLock, ""},
		{"uploading", event.Event{Kind: event.KindSyscall, Syscall: event.SysNet, Name: "sendto", FDKind: event.FDSocket,
			PeerAddr: "10.0.0.7:443"}, CauseNet, "10.0.0.7:443"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: sib, Start: s.t, End: s.t + 10*us,
				Syscall: event.SysSleep, Name: "nanosleep", TaskComm: "metrics"})
			var waits int64
			for n := int64(1); n <= 40; n++ {
				if n%4 == 0 {
					h := c.held
					h.PID, h.TID, h.Start, h.End = s.pid, sib, s.t+100*us, s.t+20*ms-50*us
					s.evs = append(s.evs, h)
					s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: s.pid, WakerTID: sib}, 20*ms)
					waits += 20 * ms
				}
				s.step(8, 500*us, 20*us)
				s.t += 100 * us
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			col := &collect{}
			feed(newEngine(col, nil), col, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var got int64
			for _, g := range bigGaps(col.gaps) {
				if g.Cause != c.cause {
					t.Errorf("gap %s %v, want %s", g.Cause, g.Breakdown, c.cause)
					continue
				}
				got += g.Breakdown[c.cause]
				hs := g.Evidence.LockHolders
				if len(hs) != 1 || hs[0].TID != sib || hs[0].Comm != "metrics" || hs[0].Peer != c.peer ||
					hs[0].Doing != map[Cause]Cause{CauseLock: CauseSleep, CauseNet: CauseNet}[c.cause] || hs[0].NS < 19*ms {
					t.Errorf("lock holders %+v, want thread %d (metrics) and what it did", hs, sib)
				}
			}
			if got < waits*9/10 {
				t.Errorf("%s %d ns of %d ns waited", c.cause, got, waits)
			}
		})
	}
}
