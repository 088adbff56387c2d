package tracer

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// A sync that sleeps until the GPU is done and then waits for a CPU: the
// tracer reports the wait from the wakeup (Woken), inside the sync, and the
// wakeup is when the simulated GPU finished, give or take how late the
// machine delivers timer wakeups on that CPU meanwhile (measured, not
// assumed: a loaded host makes it milliseconds). simtrain runs pinned to
// CPU 0 while a SCHED_FIFO thread of this test spins there half the time.
func TestSyncWakeupThenRunqueue(t *testing.T) {
	if !canRealtime() {
		t.Skip("needs SCHED_FIFO (root or CAP_SYS_NICE)")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs a second CPU for the tracer while CPU 0 is hogged")
	}
	var cpu0 unix.CPUSet
	cpu0.Set(0)
	hogDone, stopHog := make(chan struct{}), make(chan struct{})
	// How late a timer wakes a sleeper on CPU 0 while the job runs: the
	// machine's share of the distance between a GPU end and the wakeup
	// it causes (a busy host or hypervisor delays the timer interrupt).
	var lat func() time.Duration
	r := runSimtrainHook(t, ProbesFull, func(pid int) {
		lat = probeWakeupLatency(t, cpu0, stopHog)
		if err := unix.SchedSetaffinity(pid, &cpu0); err != nil {
			t.Fatalf("pin simtrain to CPU 0: %v", err)
		}
		go func() {
			defer close(hogDone)
			// The thread keeps the policy and the affinity: it is never
			// unlocked, so it exits with this goroutine.
			runtime.LockOSThread()
			if err := unix.SchedSetaffinity(0, &cpu0); err != nil {
				return
			}
			if unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 1 /* SCHED_FIFO */, Priority: 1}, 0) != nil {
				return
			}
			// Spin 15 ms, sleep 15 ms, until simtrain is done: whenever its
			// steps run, some of their syncs end while CPU 0 is taken.
			for {
				for end := time.Now().Add(15 * time.Millisecond); time.Now().Before(end); {
				}
				select {
				case <-stopHog:
					return
				case <-time.After(15 * time.Millisecond):
				}
			}
		}()
	}, "--steps", "60", "--kernels-per-step", "2", "--kernel-us", "4000", "--workers", "0")
	close(stopHog)
	<-hogDone
	late := lat()
	// Timer slack and the wakeup path on an idle machine stay well under
	// 500 µs; what the machine added during this run comes on top.
	allowed := 500*int64(time.Microsecond) + int64(late)
	t.Logf("timer wakeups on CPU 0 up to %v late during the run: a wakeup may be %v from a GPU end", late, time.Duration(allowed))
	main := r.meta.TID
	var busyEnds []int64
	for _, rec := range r.truth {
		if rec.Type == "busy" {
			busyEnds = append(busyEnds, mono(rec.End))
		}
	}
	slices.Sort(busyEnds)
	syncs := r.kind(event.KindSync, main)
	var woken int
	var longest int64
	for _, ev := range r.kind(event.KindRunqueue, main) {
		if !ev.Woken {
			continue
		}
		woken++
		longest = max(longest, ev.End-ev.Start)
		var in *event.Event
		for i := range syncs {
			if syncs[i].Start < ev.Start && ev.End <= syncs[i].End {
				in = &syncs[i]
			}
		}
		if in == nil {
			t.Errorf("woken run-queue wait [%d,+%d] is inside no sync", ev.Start, ev.End-ev.Start)
			continue
		}
		// The simulated sync sleeps until the GPU's end: the wakeup is
		// the end of a busy interval, give or take timer slack.
		i, _ := slices.BinarySearch(busyEnds, ev.Start)
		best := int64(1 << 62)
		for _, j := range []int{i - 1, i} {
			if j >= 0 && j < len(busyEnds) {
				best = min(best, max(busyEnds[j]-ev.Start, ev.Start-busyEnds[j]))
			}
		}
		if best > allowed {
			t.Errorf("woken at %d, %d µs from the nearest end of GPU work (allowed %d µs)", ev.Start, best/1000, allowed/1000)
		}
	}
	if woken == 0 {
		t.Fatalf("no woken run-queue wait seen in %d syncs of tid %d while CPU 0 was hogged", len(syncs), main)
	}
	// The hog held CPU 0 half the time: some wakeup waited far longer than
	// the machine's usual wakeup latency.
	if longest < int64(time.Millisecond) {
		t.Errorf("longest woken run-queue wait %d µs while CPU 0 was hogged half the time", longest/1000)
	}
	t.Logf("%d woken run-queue waits inside %d syncs, longest %.1f ms", woken, len(syncs), float64(longest)/1e6)
}
