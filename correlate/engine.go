package correlate

import (
	"log/slog"
	"time"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/ranks"
	"github.com/gaptrace/gaptrace/correlate/reorder"
	"github.com/gaptrace/gaptrace/event"
)

// clock is the engine's time as the models see it: now is the latest wall
// clock from Advance, wm the watermark (every event ending at or before it
// is processed).
type clock struct{ now, wm int64 }

// env is what one call into a process's models may read: the settings, the
// world around the process, its device and the clock. Nothing in it leads
// to the Sink or the totals: models leave decisions in their outbox.
type env struct {
	set settings
	w   *world
	d   *device
	clk clock
}

// Engine turns host events and GPU windows into attributed gaps and steps.
// It is not safe for concurrent use: one goroutine feeds it.
type Engine struct {
	set  settings
	sink Sink
	log  *slog.Logger
	world
	// clocks: each process's step clock, by the steps it emitted
	// (stepsite.go).
	clocks map[uint32]*StepClock

	queue reorder.Queue
	wm    int64 // watermark: every event ending at or before it is processed
	now   int64
	first int64
	last  int64

	swept int64
	// ended: threads that exited, kept for retain so that a gap decided
	// later can still follow a wait to them (a thread that held the GIL
	// and exited), in exit order.
	ended    []*attribute.Thread
	totals   Summary
	rejected uint64
	// lost counts what arrived but could not be used in full; lateWarn
	// and forcedWarn are the watermarks of the last warnings about it.
	lost                 Losses
	lateWarn, forcedWarn int64
}

// lossWarnEvery spaces the warnings about late and forced events in event
// time: the first says when they begin, later ones that they go on.
const lossWarnEvery = int64(time.Minute)

// New returns an Engine that reports to sink. An invalid cfg is logged and
// its invalid fields replaced by defaults; call cfg.Validate first to fail.
func New(cfg Config, sink Sink) *Engine {
	if err := cfg.Validate(); err != nil {
		if cfg.Logger == nil {
			cfg.Logger = slog.Default()
		}
		cfg.Logger.Warn("invalid correlate config, using defaults where invalid", "component", "correlate", "err", err)
		if cfg.Probes != ProbesLite && cfg.Probes != ProbesAuto {
			cfg.Probes = ProbesFull
		}
		if cfg.EmitDelay > maxEmitDelay {
			cfg.EmitDelay = DefaultEmitDelay
		}
	}
	cfg = cfg.withDefaults()
	set := newSettings(cfg)
	return &Engine{
		set:    set,
		sink:   sink,
		log:    set.log,
		world:  newWorld(cfg.NoGPUWindows, cfg.GPMDevices),
		totals: Summary{ByCause: map[Cause]int64{}},
	}
}

// SetDevice says which device a process uses (default 0). Call it before
// the process's first event.
func (e *Engine) SetDevice(pid uint32, dev int) {
	e.devOf[pid] = dev
	if p := e.procs[pid]; p != nil {
		p.dev = dev
	}
}

// SetRank says what process pid's environment says of its place in a
// distributed job: its rank (RANK) and the job's size (WORLD_SIZE; 0 when
// unknown). A communicator whose creation the engine did not see is linked
// to other processes' by its collectives (correlate/ranks); the rank names the
// process in the verdicts on it, and the size says when its group is
// whole. Call it before the process's first collective.
func (e *Engine) SetRank(pid uint32, rank, size int) {
	if rank < 0 {
		return
	}
	e.ranks.SetRank(pid, int32(rank), int32(max(size, 0)))
}

// Event buffers one host event; it is processed once the watermark passes
// its end.
func (e *Engine) Event(ev event.Event) {
	if ev.Kind == event.KindCommInit {
		// Order does not matter: a communicator is created long before
		// anything waits on it.
		e.ranks.Add(&ev)
		return
	}
	if ev.Kind == event.KindFaultRead {
		// Kept aside as samples are, for the cpu time of later gaps.
		e.samples.reads.add(&ev)
		return
	}
	if ev.Kind == event.KindCPUSample {
		// Kept aside for the gaps decided later: a sample moves no model.
		e.samples.add(&ev)
		return
	}
	if ev.End < ev.Start {
		ev.End = ev.Start
	}
	if ev.End > e.last {
		e.last = ev.End
	}
	if e.first == 0 || ev.Start < e.first {
		e.first = ev.Start
	}
	if ev.End <= e.wm && e.wm != 0 {
		e.lost.LateEvents++
		if e.lost.LateEvents == 1 || e.wm-e.lateWarn >= lossWarnEvery {
			e.lateWarn = e.wm
			e.log.Warn("events arrived after the watermark: evidence only, the gaps they would have moved are decided",
				"late", e.lost.LateEvents, "behind_ms", (e.wm-ev.End)/1e6)
		}
		e.processLate(ev)
		return
	}
	e.queue.Push(ev)
	if e.queue.Len() > e.set.maxBuf {
		e.force()
	}
}

