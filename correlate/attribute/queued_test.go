package attribute

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// fakeWorld is a World of a few threads; workers are loader worker pids.
type fakeWorld struct {
	threads map[uint32]*Thread
	workers map[uint32]bool
}

func newFakeWorld() *fakeWorld {
	return &fakeWorld{threads: map[uint32]*Thread{}, workers: map[uint32]bool{}}
}

func (w *fakeWorld) thread(pid, tid uint32, evs ...event.Event) *Thread {
	th := NewThread(tid, pid, nil)
	for i := range evs {
		evs[i].PID, evs[i].TID = pid, tid
		th.Add(&evs[i])
		th.Last = max(th.Last, evs[i].End)
	}
	w.threads[tid] = th
	return th
}

func (w *fakeWorld) Thread(tid uint32) *Thread { return w.threads[tid] }

func (w *fakeWorld) TIDs(pid uint32) map[uint32]struct{} {
	out := map[uint32]struct{}{}
	for tid, th := range w.threads {
		if th.PID == pid {
			out[tid] = struct{}{}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (w *fakeWorld) ProcComm(pid uint32) (string, bool) { return "", w.TIDs(pid) != nil }

func (w *fakeWorld) LoaderWaker(ev *event.Event, pid uint32) bool { return w.workers[ev.WakerPID] }

const ms = int64(1_000_000)

func runq(a, b int64) event.Event {
	return event.Event{Kind: event.KindRunqueue, Start: a * ms, End: b * ms}
}

func call(sc event.SyscallClass, fd event.FDKind, a, b int64, wpid, wtid uint32) event.Event {
	return event.Event{Kind: event.KindSyscall, Syscall: sc, FDKind: fd, Start: a * ms, End: b * ms,
		WakerPID: wpid, WakerTID: wtid, Ret: 1}
}

// breakdown attributes [0, end ms) of th.
func breakdown(w World, th *Thread, end int64) (map[Cause]int64, Evidence) {
	at := New()
	at.Add(w, th, 0, end*ms, nil)
	_, bd, ev, _ := at.Result()
	return bd, ev
}

// A feeder that waited for a CPU and then blocked on a loader worker's pipe
// lost nothing to the CPU: the run-queue time is the loader's, for as long
// as the worker worked (here its threads first waited on its index queue,
// 0–4 ms, and handed the last batch over, 0–3 ms: the worker worked from
// 3 ms).
func TestQueuedBeforeLoaderWait(t *testing.T) {
	w := newFakeWorld()
	w.workers[2] = true
	feeder := w.thread(1, 1, runq(0, 10), call(event.SysRead, event.FDPipe, 10, 30, 2, 2))
	w.thread(2, 2, call(event.SysRead, event.FDPipe, 0, 4, 1, 1), runq(12, 20))
	// The worker's queue feeder thread, blocked handing the batch over
	// (the pipe full): waiting on the feeder, not working.
	w.thread(2, 3, call(event.SysWrite, event.FDPipe, 0, 3, 0, 0))
	bd, ev := breakdown(w, feeder, 30)
	if bd[CauseLoaderWait] != 27*ms || bd[CauseCPUContention] != 3*ms {
		t.Fatalf("breakdown %v: want loader.wait 27 ms, cpu.contention 3 ms", bd)
	}
	if len(ev.Workers) != 1 || ev.Workers[0].PID != 2 || ev.Workers[0].Activity != "cpu" {
		t.Fatalf("workers %+v: want pid 2, cpu", ev.Workers)
	}
}

// A worker blocked writing its batch into the result pipe hands it over: it
// is no I/O, and the gap is loader.wait.cpu, not loader.wait.io.
func TestWorkerPipeWriteIsNoIO(t *testing.T) {
	w := newFakeWorld()
	w.workers[2] = true
	feeder := w.thread(1, 1, call(event.SysRead, event.FDPipe, 0, 20, 2, 2))
	w.thread(2, 2, call(event.SysWrite, event.FDPipe, 2, 18, 0, 0))
	_, ev := breakdown(w, feeder, 20)
	if len(ev.Workers) != 1 || ev.Workers[0].Activity != "cpu" || ev.Workers[0].IONS != 0 || len(ev.Workers[0].Files) != 0 {
		t.Fatalf("workers %+v: want cpu, no I/O, no files", ev.Workers)
	}
}

// Run-queue time before the feeder's own work (a file write), or before a
// wait on nobody known, is the machine's load: cpu.contention.
func TestQueuedBeforeOwnWorkIsContention(t *testing.T) {
	w := newFakeWorld()
	feeder := w.thread(1, 1, runq(0, 10), call(event.SysWrite, event.FDFile, 10, 20, 0, 0),
		runq(20, 25), call(event.SysFutex, event.FDUnknown, 25, 30, 0, 0))
	feeder.At(1).Path = "/ckpt"
	bd, _ := breakdown(w, feeder, 30)
	if bd[CauseCPUContention] != 15*ms || bd[CauseIOWrite] != 10*ms {
		t.Fatalf("breakdown %v: want cpu.contention 15 ms, io.write 10 ms", bd)
	}
}

// A feeder queued for a CPU and then blocked on a lock its sibling held
// waited on the lock throughout while the holder computed (or itself
// waited for a CPU, holding the lock): lock, with the holder's run-queue
// time in its evidence. Where the sibling was itself blocked waiting
// (0–3 ms: it did not hold the lock yet), the feeder's own wait for a CPU
// is contention.
func TestQueuedBeforeLockHolder(t *testing.T) {
	w := newFakeWorld()
	feeder := w.thread(1, 1, runq(0, 10), call(event.SysFutex, event.FDUnknown, 10, 30, 1, 3))
	w.thread(1, 3, call(event.SysFutex, event.FDUnknown, 0, 3, 1, 1), runq(5, 20))
	bd, ev := breakdown(w, feeder, 30)
	if bd[CauseLock] != 27*ms || bd[CauseCPUContention] != 3*ms {
		t.Fatalf("breakdown %v: want lock 27 ms, cpu.contention 3 ms", bd)
	}
	if len(ev.LockHolders) != 1 {
		t.Fatalf("lock holders %+v: want tid 3", ev.LockHolders)
	}
	h := ev.LockHolders[0]
	if h.TID != 3 || h.NS != 27*ms || h.RunnableNS != 15*ms || h.Doing != CauseCPUContention {
		t.Fatalf("holder %+v: want tid 3, 27 ms waited on, runnable 15 ms, doing cpu.contention", h)
	}
}

// A futex wait woken from a process that is no loader worker was ended by
// a timer (the interrupted task is recorded): a Python wait with a sibling
// computing meanwhile is that sibling's lock, not other.
func TestStrayFutexWakeIsTimer(t *testing.T) {
	w := newFakeWorld()
	feeder := w.thread(1, 1, call(event.SysFutex, event.FDUnknown, 0, 20, 99, 99))
	feeder.At(0).Ret = 0
	w.thread(1, 3, runq(2, 8))
	w.threads[3].Last = 20 * ms
	bd, ev := breakdown(w, feeder, 20)
	if bd[CauseLock] != 20*ms || len(ev.LockHolders) != 1 || ev.LockHolders[0].TID != 3 {
		t.Fatalf("breakdown %v, holders %+v: want lock 20 ms held by tid 3", bd, ev.LockHolders)
	}
}

// A wait for the GIL (CPython's take_gil: a timed condition wait under a
// Python frame) is the lock's time whatever its holder did meanwhile; the
// holder's write stays its evidence. The same holder woken from a
// queue's semaphore wait passes its write on: the waiter waited for what
// it made.
func TestGILWaitIsLock(t *testing.T) {
	libc := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	for _, c := range []struct {
		name  string
		stack []event.Frame
		want  Cause
	}{
		{"gil", []event.Frame{{Function: "libc.so.6+0x98e51", File: libc}, {Function: "pthread_cond_timedwait", File: libc},
			{Function: "Linear.forward", File: "/venv/torch/nn/modules/linear.py", Line: 125}}, CauseLock},
		{"forced switch", []event.Frame{{Function: "libc.so.6+0x85f16", File: libc}, {Function: "pthread_cond_wait", File: libc},
			{Function: "JSONEncoder.iterencode", File: "/usr/lib/python3.11/json/encoder.py", Line: 258}}, CauseLock},
		{"queue", []event.Frame{{Function: "libc.so.6+0x98e51", File: libc}, {Function: "libc.so.6+0xa439e", File: libc},
			{Function: "Condition.wait", File: "/usr/lib/python3.12/threading.py", Line: 355},
			{Function: "Queue.get", File: "/usr/lib/python3.12/queue.py", Line: 171}}, CauseIOWrite},
	} {
		w := newFakeWorld()
		wait := call(event.SysFutex, event.FDUnknown, 0, 20, 1, 3)
		wait.Stack = c.stack
		feeder := w.thread(1, 1, wait)
		write := call(event.SysWrite, event.FDFile, 2, 18, 0, 0)
		write.Path = "/ckpt/step.pt"
		w.thread(1, 3, write)
		bd, ev := breakdown(w, feeder, 20)
		if bd[c.want] < 16*ms {
			t.Errorf("%s: breakdown %v, want the holder's 16 ms write as %s", c.name, bd, c.want)
		}
		if len(ev.LockHolders) != 1 || ev.LockHolders[0].Doing != CauseIOWrite || ev.LockHolders[0].File != "/ckpt/step.pt" {
			t.Errorf("%s: holders %+v, want tid 3 doing io.write on /ckpt/step.pt", c.name, ev.LockHolders)
		}
	}
}
