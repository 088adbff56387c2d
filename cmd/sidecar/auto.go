package main

import (
	"log/slog"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/stats"
	"github.com/gaptrace/gaptrace/tracer"
)

// The auto probe set's schedule. The per-launch probes cost a trap per
// kernel launch; lite's probes see the stalls but not micro-idle between
// launches nor exact gap ends. Auto keeps lite's probes and attaches the
// per-launch ones for sampled windows: at start until the step pattern is
// found, a few steps were measured and the step site checks had their say
// (Step.ClockSettling), then every --auto-every for
// --auto-window (and at least autoMinSteps steps), and sooner when the
// steps change while lite (their duration or idle share moves, or their
// pattern is lost).
const (
	autoWarmupSteps = config.AutoWarmupSteps   // steps measured at full before the first lite period
	autoMinSteps    = 3                        // steps a window measures at least (unless it times out)
	autoMaxWindows  = 5                        // a window lasts at most this many --auto-window
	autoWarmupMax   = config.AutoWarmupWindows // the warm-up window lasts at most this many --auto-window
	autoBaseSteps   = 8                        // lite steps after a window that form the baseline
	autoRecentSteps = 5                        // lite steps whose median is compared with it
	autoPersist     = 3                        // consecutive steps on which the change must hold (and half a window)
	autoMaxSpan     = 4096                     // steps a baseline or the recent steps hold at most
	// A change of the step time by this share, or of the idle share by
	// this much (and by half of it), asks for a window.
	autoStepChange = 0.25
	autoIdleRise   = 0.05
)

// autoSchedule decides when the per-launch probes are attached. It runs on
// the pipeline's goroutine: steps come from the engine's sink there, and
// tick from the feed loop.
type autoSchedule struct {
	window, every time.Duration
	log           *slog.Logger

	full    bool      // the window wanted now
	warm    bool      // the warm-up window is over
	active  time.Time // end of the first step (or fixed window) delivered
	since   time.Time
	lastEnd time.Time // when the last window ended
	steps   int       // pattern steps seen inside the current window
	reason  string

	demand string // a window asked for by a change, "" when none
	procs  map[uint32]*autoBaseline

	windows int
	// settling: the processes whose latest step of the warm-up was laid
	// while their step site was still looked for (Step.ClockSettling).
	settling map[uint32]bool
}

// autoBaseline is one process's lite steps since the last window. The
// baseline and the recent steps each hold autoBaseSteps (autoRecentSteps)
// steps and at least a window's (half a window's) time: a loop of 2 ms
// steps measures its baseline over 250 steps, not over 16 ms that one
// hiccup can fill.
type autoBaseline struct {
	durs, idle []float64 // the baseline's steps
	baseFrom   int64     // start of the baseline's first step
	baseDur    float64
	baseIdle   float64
	based      bool
	recent     []autoRecent
	// durBuf, idleBuf: scratch for the recent steps' medians.
	durBuf, idleBuf []float64
	changed         int   // consecutive steps that showed the change
	since           int64 // end of the first of them
}

type autoRecent struct {
	end       int64
	dur, idle float64
}

func newAutoSchedule(window, every time.Duration, now time.Time, log *slog.Logger) *autoSchedule {
	return &autoSchedule{window: window, every: every, log: log, full: true, since: now, reason: "start",
		procs: map[uint32]*autoBaseline{}, settling: map[uint32]bool{}}
}

// step takes one finished step from the engine.
func (a *autoSchedule) step(st correlate.Step) {
	if a.active.IsZero() {
		a.active = time.Unix(0, st.End)
	}
	if a.full {
		if !st.Window && st.Start >= a.since.UnixNano() {
			a.steps++
		}
		if !a.warm {
			if st.ClockSettling {
				a.settling[st.PID] = true
			} else {
				delete(a.settling, st.PID)
			}
		}
		return
	}
	if st.Start < a.lastEnd.UnixNano() {
		return
	}
	b := a.procs[st.PID]
	if b == nil {
		b = &autoBaseline{}
		a.procs[st.PID] = b
	}
	if st.Window {
		if b.based {
			a.ask("step pattern lost", st.PID)
		}
		return
	}
	dur := float64(st.End - st.Start)
	if !b.based {
		if len(b.durs) == 0 {
			b.baseFrom = st.Start
		}
		b.durs, b.idle = append(b.durs, dur), append(b.idle, st.IdleRatio)
		if len(b.durs) >= autoBaseSteps && st.End-b.baseFrom >= int64(a.window) || len(b.durs) >= autoMaxSpan {
			b.baseDur, b.baseIdle, b.based = stats.Median(b.durs), stats.Median(b.idle), true
			b.durs, b.idle = nil, nil
		}
		return
	}
	b.recent = append(b.recent, autoRecent{st.End, dur, st.IdleRatio})
	for len(b.recent) > autoRecentSteps && (st.End-b.recent[1].end >= int64(a.window/2) || len(b.recent) > autoMaxSpan) {
		b.recent = b.recent[1:]
	}
	if len(b.recent) < autoRecentSteps || st.End-b.recent[0].end < int64(a.window/2) && len(b.recent) < autoMaxSpan {
		return
	}
	// Medians over several steps, held for several steps: one slow step
	// (a checkpoint, a stall every few steps) is what lite sees well.
	// Into buffers kept per process: a copy of each list for every step
	// was a twentieth of what the sidecar allocated at 190 steps/s.
	b.durBuf, b.idleBuf = b.durBuf[:0], b.idleBuf[:0]
	for _, r := range b.recent {
		b.durBuf, b.idleBuf = append(b.durBuf, r.dur), append(b.idleBuf, r.idle)
	}
	d, i := stats.MedianInPlace(b.durBuf), stats.MedianInPlace(b.idleBuf)
	why := ""
	switch {
	case d > b.baseDur*(1+autoStepChange) || d < b.baseDur*(1-autoStepChange):
		why = "step time changed"
	case i > b.baseIdle+autoIdleRise && i > b.baseIdle*1.5:
		why = "idle rose"
	}
	if why == "" {
		b.changed = 0
		return
	}
	if b.changed == 0 {
		b.since = st.End
	}
	if b.changed++; b.changed >= autoPersist && st.End-b.since >= int64(a.window/2) {
		a.ask(why, st.PID)
	}
}

