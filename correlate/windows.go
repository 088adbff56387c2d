package correlate

import (
	"sort"
	"time"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// device is one GPU: its sampling windows and the gaps already bounded on
// it, which the windows' idle totals are reconciled against.
type device struct {
	id int
	// noWindows: it sends no windows at all (Config.NoGPUWindows).
	noWindows bool
	// wins are the windows that give idle totals, sorted by start: NVML
	// utilization samples when there are any (they measure "no kernel
	// running", the definition of idle), else GPM.
	wins   []event.GPUWindow
	nvml   bool
	maxEnd int64
	// gpm are windows with SM activity, for confirming comm stalls.
	gpm    []event.GPUWindow
	gpmEnd int64
	// gpmComing: GPM windows will come (Config.GPMDevices), even before
	// the first has.
	gpmComing bool
	gaps      []interval.Span // emitted idle gaps
	stalls    []interval.Span // emitted comm stalls
	// busy are waits in syncs that found work queued: the host was
	// blocked, the queue only drained, so the GPU was busy throughout.
	busy []interval.Span
	// smPeak is the recent peak of GPM SM activity, the reference for
	// how busy this job's compute keeps the SMs.
	smPeak float64
	// bg is the recent micro-idle density (idle per ns of non-gap time),
	// -1 until a step measured it.
	bg float64
	// knownBuf: micro's scratch for the known spans (valid during a call).
	knownBuf [2][]interval.Span
}

func insertWindow(l []event.GPUWindow, w event.GPUWindow) []event.GPUWindow {
	i := sort.Search(len(l), func(i int) bool { return l[i].Start >= w.Start })
	if i < len(l) && l[i].Start == w.Start {
		l[i] = w // a resent sample replaces the first
		return l
	}
	l = append(l, event.GPUWindow{})
	copy(l[i+1:], l[i:])
	l[i] = w
	return l
}

func (d *device) addWindow(w event.GPUWindow) {
	if w.Source == event.SourceGPM && w.SMActivity >= 0 {
		d.gpm = insertWindow(d.gpm, w)
		d.gpmEnd = max(d.gpmEnd, w.End-w.Skew)
		// A slowly decaying peak: what this job's compute looks like to
		// GPM (halves in ~70 windows, ~7 s at the H200's 100 ms refresh).
		d.smPeak = max(w.SMActivity, d.smPeak*smPeakDecay)
	}
	if w.Source == event.SourceGPM && d.nvml {
		return
	}
	if w.Source != event.SourceGPM && !d.nvml {
		d.nvml = true
		d.wins, d.maxEnd = d.wins[:0], 0
	}
	d.wins = insertWindow(d.wins, w)
	d.maxEnd = max(d.maxEnd, w.End)
}

// hidden returns the spans the idle windows must not count as unbounded
// idle that overlap [lo,hi): the gaps, and for GPM (SM idle) also the comm
// stalls. Only the spans of the range are merged (a device keeps minutes
// of gaps; merging them all for every step was a fifth of what the sidecar
// allocated): inside the range the union is the same.
func (d *device) hidden(extra []interval.Span, lo, hi int64) []interval.Span {
	l := interval.Clip(d.gaps, lo, hi)
	if len(extra) == 0 && d.nvml {
		return l
	}
	if !d.nvml {
		l = interval.Merge(l, interval.Clip(d.stalls, lo, hi))
	}
	if len(extra) > 0 {
		l = interval.Merge(l, interval.Clip(extra, lo, hi))
	}
	return l
}

// winSpan is the time the windows cover, from the first's start to the
// latest end.
func winSpan(wins []event.GPUWindow) (lo, hi int64) {
	lo, hi = wins[0].Start, wins[0].End
	for _, w := range wins[1:] {
		lo, hi = min(lo, w.Start), max(hi, w.End)
	}
	return lo, hi
}

func (d *device) overlapping(a, b int64) []event.GPUWindow {
	i := sort.Search(len(d.wins), func(i int) bool { return d.wins[i].End > a })
	j := i
	for j < len(d.wins) && d.wins[j].Start < b {
		j++
	}
	return d.wins[i:j]
}

// micro is the unbounded idle of [s,e), window by window. The window's
// busy time, less the comm stalls in it (busy for utilization), is split
// across its non-gap time in proportion to the launches made there (weight):
// a training loop does the same GPU work every step, so busy time follows
// launches far better than idle time follows the clock when steps of one
// window differ in length. Without launch counts (lite), the window's idle
// minus its gaps is spread evenly over its non-gap time. nonGap is the
// window-covered non-gap time of [s,e).
func (d *device) micro(s, e int64, extra []interval.Span, weight func(a, b int64, hid []interval.Span) float64) (micro, free int64) {
	wins := d.overlapping(s, e)
	if len(wins) == 0 {
		return 0, 0
	}
	lo, hi := winSpan(wins)
	hid := d.hidden(extra, lo, hi)
	// known: time whose state the host already knows (gaps idle; sync
	// waits, and for NVML comm stalls, busy).
	// Into the device's scratch: a new list each step was most of the
	// engine's allocation by size on a loader job.
	known := interval.MergeAppend(d.knownBuf[0], hid, interval.Clip(d.busy, lo, hi))
	d.knownBuf[0] = known
	if d.nvml {
		known = interval.MergeAppend(d.knownBuf[1], known, interval.Clip(d.stalls, lo, hi))
		d.knownBuf[1] = known
	}
	var m float64
	for _, w := range wins {
		wl := w.End - w.Start
		a, b := max(s, w.Start), min(e, w.End)
		g := interval.Overlap(hid, w.Start, w.End)
		k := interval.Overlap(known, w.Start, w.End) - g // known busy
		wfree := wl - g - k
		in := (b - a) - interval.Overlap(known, a, b)
		if wfree <= 0 || in <= 0 {
			continue
		}
		free += in
		if weight != nil {
			if all := weight(w.Start, w.End, known); all > 0 {
				busy := max((1-w.IdleFraction)*float64(wl)-float64(k), 0)
				share := busy * weight(a, b, known) / all
				if x := float64(in) - share; x > 0 {
					m += x
				}
				continue
			}
		}
		u := max(w.IdleFraction*float64(wl)-float64(g), 0)
		m += u * float64(in) / float64(wfree)
	}
	return int64(m + 0.5), free
}

// gapsIn returns the hidden spans clipped to [s,e).
func (d *device) gapsIn(s, e int64, extra []interval.Span) []interval.Span {
	var out []interval.Span
	for _, h := range d.hidden(extra, s, e) {
		if h.B <= s || h.A >= e {
			continue
		}
		out = append(out, interval.Span{A: max(h.A, s), B: min(h.B, e)})
	}
	return out
}

// idleWithin estimates how much of [lo,hi) the GPU was idle: the windows'
// idle, less the gaps already bounded, less the usual micro-idle density
// over the rest of each window.
func (d *device) idleWithin(lo, hi int64, known []interval.Span) int64 {
	bg := max(d.bg, 0)
	wins := d.overlapping(lo, hi)
	if len(wins) == 0 {
		return 0
	}
	a, b := winSpan(wins)
	hid := d.hidden(known, a, b)
	var idle float64
	for _, w := range wins {
		a, b := max(lo, w.Start), min(hi, w.End)
		o := b - a
		wl := w.End - w.Start
		gAll := interval.Overlap(hid, w.Start, w.End)
		gIn := interval.Overlap(hid, a, b)
		gOut := gAll - gIn
		// Outside the interval, sync waits were busy: only the rest can
		// hold background micro-gaps.
		kOut := interval.Overlap(d.busy, w.Start, w.End) - interval.Overlap(d.busy, a, b)
		out := max(wl-o-gOut-kOut, 0)
		in := w.IdleFraction*float64(wl) - float64(gAll) - bg*float64(out)
		in = min(max(in, 0), float64(o-gIn))
		idle += in
	}
	return int64(idle + 0.5)
}

// idleAtMost bounds from above the idle in [lo,hi) that no bounded gap
// (nor known, as for idleWithin) holds: per window, its idle less every
// bounded gap in it, and never more than the unbounded part of the overlap.
func (d *device) idleAtMost(lo, hi int64, known []interval.Span) int64 {
	wins := d.overlapping(lo, hi)
	if len(wins) == 0 {
		return 0
	}
	a, b := winSpan(wins)
	hid := d.hidden(known, a, b)
	var idle float64
	for _, w := range wins {
		a, b := max(lo, w.Start), min(hi, w.End)
		wl := w.End - w.Start
		gAll := interval.Overlap(hid, w.Start, w.End)
		gIn := interval.Overlap(hid, a, b)
		idle += min(max(w.IdleFraction*float64(wl)-float64(gAll), 0), float64(b-a-gIn))
	}
	return int64(idle + 0.5)
}

// coverEnd is the end of the first idle window that reaches t, 0 if none.
func (d *device) coverEnd(t int64) int64 {
	i := sort.Search(len(d.wins), func(i int) bool { return d.wins[i].End >= t })
	if i < len(d.wins) {
		return d.wins[i].End
	}
	return 0
}

// busyFraction is the overlap-weighted mean NVML utilization (kernel
// running, spinning collectives included) over [a,b), -1 when the device
// sends no NVML samples.
func (d *device) busyFraction(a, b int64) float64 {
	if !d.nvml {
		return -1
	}
	var sum, n float64
	for _, w := range d.overlapping(a, b) {
		o := float64(min(b, w.End) - max(a, w.Start))
		sum += (1 - w.IdleFraction) * o
		n += o
	}
	if n == 0 {
		return -1
	}
	return sum / n
}

// smActivityMin is the least mean GPM SM activity [a,b) can have had, -1
// when unknown: each window's SM-busy time is placed outside [a,b) as far
// as the rest of the window can hold it. A GPM window (~100 ms) is longer
// than most waits, so its mean mixes the wait with the compute around it:
// a 30 ms late-peer wait in a window with 65 ms of kernels reads 0.66 on
// average although the GPU computed nothing during the wait.
func (d *device) smActivityMin(a, b int64) float64 {
	var sum, n float64
	i := sort.Search(len(d.gpm), func(i int) bool { return d.gpm[i].End > a })
	for ; i < len(d.gpm) && d.gpm[i].Start < b; i++ {
		w := d.gpm[i]
		wl := float64(w.End - w.Start)
		o := float64(min(b, w.End) - max(a, w.Start))
		if wl <= 0 || o <= 0 {
			continue
		}
		sum += max(w.SMActivity*wl-(wl-o), 0)
		n += o
	}
	if n == 0 {
		return -1
	}
	return sum / n
}

// gpmMargin: how far around a span GPM windows must read zero too; a
// window's placement in time is only known to a few milliseconds (its
// calibrated refresh phase).
const gpmMargin = int64(3 * time.Millisecond)

// noCompute says whether GPM read zero SM activity on the whole device
// throughout [a,b] (and gpmMargin around it): no kernel of any process
// ran. known is false until GPM windows reach past b, or, for a device
// that sent no GPM window yet, until its other windows do (it has none);
// a hole in the GPM windows is known and not none.
func (d *device) noCompute(a, b int64) (none, known bool) {
	b += gpmMargin
	if d.gpmEnd == 0 {
		return false, d.maxEnd >= b
	}
	if d.gpmEnd < b {
		return false, false
	}
	// The margin reaches no further back than GPM's first window: a span
	// at the very start of sampling is judged by what GPM saw of it.
	a = max(a-gpmMargin, min(a, d.gpm[0].Start))
	// A window taken before the sampler aligned to the counter refresh
	// holds counters up to Skew older than it says: any window that may
	// hold [a,b] must read zero, and the zeros prove [a,b] idle only up
	// to the last one's End-Skew.
	i := sort.Search(len(d.gpm), func(i int) bool { return d.gpm[i].End > a })
	cov, skew := a, int64(0)
	for ; i < len(d.gpm) && d.gpm[i].Start-d.gpm[i].Skew < b; i++ {
		w := &d.gpm[i]
		if w.Start > cov || w.SMActivity > 0 {
			return false, true
		}
		if w.End >= cov {
			cov, skew = w.End, w.Skew
		}
	}
	return cov-skew >= b, true
}

// smActivity is the mean GPM SM activity over [a,b), -1 when unknown.
func (d *device) smActivity(a, b int64) float64 {
	var sum, n float64
	i := sort.Search(len(d.gpm), func(i int) bool { return d.gpm[i].End > a })
	for ; i < len(d.gpm) && d.gpm[i].Start < b; i++ {
		w := d.gpm[i]
		o := float64(min(b, w.End) - max(a, w.Start))
		sum += w.SMActivity * o
		n += o
	}
	if n == 0 {
		return -1
	}
	return sum / n
}

// densityGain: the micro-idle density is an EWMA of weight 1/densityGain
// per step, so one odd step moves it only a little.
const densityGain = 5

// smPeakDecay: per GPM window, how much of the SM-activity peak is kept.
const smPeakDecay = 0.99

func (d *device) noteDensity(x float64) {
	if d.bg < 0 {
		d.bg = x
		return
	}
	d.bg += (x - d.bg) / densityGain
}

// trim forgets windows and spans that ended before keep.
func (d *device) trim(keep int64) {
	d.wins = trimWins(d.wins, keep)
	d.gpm = trimWins(d.gpm, keep)
	d.gaps = interval.Trim(d.gaps, keep)
	d.stalls = interval.Trim(d.stalls, keep)
	d.busy = interval.Trim(d.busy, keep)
}

func trimWins(l []event.GPUWindow, keep int64) []event.GPUWindow {
	k := 0
	for k < len(l) && l[k].End < keep {
		k++
	}
	if k == 0 {
		return l
	}
	n := copy(l, l[k:])
	for i := n; i < len(l); i++ {
		l[i] = event.GPUWindow{}
	}
	return l[:n]
}