// force processes the oldest buffered events before the watermark
// reaches them: the queue is full (a reader far behind its ring buffer, a
// probe flooding). The watermark moves to their end, as if Advance had
// come, so one that ends earlier and arrives later is late.
func (e *Engine) force() {
	n := e.queue.Len()
	e.drain(e.queue.MinEnd())
	e.lost.ForcedEvents += uint64(n - e.queue.Len())
	if e.forcedWarn == 0 || e.wm-e.forcedWarn >= lossWarnEvery {
		e.forcedWarn = e.wm
		e.log.Warn("event queue full: the oldest events are processed before their watermark",
			"forced", e.lost.ForcedEvents, "max_buffered", e.set.maxBuf)
	}
}

// Window records one GPU sampling window.
func (e *Engine) Window(w event.GPUWindow) {
	if w.End <= w.Start {
		return
	}
	e.device(w.Device).addWindow(w)
}

// Advance processes everything that ended before now-EmitDelay and emits
// what became final.
func (e *Engine) Advance(now int64) {
	if now > e.now {
		e.now = now
	}
	wm := now - e.set.emitDelay
	e.drain(wm)
	e.finalize(false)
}

// Close flushes everything and returns the totals. DroppedEvents is left
// for the caller.
func (e *Engine) Close(now int64) Summary {
	if now > e.now {
		e.now = now
	}
	end := e.now
	if e.last > end {
		end = e.last
	}
	e.drain(end)
	e.now = end + windowWait + holdMax // everything is past its deadline
	e.finalize(true)
	if n := e.ranks.Realigned(); n > 0 {
		e.log.Info("communicators realigned by their collectives: a collective was issued before the probes saw it",
			"realigned", n)
	}
	if l := e.Losses(); l.Any() {
		e.log.Info("the engine could not use every event in full", "late_events", l.LateEvents, "forced_events", l.ForcedEvents,
			"dropped_intervals", l.DroppedIntervals, "incomplete_steps", l.IncompleteSteps, "gaps_after_step", l.GapsAfterStep)
	}
	return e.Snapshot()
}

// Losses returns what the engine could not use in full so far.
func (e *Engine) Losses() Losses {
	l := e.lost
	l.DroppedIntervals = e.droppedIntervals
	return l
}

// Snapshot returns the running totals.
func (e *Engine) Snapshot() Summary {
	s := e.totals
	s.ByCause = make(map[Cause]int64, len(e.totals.ByCause))
	for k, v := range e.totals.ByCause {
		s.ByCause[k] = v
	}
	if e.last > e.first && e.first > 0 {
		s.WallNS = e.last - e.first
	}
	s.Losses = e.Losses()
	s.StepClocks = e.stepClocks()
	if m := e.set.modes; m != nil {
		s.Probes = ProbesAuto
		if s.WallNS > 0 {
			s.ProbesFullNS = m.fullNS(e.first, e.last)
		}
	}
	return s
}

// Stats are the engine's own counters, for logs and self-metrics.
type Stats struct {
	// LateEvents arrived after the watermark had passed their end: they
	// only served as evidence (Losses.LateEvents). Many mean EmitDelay is
	// too short for the tracer's batching.
	LateEvents uint64
	// Rejected counts gaps and stalls discarded as untrustworthy: a gap
	// contradicted by a sync that waited (lost events), a comm stall
	// contradicted by high SM activity.
	Rejected uint64
	// Buffered is the number of events waiting for the watermark.
	Buffered int
	// Processes and Threads are the live state sizes.
	Processes, Threads int
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{LateEvents: e.lost.LateEvents, Rejected: e.rejected, Buffered: e.queue.Len(), Processes: len(e.procs), Threads: len(e.threads)}
}

// drain processes buffered events up to wm in end order.
func (e *Engine) drain(wm int64) {
	for {
		ev, ok := e.queue.Pop(wm)
		if !ok {
			break
		}
		e.process(&ev)
	}
	if wm > e.wm {
		e.wm = wm
	}
}

