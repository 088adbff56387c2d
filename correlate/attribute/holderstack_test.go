package attribute

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// A holder asleep with the lock held gets no CPU sample: the stack of the
// call it slept in (its own code above it) names what to change. Of its
// blocking calls, the one waited on longest is kept; its stack is bounded.
func TestLockHolderBlockedStack(t *testing.T) {
	libc := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	w := newFakeWorld()
	feeder := w.thread(1, 1, call(event.SysFutex, event.FDUnknown, 0, 50, 1, 3))
	short := call(event.SysRead, event.FDFile, 0, 4, 0, 0)
	short.Path = "/etc/metrics.cfg"
	short.Stack = []event.Frame{{Function: "read", File: libc}, {Function: "load_config", File: "/job/metrics.py", Line: 12}}
	sleep := call(event.SysSleep, event.FDUnknown, 4, 49, 0, 0)
	sleep.Stack = []event.Frame{{Function: "clock_nanosleep", File: libc},
		{Function: "flush_metrics", File: "/job/metrics.py", Line: 40}}
	for i := 0; i < 2*maxHolderFrames; i++ {
		sleep.Stack = append(sleep.Stack, event.Frame{Function: "caller", File: "/job/metrics.py", Line: 100 + i})
	}
	w.thread(1, 3, short, sleep)
	bd, ev := breakdown(w, feeder, 50)
	if bd[CauseLock] < 45*ms {
		t.Fatalf("breakdown %v: want the holder's 45 ms asleep as lock", bd)
	}
	if len(ev.LockHolders) != 1 {
		t.Fatalf("lock holders %+v: want tid 3", ev.LockHolders)
	}
	h := ev.LockHolders[0]
	if h.Doing != CauseSleep || len(h.Stack) != maxHolderFrames || !h.StackTruncated {
		t.Fatalf("holder doing %s, %d frames (truncated %v): want sleep, %d frames, truncated",
			h.Doing, len(h.Stack), h.StackTruncated, maxHolderFrames)
	}
	if h.Stack[1].Function != "flush_metrics" {
		t.Fatalf("holder stack %v: want the sleep's, flush_metrics above clock_nanosleep", h.Stack[:2])
	}
}

// A holder that only computed blocked in nothing: no stack (its CPU
// samples name its code).
func TestLockHolderComputingHasNoStack(t *testing.T) {
	w := newFakeWorld()
	feeder := w.thread(1, 1, call(event.SysFutex, event.FDUnknown, 10, 30, 1, 3))
	w.thread(1, 3, call(event.SysFutex, event.FDUnknown, 0, 3, 1, 1))
	_, ev := breakdown(w, feeder, 30)
	if len(ev.LockHolders) != 1 || ev.LockHolders[0].Stack != nil {
		t.Fatalf("lock holders %+v: want tid 3 without a stack", ev.LockHolders)
	}
}