// detached says when the per-launch probes were all detached: the steps
// before then ran (partly) with them, so the lite baseline begins after.
func (a *autoSchedule) detached(at time.Time) {
	if at.After(a.lastEnd) {
		a.lastEnd = at
	}
	a.procs = map[uint32]*autoBaseline{}
}

func (a *autoSchedule) ask(reason string, pid uint32) {
	if a.demand == "" {
		a.log.Debug("auto: window asked for", "reason", reason, "pid", pid)
		a.demand = reason
	}
}

// demandEvery is the least time between windows asked for by changes: a
// job whose steps keep changing must not run at full.
func (a *autoSchedule) demandEvery() time.Duration {
	return max(autoMaxWindows*a.window, a.every/4)
}

// tick says whether the probes should change now (and to what).
func (a *autoSchedule) tick(now time.Time) (change, full bool, reason string) {
	elapsed := now.Sub(a.since)
	if a.full {
		done := false
		if !a.warm {
			// Until the job does GPU work the per-launch probes cost
			// nothing: the warm-up's time limit runs from its first step
			// (a model that loads for minutes keeps its first window).
			// Nor while a process's step site is still being looked
			// for: the checks that see the launches tell its iterations
			// from micro-batches and an evaluation's batches.
			done = (a.steps >= autoWarmupSteps && elapsed >= a.window && len(a.settling) == 0) ||
				(!a.active.IsZero() && now.Sub(a.active) >= autoWarmupMax*a.window)
		} else {
			done = (a.steps >= autoMinSteps && elapsed >= a.window) || elapsed >= autoMaxWindows*a.window
		}
		if !done {
			return false, true, ""
		}
		a.full, a.warm, a.since, a.lastEnd = false, true, now, now
		a.procs = map[uint32]*autoBaseline{} // lite baselines start afresh after each window
		a.demand = ""
		return true, false, a.reason
	}
	switch {
	case now.Sub(a.lastEnd) >= a.every:
		a.reason = "periodic"
	case a.demand != "" && now.Sub(a.lastEnd) >= a.demandEvery():
		a.reason = a.demand
	default:
		return false, false, ""
	}
	a.full, a.since, a.steps, a.demand = true, now, 0, ""
	a.windows++
	return true, true, a.reason
}

// autoSink passes steps to the schedule.
type autoSink struct{ a *autoSchedule }

func (s autoSink) Gap(correlate.Gap)            {}
func (s autoSink) Step(st correlate.StepResult) { s.a.step(st.Step) }

// autoToggle is a finished attach or detach of the per-launch probes.
type autoToggle struct {
	full   bool
	reason string
	res    tracer.LaunchToggle
	err    error
}

// autoCost is what the toggles took, for the exit log.
type autoCost struct {
	attaches, detaches int
	attach, detach     time.Duration
}

// autoTick asks the schedule and starts an attach or a detach. The engine
// learns of a detach before it begins and of an attach once it is done, so
// no span it calls full lacks a probe.
func (p *pipeline) autoTick(now time.Time) {
	if p.auto == nil || p.toggling {
		return
	}
	change, full, reason := p.auto.tick(now)
	if !change {
		return
	}
	p.toggling = true
	var off int64
	if !full {
		off = time.Now().UnixNano()
		p.probesLive(false, off)
	}
	go func() {
		res, err := p.tr.SetLaunchProbes(full)
		if !full {
			res.At = off
		}
		p.toggles <- autoToggle{full: full, reason: reason, res: res, err: err}
	}()
}

func (p *pipeline) toggled(tg autoToggle) {
	p.toggling = false
	if tg.err != nil {
		p.log.Warn("auto: toggling the per-launch probes failed", "full", tg.full, "err", tg.err)
		return
	}
	if tg.full {
		p.probesLive(true, tg.res.At)
		p.autoCost.attaches++
		p.autoCost.attach += tg.res.Took
		p.log.Debug("auto: per-launch probes attached", "at", tg.res.At, "reason", tg.reason, "links", tg.res.Links, "took", tg.res.Took)
		return
	}
	p.autoCost.detaches++
	p.autoCost.detach += tg.res.Took
	p.auto.detached(time.Unix(0, tg.res.At).Add(tg.res.Took))
	p.log.Debug("auto: per-launch probes detached", "at", tg.res.At, "after", tg.reason, "links", tg.res.Links, "took", tg.res.Took)
}

func meanDur(d time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// probesLive tells the engine (recorded with --record) where a window of
// per-launch probes begins or ends.
func (p *pipeline) probesLive(full bool, at int64) {
	p.in.ProbesLive(full, at)
}
