package main

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// schedRun drives an autoSchedule with steps of a given length on a
// simulated clock, ticking every 100 ms as the feed loop does.
type schedRun struct {
	t      *testing.T
	a      *autoSchedule
	now    time.Time
	next   time.Time // start of the next step
	events []string
	times  []time.Time // of events
	q      []pendingStep
	// settling: the steps laid now are ClockSettling.
	settling bool
}

type pendingStep struct {
	st correlate.Step
	at time.Time
}

func newSchedRun(t *testing.T, window, every time.Duration) *schedRun {
	now := time.Unix(1_700_000_000, 0)
	return &schedRun{t: t, now: now, next: now, a: newAutoSchedule(window, every, now, slog.New(slog.NewTextHandler(io.Discard, nil)))}
}

// run advances by d with steps of length step and idle ratio idle; the
// engine delivers each step 1 s after it ends.
func (r *schedRun) run(d, step time.Duration, idle float64, window bool) {
	end := r.now.Add(d)
	for r.now.Before(end) {
		r.now = r.now.Add(100 * time.Millisecond)
		for step > 0 && !r.next.Add(step).After(r.now) {
			st := correlate.Step{PID: 7, Start: r.next.UnixNano(), End: r.next.Add(step).UnixNano(), IdleRatio: idle, Window: window,
				ClockSettling: r.settling}
			r.q = append(r.q, pendingStep{st, r.next.Add(step + time.Second)})
			r.next = r.next.Add(step)
		}
		for len(r.q) > 0 && !r.q[0].at.After(r.now) {
			r.a.step(r.q[0].st)
			r.q = r.q[1:]
		}
		if change, full, reason := r.a.tick(r.now); change {
			state := "lite"
			if full {
				state = "full"
			}
			r.events = append(r.events, state+":"+reason)
			r.times = append(r.times, r.now)
		}
	}
}

func (r *schedRun) want(events ...string) {
	r.t.Helper()
	if len(r.events) != len(events) {
		r.t.Fatalf("toggles %v, want %v", r.events, events)
	}
	for i := range events {
		if r.events[i] != events[i] {
			r.t.Fatalf("toggles %v, want %v", r.events, events)
		}
	}
	r.events = nil
}

// at is when the i-th toggle so far happened, since the start.
func (r *schedRun) at(i int) time.Duration {
	return r.times[i].Sub(time.Unix(1_700_000_000, 0))
}

// TestAutoScheduleWarmupAndPeriodic: full from the start until five steps
// were measured, then a window every --auto-every that lasts until it
// measured three steps; steady steps ask for nothing more.
func TestAutoScheduleWarmupAndPeriodic(t *testing.T) {
	r := newSchedRun(t, 500*time.Millisecond, 10*time.Second)
	r.run(27*time.Second, 200*time.Millisecond, 0.1, false)
	r.want("lite:start", "full:periodic", "lite:periodic", "full:periodic", "lite:periodic")
	// The fifth step ends at 1 s and reaches the schedule 1 s later.
	if r.at(0) != 2*time.Second {
		t.Errorf("warm-up ended at %v, want 2s", r.at(0))
	}
	for _, w := range [][2]int{{1, 2}, {3, 4}} {
		if gap := r.times[w[0]].Sub(r.times[w[0]-1]); gap != 10*time.Second {
			t.Errorf("window %d opened %v after the last, want 10s", w[0], gap)
		}
		// Three steps ending inside it reach the schedule 1 s after the
		// third ends: 1.6 s.
		if d := r.times[w[1]].Sub(r.times[w[0]]); d < time.Second || d > 2*time.Second {
			t.Errorf("window %d lasted %v, want 1-2s", w[0], d)
		}
	}
	if r.a.windows != 2 {
		t.Errorf("%d windows after the warm-up, want 2", r.a.windows)
	}
}

// TestAutoScheduleWaitsForTheStepSite: while the work pattern lays the
// steps and the process's step site is still looked for, the warm-up keeps
// the per-launch probes on past its five steps, until a step comes that
// was laid once the site checks had their say; a site never settled
// leaves it after autoWarmupMax windows, as a job without steps does.
func TestAutoScheduleWaitsForTheStepSite(t *testing.T) {
	r := newSchedRun(t, 500*time.Millisecond, time.Minute)
	r.settling = true
	r.run(3*time.Second, 200*time.Millisecond, 0.1, false)
	r.want() // five steps by 1 s, delivered by 2 s: still settling
	r.settling = false
	r.run(2*time.Second, 200*time.Millisecond, 0.1, false)
	r.want("lite:start")
	// Steps laid from 3 s on are delivered from 4.2 s.
	if at := r.at(0); at < 4*time.Second || at > 4300*time.Millisecond {
		t.Errorf("warm-up ended at %v, want 4.2s (the first settled step's delivery)", at)
	}

	r = newSchedRun(t, 500*time.Millisecond, time.Minute)
	r.settling = true
	r.run(15*time.Second, 200*time.Millisecond, 0.1, false)
	r.want("lite:start")
	// The first step reaches the schedule at 1.2 s; 20 windows of 500 ms
	// after its end (0.2 s).
	if at := r.at(0); at < 10*time.Second || at > 10300*time.Millisecond {
		t.Errorf("warm-up ended at %v, want 10.2s (autoWarmupMax windows after the first step)", at)
	}
}

