package tracer

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// TestDeliveredHoldsForAStalledConsumer: while the consumer takes nothing,
// the traced process goes on and its events wait in the ring buffer; the
// delivered bound must not pass them, whatever the wall clock does. Every
// event taken after the bound was read must have ended at or after it, so
// that an engine's watermark on that bound never gets an event too late.
func TestDeliveredHoldsForAStalledConsumer(t *testing.T) {
	tr := newTestTracer(t, Config{})
	cmd := startSimtrain(t, "--steps", "1000000", "--kernels-per-step", "4", "--kernel-us", "100")
	pid := cmd.Process.Pid
	if err := tr.Trace(pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan event.Event, 64)
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, out) }()
	t.Cleanup(func() {
		cancel()
		for {
			select {
			case <-out: // Run drains the ring before it returns
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
				// Before the process is killed: detaching from a live
				// process is quick.
				if err := tr.Close(); err != nil {
					t.Error(err)
				}
				return
			}
		}
	})

	// consume takes what out holds as a pipeline does: Delivered first,
	// then the events sent before it was set. An event taken after a
	// bound it ended before is a suspect.
	type suspect struct {
		ev    event.Event
		bound int64
	}
	var bound, stalled, stallEnd int64
	var suspects []suspect
	var stallEnded int
	runq := map[uint32][][2]int64{}
	consume := func() {
		d := tr.Delivered()
		for range len(out) {
			ev := <-out
			if ev.Kind == event.KindRunqueue {
				runq[ev.TID] = append(runq[ev.TID], [2]int64{ev.Start, ev.End})
			}
			if ev.End < bound {
				suspects = append(suspects, suspect{ev, bound})
			}
			if stallEnd > 0 && ev.End > stalled && ev.End < stallEnd {
				stallEnded++
			}
		}
		bound = max(bound, d)
	}
	testutil.WaitFor(t, 30*time.Second, "the tracer to catch up with the running process", func() bool {
		consume()
		return bound > 0
	})

	// The stall lasts until the process has blocked and been woken a few
	// dozen times (each one traced), however long a busy host takes.
	base := switches(t, pid)
	stalled = time.Now().UnixNano()
	testutil.WaitFor(t, 60*time.Second, "the traced process to run on through the stall", func() bool {
		return switches(t, pid) >= base+50
	})
	stallEnd = time.Now().UnixNano()
	// Taking the backlog: the bound may only pass what was taken.
	testutil.WaitFor(t, 30*time.Second, "the bound to pass the stall", func() bool {
		consume()
		return bound > stallEnd
	})
	// A probe takes its timestamp before it submits the record; a thread
	// preempted in between submits it late, as its run-queue wait right
	// after the event records. Any other lateness is the bound's.
	late := 0
	for _, s := range suspects {
		lag, excuse := s.bound-s.ev.End, int64(0)
		for _, r := range runq[s.ev.TID] {
			if r[0] >= s.ev.End && r[0]-s.ev.End <= int64(time.Millisecond) {
				excuse = r[1] - s.ev.End
				break
			}
		}
		if lag > excuse+int64(time.Millisecond) {
			if late++; late <= 5 {
				t.Errorf("%v of %d taken %v after the delivered bound passed its end (preempted %v after it)",
					s.ev.Kind, s.ev.TID, time.Duration(lag), time.Duration(excuse))
			}
		}
	}
	if late > 0 {
		t.Fatalf("%d of %d events taken after a delivered bound they ended before", late, len(suspects))
	}
	// Events that ended during the stall and were taken after it: the
	// check above had something to judge.
	if stallEnded == 0 {
		t.Fatal("no event that ended during the stall was taken after it")
	}
	t.Logf("%d suspects, all preempted before they were submitted", len(suspects))
	t.Logf("%d events ended during a %v stall; bound now %v behind the clock", stallEnded,
		time.Duration(stallEnd-stalled), time.Duration(time.Now().UnixNano()-bound))
}

// switches is how often the main thread of pid gave up its CPU.
func switches(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
			c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			n += c
		}
	}
	return n
}
