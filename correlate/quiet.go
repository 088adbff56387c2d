package correlate

import (
	"time"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// A queue that drains after a few trailing launches or copies.
//
// A sync that found the queue empty opens a gap, and the next enqueue ends
// it. Training loops often launch a few small kernels right after the
// step's last sync (GradScaler.update after its found_inf read, an
// optimizer step after loss.item(), a metric accumulated on the device),
// or copy a batch and then wait for the GIL, then spend milliseconds on
// the host (the next batch, a checkpoint's pickling, another thread
// holding the GIL) before the next step's work. That work ends the gap at
// once, and no later sync says when it finished: the GPU idles for the
// whole host stretch, unseen.
//
// With per-launch probes each CUDA event carries the thread's last launch
// before it (Event.LastLaunch) and the launches it has not flushed yet
// (Event.Pending), and a launch that comes after a pause of 1 ms is
// emitted. When the work queued since the queue was last empty is one
// thread's small burst (a few launches, copies of known size), and that
// thread's next CUDA call comes long after its last launch, the queue ran
// dry when the burst's work was done: its launches times the usual GPU
// time per launch (a step's busy time over its launches, as the windows
// measured it) plus its bytes at a slow PCIe rate after the burst began,
// and never before the last launch's kernel. The gap opens there, as if a
// sync had seen it, and what follows (a copy, an episode, a sync) is
// handled as in any open gap. A sync that then still waits proves the
// estimate wrong and rejects the gap, as it rejects any open gap it finds
// work behind. The host cannot see a kernel's length: a trailing burst of
// kernels longer than the step's average (a fused optimizer step after
// loss.item()) opens its gap too early by what they ran past it, one of
// shorter kernels too late.

const (
	// quietBurstMax is the most launches a trailing burst may hold: past
	// it the work is a step's, whose length the windows judge (CPU ahead).
	quietBurstMax = 16
	// quietShare: a trailing burst holds at most this share (1/quietShare)
	// of the launches recent syncs usually flush.
	quietShare = 4
	// perLaunchDefault is the GPU time assumed per launch before any step
	// measured it, and perLaunchMin the least ever assumed.
	perLaunchDefault = int64(50 * time.Microsecond)
	perLaunchMin     = int64(5 * time.Microsecond)
	// burstCopyBps is the rate a burst's copies are assumed to move at: a
	// slow link's, so that the gap opens late rather than early.
	burstCopyBps = 10e9
)

// quietDrain opens the gap a trailing burst's drain began, when ev (a CUDA
// event of th) shows th stopped launching long enough before it.
func (p *proc) quietDrain(x env, th *attribute.Thread, ev *event.Event) {
	start, bytes, ok := p.burst.Of(th.TID)
	if !ok || ev.LastLaunch == 0 || p.gap.cur() != nil || p.hold != nil || p.q.AllDrained() {
		// LastLaunch is 0 where launches are not probed (lite) or before
		// the thread's first launch.
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
	if x.liteOver(start, ev.Start) || p.q.LastEnqueue() > max(start, ev.LastLaunch) {
		return
	}
	// A trailing burst is a small part of what the loop launches between
	// its syncs; a step's worth of launches is the CPU running ahead, whose
	// queued work the windows judge (ahead.go).
	n := p.burst.LaunchesBefore(ev)
	if n > quietBurstMax || p.syncLaunches.n < minHistory || int64(n)*quietShare > p.syncLaunches.high(waitRecent) {
		return
	}
	per := p.perLaunch()
	drained := start + int64(n)*per + int64(float64(bytes)/burstCopyBps*1e9)
	if ev.LastLaunch >= start {
		drained = max(drained, ev.LastLaunch+per)
	}
	if ev.Start-drained < x.set.minGap {
		return
	}
	p.q.DrainAll()
	p.burst.End()
	p.ahead.Reset()
	p.gap.begin(&openGap{start: drained, tid: th.TID, quiet: true})
}

// perLaunch is the usual GPU time per launch: the lower quartile over
// recent steps of their busy time (length less idle, from the windows) per
// launch, counting steps of at least busyLaunchMin launches. A thread's
// launches are counted when it next flushes, often in a later step
// (PyTorch's backward runs on a thread of its own), and the first
// iterations autotune for long: one step's ratio can be far off, and the
// kernels that trail a sync are a step's short ones, not its average.
func (p *proc) perLaunch() int64 {
	if p.busyPerLaunch.n < minHistory {
		return perLaunchDefault
	}
	return max(p.busyPerLaunch.low(), perLaunchMin)
}

// busyLaunchMin is the fewest launches a step must hold for its busy time
// per launch to count.
const busyLaunchMin = 32

// noteBusyPerLaunch learns the GPU time per launch from a finished step
// whose idle the windows measured (windowed).
func (p *proc) noteBusyPerLaunch(st *stepAcc, windowed bool) {
	busy := st.End - st.Start - st.IdleNS
	if !windowed || st.Launches < busyLaunchMin || busy <= 0 {
		return
	}
	p.busyPerLaunch.push(busy / int64(st.Launches))
}
