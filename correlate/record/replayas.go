package record

import (
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

// A recording holds what its probe set saw. One made at full holds every
// kernel launch, so it also holds what lite would have seen (lite attaches
// the same probes but the per-launch ones) and what auto would have seen
// (full during its windows, lite between them). Replaying a full recording
// as lite or auto compares the probe sets on one and the same run; the
// other way round, the launches were never recorded.

// View says which probe set a replay sees a recording as.
type View struct {
	// Probes is the probe set to replay as; "" replays as recorded.
	Probes string
	// The auto warm-up window (cmd/sidecar/auto.go): the per-launch probes
	// stay attached from the start until WarmupSteps steps started inside
	// it and Window passed, or WarmupMax after its first step.
	Window      time.Duration
	WarmupSteps int
	WarmupMax   time.Duration
}

// ProbeSet is the probe set the recording was made with ("" is full: the
// headers of the first recordings left it out).
func (h Header) ProbeSet() string {
	if h.Probes == "" {
		return correlate.ProbesFull
	}
	return h.Probes
}

// CheckView reports whether a recording made with h's probe set holds what
// v's probe set would have seen.
func CheckView(h Header, v View) error {
	rec := h.ProbeSet()
	switch v.Probes {
	case "", rec:
		return nil
	case correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto:
	default:
		return fmt.Errorf("probes %q: want %q, %q or %q", v.Probes, correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto)
	}
	switch {
	case rec == correlate.ProbesFull:
	case rec == correlate.ProbesAuto && v.Probes == correlate.ProbesLite:
	case rec == correlate.ProbesAuto:
		return fmt.Errorf("the recording was made with --probes auto: it holds kernel launches only inside its windows, so it cannot be replayed as %s; replay it as auto or lite", v.Probes)
	default:
		return fmt.Errorf("the recording was made with --probes %s: it holds no kernel launches, so it cannot be replayed as %s; replay it as %s", rec, v.Probes, rec)
	}
	if v.Probes == correlate.ProbesAuto && (v.Window <= 0 || v.WarmupSteps <= 0 || v.WarmupMax <= 0) {
		return fmt.Errorf("replay as auto: the warm-up window (%v, %d steps, at most %v) must be positive", v.Window, v.WarmupSteps, v.WarmupMax)
	}
	return nil
}

// ReplayAs replays calls, recorded with h, as v's probe set would have seen
// them: under lite without the launch events (KindEnqueue) and without the
// launch counts the syncs carry, and without the recording's own auto
// windows; under auto at full through the warm-up window, scheduled from
// the steps the engine finds as the sidecar schedules it, then as lite,
// and without marked launches throughout (auto marks none).
// cfg.Probes is set from v.
func ReplayAs(cfg correlate.Config, sink correlate.Sink, h Header, calls []Call, v View) (correlate.Summary, error) {
	return ReplayAsSeq(cfg, sink, h, slices.Values(calls), v)
}

// ReplayAsSeq is ReplayAs of calls as they come (Reader.Calls).
func ReplayAsSeq(cfg correlate.Config, sink correlate.Sink, h Header, calls iter.Seq[Call], v View) (correlate.Summary, error) {
	if err := CheckView(h, v); err != nil {
		return correlate.Summary{}, err
	}
	rec := h.ProbeSet()
	if v.Probes == "" || v.Probes == rec {
		cfg.Probes = rec
		return ReplaySeq(cfg, sink, calls), nil
	}
	cfg.Probes = v.Probes
	if v.Probes == correlate.ProbesAuto {
		return (&warmup{v: v, liteFrom: -1}).replay(cfg, sink, calls), nil
	}
	seen := func(yield func(Call) bool) {
		for c := range calls {
			switch {
			case c.Probes != nil:
				continue // the recording's own windows: lite has none
			case c.Ev != nil:
				if ev, ok := asLite(*c.Ev); ok && !yield(Call{Ev: &ev}) {
					return
				}
			default:
				if !yield(c) {
					return
				}
			}
		}
	}
	return ReplaySeq(cfg, sink, seen), nil
}

// asLite is ev as lite's probes emit it, false when they emit nothing.
func asLite(ev event.Event) (event.Event, bool) {
	switch ev.Kind {
	case event.KindEnqueue:
		return ev, false
	case event.KindSync:
		ev.Count = 0 // launches are counted by the per-launch probes
	}
	return ev, true
}

// warmup is auto's warm-up window during a replay.
type warmup struct {
	v        View
	since    int64 // the window's start: the recording's first time
	active   int64 // end of the first step
	steps    int   // steps (not fixed windows) that started inside the window
	liteFrom int64 // when the per-launch probes went; -1 while attached
}

func (w *warmup) Gap(correlate.Gap) {}
func (w *warmup) Step(st correlate.StepResult) {
	if w.active == 0 {
		w.active = st.End
	}
	if !st.Window && st.Start >= w.since {
		w.steps++
	}
}

// done says whether the window ends at now, as autoSchedule.tick decides.
func (w *warmup) done(now int64) bool {
	return (w.steps >= w.v.WarmupSteps && now-w.since >= int64(w.v.Window)) ||
		(w.active != 0 && now-w.active >= int64(w.v.WarmupMax))
}

// replay runs calls through an auto engine: the window opens at the first
// call with a time and the schedule is consulted at every Advance, the
// sidecar's feed loop tick.
func (w *warmup) replay(cfg correlate.Config, sink correlate.Sink, calls iter.Seq[Call]) correlate.Summary {
	e := correlate.New(cfg, correlate.Tee{sink, w})
	// The window opens at the first call with a time: the calls before it
	// wait (a few: devices, ranks), at most maxUntimed of them.
	const maxUntimed = 4096
	var head []Call
	next, stop := iter.Pull(calls)
	defer stop()
	for len(head) < maxUntimed {
		c, ok := next()
		if !ok {
			break
		}
		head = append(head, c)
		if w.since = callTime(c); w.since != 0 {
			break
		}
	}
	e.ProbesLive(true, w.since)
	all := func(yield func(Call) bool) {
		for _, c := range head {
			if !yield(c) {
				return
			}
		}
		for {
			c, ok := next()
			if !ok || !yield(c) {
				return
			}
		}
	}
	var last int64
	for c := range all {
		switch {
		case c.Probes != nil:
			continue // the recording's own windows: auto gets its own
		case c.Ev != nil:
			ev := *c.Ev
			if ev.Kind == event.KindEnqueue && ev.Mark != 0 {
				// Auto marks no launch (its windows are too short to
				// learn the rarest functions in): a marked launch that
				// flushed nothing reaches it in the thread's next flush.
				if ev.Count == 0 {
					continue
				}
				ev.Mark, ev.Pending = 0, 0
			}
			if w.liteFrom >= 0 && ev.Start >= w.liteFrom {
				var ok bool
				if ev, ok = asLite(ev); !ok {
					continue
				}
			}
			e.Event(ev)
			last = max(last, ev.End)
		case c.Win != nil:
			e.Window(*c.Win)
		case c.Device != nil:
			e.SetDevice(c.Device.PID, c.Device.Device)
		case c.Rank != nil:
			e.SetRank(c.Rank.PID, c.Rank.Rank, c.Rank.Size)
		case c.Advance != 0:
			e.Advance(c.Advance)
			last = max(last, c.Advance)
			if w.liteFrom < 0 && w.done(c.Advance) {
				w.liteFrom = c.Advance
				e.ProbesLive(false, c.Advance)
			}
		case c.Close != 0:
			return e.Close(c.Close)
		}
	}
	return e.Close(last + int64(time.Second))
}

// callTime is when a call happened, 0 for calls without a time.
func callTime(c Call) int64 {
	switch {
	case c.Ev != nil:
		return c.Ev.Start
	case c.Win != nil:
		return c.Win.Start
	case c.Advance != 0:
		return c.Advance
	case c.Close != 0:
		return c.Close
	}
	return 0
}
