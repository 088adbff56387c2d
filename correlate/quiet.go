package correlate

import (
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// A queue that drains after a few trailing launches.
//
// A sync that found the queue empty opens a gap, and the next enqueue ends
// it. Training loops often launch a few small kernels right after the
// step's last sync (GradScaler.update after its found_inf read, an
// optimizer step after loss.item(), a metric accumulated on the device),
// then spend milliseconds on the host (the next batch, a checkpoint's
// pickling) before the next step's work. Those kernels end the gap at
// once, and no later sync says when they finished: the GPU idles for the
// whole host stretch, unseen.
//
// With per-launch probes each CUDA event carries the thread's last launch
// before it (Event.LastLaunch) and the launches it has not flushed yet
// (Event.Pending). When the work queued since the queue was last empty is
// one thread's small burst of launches, and that thread's next CUDA call
// comes long after its last launch, the queue ran dry when the burst's
// work was done: about its launches times the usual GPU time per launch
// after the burst began, and never before the last launch's kernel. The
// host cannot see a kernel's length: the usual time per launch is a
// step's average, which its long kernels dominate, while the kernels that
// trail a step's last sync are nearly always short (a scale update, a
// memset, a metric), so it counts at most quietPerLaunchMax. A trailing
// burst of long kernels (a fused optimizer step of a large model after
// loss.item()) opens its gap too early by what they ran past that. The
// gap opens there, as if a sync had seen it, and what follows (a copy, an
// episode, a sync) is handled as in any open gap. A sync that then still
// waits proves the estimate wrong and rejects the gap, as it rejects any
// open gap it finds work behind.

const (
	// quietBurstMax is the most launches a trailing burst may hold: past
	// it the work is a step's, whose length the windows judge (CPU ahead).
	quietBurstMax = 16
	// quietShare: a trailing burst holds at most this share (1/quietShare)
	// of the launches recent syncs usually flush.
	quietShare = 4
	// perLaunchDefault is the GPU time assumed per launch before any step
	// measured it, and perLaunchMin the least ever assumed.
	perLaunchDefault  = int64(50 * time.Microsecond)
	perLaunchMin      = int64(5 * time.Microsecond)
	quietPerLaunchMax = int64(100 * time.Microsecond)
)

// burst is the work one thread enqueued since the queue was last empty,
// while nothing else was enqueued: ok is false once anything else was.
type burst struct {
	tid   uint32
	start int64
	ok    bool
}

// noteBurst keeps the burst state current at an enqueue; wasDrained says
// whether the queue was empty before it.
func (p *proc) noteBurst(th *thread, ev *event.Event, wasDrained bool) {
	switch {
	case wasDrained && ev.Kind == event.KindEnqueue && ev.CUDA != event.CUGraphLaunch:
		p.burst = burst{tid: th.tid, start: ev.Start, ok: true}
	default:
		// A second burst, a copy, a memset, a collective or a graph
		// replay: the queue holds work whose length launches do not say.
		p.burst.ok = false
	}
}

// burstLaunches is how many launches the burst holds, as ev (the thread's
// next CUDA event) reports them.
func burstLaunches(ev *event.Event) uint64 {
	switch ev.Kind {
	case event.KindEnqueue:
		// Its count is the burst's launches since the first (flushed at
		// the burst's start) plus its own.
		return ev.Count
	case event.KindSync:
		return 1 + ev.Count
	}
	return 1 + ev.Pending
}

// quietDrain opens the gap a trailing burst's drain began, when ev (a CUDA
// event of th) shows th stopped launching long enough before it.
func (p *proc) quietDrain(x env, th *thread, ev *event.Event) {
	b := p.burst
	if !b.ok || b.tid != th.tid || ev.LastLaunch == 0 || p.gap != nil || p.hold != nil || p.allDrained() {
		return
	}
	switch ev.Kind {
	case event.KindEnqueue, event.KindMemcpyAsync, event.KindMemset:
	case event.KindSync, event.KindMemcpy, event.KindFree:
		if ev.Kind == event.KindSync && ev.Duration() > x.set.syncWaited {
			// It waited: the queue still held work.
			return
		}
	default:
		return
	}
	last := ev.LastLaunch
	if last < b.start || p.lastEnq > last || x.liteOver(b.start, ev.Start) {
		return
	}
	// A trailing burst is a small part of what the loop launches between
	// its syncs; a step's worth of launches is the CPU running ahead, whose
	// queued work the windows judge (ahead.go).
	n := burstLaunches(ev)
	if n > quietBurstMax || p.syncLaunches.n < minHistory || int64(n)*quietShare > p.syncLaunches.high(waitRecent) {
		return
	}
	per := min(p.perLaunch(), quietPerLaunchMax)
	drained := max(last+per, b.start+int64(n)*per)
	if ev.Start-drained < x.set.minGap {
		return
	}
	for _, s := range p.streams {
		s.pending, s.coll, s.ref = 0, nil, collRef{}
	}
	p.burst.ok = false
	p.aheadStart, p.aheadBlocked = 0, 0
	p.gap = &openGap{start: drained, tid: th.tid}
}

// perLaunch is the usual GPU time per launch: the median over recent
// steps of their busy time (length less idle, from the windows) per
// launch.
func (p *proc) perLaunch() int64 {
	if p.busyPerLaunch.n == 0 {
		return perLaunchDefault
	}
	return max(p.busyPerLaunch.recentMedian(leadRecent), perLaunchMin)
}

// noteBusyPerLaunch learns the GPU time per launch from a finished step
// whose idle the windows measured (windowed).
func (p *proc) noteBusyPerLaunch(st *stepAcc, windowed bool) {
	busy := st.End - st.Start - st.IdleNS
	if !windowed || st.Launches == 0 || busy <= 0 {
		return
	}
	p.busyPerLaunch.push(busy / int64(st.Launches))
}