// process applies one event in watermark order.
func (e *Engine) process(ev *event.Event) {
	p := e.proc(ev.PID, ev.Start)
	if ev.End > p.last {
		p.last = ev.End
	}
	if ev.TaskComm != "" && ev.PID == ev.TID && p.comm == "" {
		p.comm = ev.TaskComm
	}
	switch ev.Kind {
	case event.KindFork:
		if ev.IsThread {
			th := e.newThread(ev.ChildPID, ev.PID)
			e.threads[ev.ChildPID] = th
			p.tids[ev.ChildPID] = struct{}{}
			return
		}
		c := e.proc(ev.ChildPID, ev.Start)
		c.parent = ev.PID
		c.last = max(c.last, ev.End)
		c.comm = p.comm
		return
	case event.KindExec:
		p.comm = ev.TaskComm
		if p.comm == "" {
			p.comm = ev.Name
		}
		return
	case event.KindExit:
		e.exit(p, ev)
		return
	case event.KindOpen:
		e.thread(ev).NoteOpen(ev)
		return
	case event.KindClose, event.KindInvalid:
		return
	case event.KindMarker:
		p.onMarker(e.env(p), ev)
		e.apply(p)
		return
	}
	th := e.thread(ev)
	if ev.End > th.Last {
		th.Last = ev.End
	}
	if ev.WakerPID == ev.PID && ev.WakerTID != 0 && ev.WakerTID != ev.TID {
		e.waker(p, ev)
	}
	if ev.WakerPID != 0 && ev.WakerPID != ev.PID {
		// A worker that only computes emits nothing; waking a feeder
		// proves it is alive.
		if w := e.procs[ev.WakerPID]; w != nil && ev.End > w.last {
			w.last = ev.End
		}
	}
	p.quietDrain(e.env(p), th, ev)
	if p.episodeEvent(e.env(p), th, ev) {
		e.apply(p)
		e.trimThread(th, p)
		return
	}
	switch ev.Kind {
	case event.KindEnqueue, event.KindMemcpyAsync, event.KindMemset, event.KindCollective:
		var coll *CollectiveEvidence
		var ref ranks.Ref
		if ev.Kind == event.KindCollective {
			coll, ref = e.collEvidence(ev), e.ranks.Issue(ev, p.q.WorkSince(ev.Start))
		}
		p.onEnqueue(e.env(p), th, ev, coll, ref)
	case event.KindSync:
		th.WokenSync(ev)
		th.Add(ev)
		p.onSync(e.env(p), th, ev)
	case event.KindMemcpy, event.KindFree:
		th.Add(ev)
		p.onSyncCopy(e.env(p), th, ev)
	case event.KindAlloc, event.KindGroupEnd, event.KindSyscall, event.KindRunqueue, event.KindOffCPU:
		th.Add(ev)
		p.onBlocking(th, ev)
	}
	e.apply(p)
	e.trimThread(th, p)
}

// processLate keeps late host activity as evidence; it can no longer move
// the queue model, whose decisions up to the watermark are already made.
func (e *Engine) processLate(ev event.Event) {
	switch ev.Kind {
	case event.KindAlloc, event.KindGroupEnd, event.KindSyscall, event.KindRunqueue, event.KindOffCPU,
		event.KindMemcpy, event.KindFree, event.KindSync, event.KindMemcpyStaged:
		e.proc(ev.PID, ev.Start)
		th := e.thread(&ev)
		th.Insert(&ev)
	case event.KindFork, event.KindExec, event.KindExit:
		e.process(&ev)
	case event.KindCollective:
		// Too late to move the queue model, but it still takes its place
		// in its communicator's sequence: the k-th collective of every
		// rank must stay the same collective.
		e.ranks.Issue(&ev, 0)
	}
}

func (e *Engine) exit(p *proc, ev *event.Event) {
	if ev.TID != ev.PID {
		if th := e.threads[ev.TID]; th != nil && th.PID == ev.PID && !p.feeders.has(ev.TID) && th.Exited == 0 {
			th.Exited = max(ev.End, 1)
			e.ended = append(e.ended, th)
		}
		return
	}
	// The process is gone: close what it had open. Its last steps still
	// wait for the GPU windows that cover them (they arrive late); finalize
	// forgets it once they are out.
	p.release(e.env(p))
	p.closeWaitAtExit(e.env(p), ev.End)
	p.closeAll(e.env(p), ev.End)
	p.exitedAt = ev.End
	if !p.everEnq {
		e.forget(p)
	}
}

// finalize resolves pending decisions and emits what became final.
func (e *Engine) finalize(force bool) {
	for _, p := range e.procs {
		x := e.env(p)
		done := force || (p.exitedAt != 0 && e.now >= p.exitedAt+windowWait+holdMax)
		p.resolvePending(x, done)
		if force && p.exitedAt == 0 {
			// The trace ends with the process's last event, not with the
			// sidecar's exit: a tail window would only count idle the
			// training loop never saw.
			p.release(x)
			p.closeAll(x, p.last)
			// Under the work clock, gaps of the last step waited for it.
			p.resolveHeld(x, true)
		}
		if p.exitedAt == 0 {
			p.tickSteps(x.set, e.wm)
		}
		p.finalizeSteps(x, done)
		e.apply(p)
		if p.exitedAt != 0 && (done || p.settled()) {
			e.forget(p)
		}
	}
	e.forgetEnded()
	e.ranks.ForgetGoneMirrors(e.wm, windowWait+holdMax)
	if e.wm-e.swept > sweepEvery && len(e.procs) > sweepProcs {
		e.sweep()
	}
	for _, d := range e.devs {
		keep := e.wm - retain
		for _, p := range e.procs {
			if p.dev == d.id {
				if k := p.keepFrom(e.wm); k < keep {
					keep = k
				}
			}
		}
		d.trim(keep)
	}
}