// TestAutoScheduleDemand: steps that get slower, idle more, or lose their
// pattern while lite ask for a window sooner than the period, but no sooner
// than a quarter of it after the last one; a window without steps lasts
// autoMaxWindows windows.
func TestAutoScheduleDemand(t *testing.T) {
	r := newSchedRun(t, 500*time.Millisecond, 40*time.Second)
	r.run(7*time.Second, 200*time.Millisecond, 0.1, false)
	r.run(17*time.Second, 400*time.Millisecond, 0.1, false) // slower steps
	r.run(12*time.Second, 400*time.Millisecond, 0.4, false) // more idle
	r.run(8*time.Second, 400*time.Millisecond, 0.4, true)   // no pattern
	for i := range r.times {
		t.Logf("%s at %v", r.events[i], r.at(i))
	}
	if len(r.times) == 7 {
		for _, w := range [][2]int{{1, 0}, {3, 2}, {5, 4}} {
			if gap := r.times[w[0]].Sub(r.times[w[1]]); gap < 10*time.Second {
				t.Errorf("%s %v after the last window, want at least 10s", r.events[w[0]], gap)
			}
		}
		if d := r.times[6].Sub(r.times[5]); d != 2500*time.Millisecond {
			t.Errorf("window without steps lasted %v, want 2.5s", d)
		}
	}
	r.want("lite:start", "full:step time changed", "lite:step time changed", "full:idle rose", "lite:idle rose",
		"full:step pattern lost", "lite:step pattern lost")
}

// TestAutoScheduleNoPattern: a job without steps leaves the warm-up window
// autoWarmupMax windows after its first fixed window arrived; before any
// arrives (the job loads its model) the warm-up does not time out.
func TestAutoScheduleNoPattern(t *testing.T) {
	r := newSchedRun(t, 200*time.Millisecond, 30*time.Second)
	r.run(30*time.Second, 0, 0, true) // nothing yet
	r.want()
	r.next = r.now
	// Fixed windows of 1 s: the first arrives 2 s after they begin (its end
	// plus the delivery delay); 4 s (20 × 200 ms) after its end, lite.
	r.run(4900*time.Millisecond, time.Second, 0.5, true)
	r.want()
	r.run(200*time.Millisecond, time.Second, 0.5, true)
	r.want("lite:start")
}

// TestAutoScheduleShortStepsAfterAWindow: a loop of 2 ms steps runs 25%
// slower while the per-launch probes are attached and until their detach
// completes 40 ms after the window ends. The lite baseline begins after the
// detach and spans a window's time, so those steps ask for no window: only
// the periodic ones open (before, each window asked for the next at once).
func TestAutoScheduleShortStepsAfterAWindow(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	now, next := start, start
	a := newAutoSchedule(500*time.Millisecond, 20*time.Second, now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	full, slowUntil := true, time.Time{}
	var q []pendingStep
	var events []string
	for now.Before(start.Add(65 * time.Second)) {
		now = now.Add(100 * time.Millisecond)
		for {
			d := 2 * time.Millisecond
			if full || next.Before(slowUntil) {
				d = 2500 * time.Microsecond
			}
			if next.Add(d).After(now) {
				break
			}
			st := correlate.Step{PID: 7, Start: next.UnixNano(), End: next.Add(d).UnixNano(), IdleRatio: 0.1}
			q = append(q, pendingStep{st, next.Add(d + time.Second)})
			next = next.Add(d)
		}
		for len(q) > 0 && !q[0].at.After(now) {
			a.step(q[0].st)
			q = q[1:]
		}
		if change, f, reason := a.tick(now); change {
			full = f
			state := "lite"
			if f {
				state = "full"
			} else {
				slowUntil = now.Add(40 * time.Millisecond)
				a.detached(slowUntil)
			}
			events = append(events, state+":"+reason)
		}
	}
	want := []string{"lite:start", "full:periodic", "lite:periodic", "full:periodic", "lite:periodic",
		"full:periodic", "lite:periodic"}
	if len(events) != len(want) {
		t.Fatalf("toggles %v, want %v", events, want)
	}
	for i := range want {
		if events[i] != want[i] {
			t.Fatalf("toggles %v, want %v", events, want)
		}
	}
}
