package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/gpusample"
	"github.com/gaptrace/gaptrace/internal/wake"
)

// event feeds one host event to the engine. A new or exec'd process's
// workload is read while it lives: its last gaps are emitted after it exited.
func (p *pipeline) event(ev *event.Event) {
	switch {
	case ev.Kind == event.KindFork && !ev.IsThread:
		p.work.Of(ev.ChildPID)
		p.named(ev.ChildPID, ev.TaskComm) // the fork record holds the child's comm
	case ev.Kind == event.KindExec:
		p.work.Forget(ev.PID)
		p.work.Of(ev.PID)
		p.named(ev.PID, ev.TaskComm)
		delete(p.ranked, ev.PID)
	case ev.Kind == event.KindExit && ev.TID == ev.PID:
		delete(p.ranked, ev.PID)
		p.hangs.exit(ev)
	case ev.Kind == event.KindCommInit:
		p.hangs.commInit(ev)
	case ev.Kind == event.KindCollective:
		p.hangs.collective(ev)
		if p.ranked[ev.PID] {
			break
		}
		// A communicator the engine did not see created is linked to
		// the other ranks' by its collectives; the environment names the
		// rank and the job's size.
		p.ranked[ev.PID] = true
		if rank, size, ok := p.work.RankOf(ev.PID); ok {
			p.in.SetRank(ev.PID, rank, size)
		}
	}
	p.in.Event(*ev)
}

// batch feeds a batch of the tracer's events to the engine and hands the
// slice back for reuse.
func (p *pipeline) batch(evs []event.Event) {
	for i := range evs {
		p.event(&evs[i])
	}
	p.tr.Recycle(evs)
}

// delivered is the latest time, at most now, before which the engine has
// every traced event: the tracer's delivered bound, once the events it had
// sent into p.events (sent before it set that bound) are taken. 0 while the
// tracer has not yet caught up with its ring buffer.
func (p *pipeline) delivered(now int64) int64 {
	d := p.tr.Delivered()
	for range len(p.events) {
		p.batch(<-p.events)
	}
	at := engineClock(now, d)
	if at != min(now, d) && !p.lagged {
		p.lagged = true
		p.log.Warn("the ring buffer reader has not caught up for "+maxReaderLag.String()+
			"; the engine's clock trails the wall clock by that much, and later events count as late",
			"delivered_ns", d)
	}
	return at
}

// maxReaderLag bounds how far the engine's clock trails the wall clock for
// a reader that never finds the ring buffer empty (a probe firing faster
// than it is read, or an attach that lands in a burst): the engine then
// still emits steps and gaps, a window behind.
const maxReaderLag = 2 * time.Second

// engineClock is the engine's time at wall-clock now when the tracer has
// delivered every event that ended before delivered (0: not yet known).
func engineClock(now, delivered int64) int64 {
	return min(now, max(delivered, now-int64(maxReaderLag)))
}

func (p *pipeline) Run(ctx context.Context) error {
	trDone := make(chan error, 1)
	go func() { trDone <- p.tr.RunBatches(ctx, p.events) }()
	var gpuDone chan error
	var changes <-chan gpusample.Finding
	// GPU sampling outlives ctx by windowDrain, so that the windows
	// covering the last steps still reach the engine.
	gctx, gcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer gcancel()
	stopping, drained := ctx.Done(), (<-chan time.Time)(nil)
	if p.gpu != nil {
		gpuDone = make(chan error, 1)
		go func() { gpuDone <- p.gpu.Run(gctx, p.windows) }()
		changes = p.gpu.Changes()
	} else {
		gcancel()
	}
	var fromPeers <-chan peers.Batch
	if p.peers != nil {
		fromPeers = p.peers.Recv()
	}
	defer p.watchHangs(ctx)()
	advance := wake.NewTicker(advanceEvery)
	defer advance.Stop()
	lastSnap, lastDev := time.Time{}, time.Time{}
	p.mapDevices()

	var runErr error
	for trDone != nil || gpuDone != nil {
		select {
		case evs := <-p.events:
			p.batch(evs)
		case w := <-p.windows:
			p.window(w)
		case <-stopping:
			stopping, drained = nil, time.After(windowDrain)
		case <-drained:
			drained = nil
			gcancel()
		case f, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			lvl := slog.LevelInfo
			if f.Level != gpusample.OK {
				lvl = slog.LevelWarn
			}
			p.log.Log(ctx, lvl, "GPU health changed: "+f.Detail, "device", f.Device, "check", f.Check, "fix", f.Fix)
		case tg := <-p.toggles:
			p.toggled(tg)
		case b, ok := <-fromPeers:
			if !ok {
				fromPeers = nil
				continue
			}
			p.peerBatch(b)
		case now := <-advance.C:
			advance.Next()
			at := now.UnixNano()
			if trDone != nil {
				// While the tracer runs, the engine's clock is what it
				// has delivered: on a busy host the reader lags the wall
				// clock, and events behind the watermark come too late
				// to move the queue model.
				at = p.delivered(at)
			}
			if at > 0 {
				p.in.Advance(at)
			}
			p.autoTick(now)
			if now.Sub(lastDev) >= deviceEvery {
				lastDev = now
				p.mapDevices()
			}
			if now.Sub(lastSnap) >= snapshotEvery {
				lastSnap = now
				st := p.tr.Stats()
				p.exp.DroppedEvents(st.RingDrops)
				p.exp.Events(st.EventsByKind)
				p.exp.Losses(p.eng.Losses())
				if p.cfg.Snapshot != nil {
					sum := p.eng.Snapshot()
					sum.DroppedEvents = st.RingDrops
					p.cfg.Snapshot(sum)
				}
			}
		case err := <-trDone:
			trDone = nil
			if err != nil {
				p.log.Error("tracer stopped", "err", err)
				runErr = errors.Join(runErr, err)
			}
		case err := <-gpuDone:
			gpuDone = nil
			if err != nil && ctx.Err() == nil {
				// The GPU view is an accuracy aid, not a requirement:
				// keep tracing with host evidence.
				p.log.Warn("GPU sampling stopped; continuing with host evidence only", "err", err)
			}
		}
	}
	// Both producers have returned: what they queued is all there is.
	for {
		select {
		case evs := <-p.events:
			p.batch(evs)
		case w := <-p.windows:
			p.window(w)
		default:
			return runErr
		}
	}
}

func (p *pipeline) window(w event.GPUWindow) {
	p.in.Window(w)
	p.hangs.window(&w)
	if p.winOut != nil {
		p.winOut.write(w)
	}
}