// waker makes sure the sibling that woke ev's thread is known. A thread
// that only computes emits nothing of its own, and one that existed before
// tracing began was never seen to start: the GIL holder that woke the
// feeder is often both. Known only from this wake-up, it is kept for
// retain like a thread that exited, unless it shows up itself.
func (e *Engine) waker(p *proc, ev *event.Event) {
	if th := e.threads[ev.WakerTID]; th != nil && th.PID == ev.PID {
		th.Last = max(th.Last, ev.End)
		return
	}
	th := e.newThread(ev.WakerTID, ev.PID)
	th.Last, th.Exited = ev.End, ev.End
	e.threads[th.TID] = th
	p.tids[th.TID] = struct{}{}
	e.ended = append(e.ended, th)
}

// forgetEnded forgets the threads that exited more than retain ago.
func (e *Engine) forgetEnded() {
	n := 0
	for n < len(e.ended) && e.ended[n].Exited < e.wm-retain {
		th := e.ended[n]
		if e.threads[th.TID] == th {
			delete(e.threads, th.TID)
			if p := e.procs[th.PID]; p != nil {
				delete(p.tids, th.TID)
			}
		}
		n++
	}
	if n > 0 {
		e.ended = append(e.ended[:0], e.ended[n:]...)
	}
}

// sweep forgets processes and threads that were never seen to exit but
// have been silent for forgetAfter (lost exit events, a tracer restarted
// mid-run): without it a day of data-loader respawns would pile up.
func (e *Engine) sweep() {
	e.swept = e.wm
	cut := e.wm - forgetAfter
	for pid, p := range e.procs {
		if p.everEnq || p.last >= cut {
			continue
		}
		for tid := range p.tids {
			if th := e.threads[tid]; th != nil && th.PID == pid {
				delete(e.threads, tid)
			}
		}
		delete(e.procs, pid)
		e.ranks.Forget(pid)
	}
	for tid, th := range e.threads {
		if th.Last < cut && th.Len() == 0 {
			if p := e.procs[th.PID]; p != nil && p.feeders.has(tid) {
				continue
			}
			delete(e.threads, tid)
			if p := e.procs[th.PID]; p != nil {
				delete(p.tids, tid)
			}
		}
	}
}

// trimThread bounds a timeline: feeders keep what their process's pending
// steps still need; everyone else keeps retain.
func (e *Engine) trimThread(th *attribute.Thread, p *proc) {
	keep := e.wm - retain
	if p.feeders.has(th.TID) {
		if k := p.keepFrom(e.wm); k < keep {
			keep = k
		}
	}
	th.Trim(keep)
}

// env is what a call into p's models may read: the settings, the world,
// p's device and the clock.
func (e *Engine) env(p *proc) env {
	return env{set: e.set, w: &e.world, d: e.device(p.dev), clk: clock{now: e.now, wm: e.wm}}
}

// apply turns what p's models decided into totals and sink calls, in the
// order they were decided. It is the only place results leave the engine.
func (e *Engine) apply(p *proc) {
	e.rejected += p.out.rejected
	e.lost.IncompleteSteps += p.out.incomplete
	e.lost.GapsAfterStep += p.out.afterStep
	for i := range p.out.ds {
		d := &p.out.ds[i]
		switch {
		case d.gap != nil:
			g := d.gap
			e.totals.Gaps++
			if g.Kind == GapStall {
				e.totals.GPUStallNS += g.Duration
			} else {
				e.totals.GPUIdleNS += g.Duration
			}
			for c, ns := range g.Breakdown {
				e.totals.ByCause[c] += ns
			}
			if e.sink != nil {
				e.sink.Gap(*g)
			}
		case d.step != nil:
			for _, c := range d.micro {
				e.totals.ByCause[c.c] += c.ns
			}
			e.totals.GPUIdleNS += d.step.MicroIdleNS
			if d.step.Window {
				e.totals.Windows++
			} else {
				e.totals.Steps++
			}
			e.noteClock(&d.step.Step)
			if e.sink != nil {
				e.sink.Step(*d.step)
			}
		}
	}
	p.out.reset()
}
