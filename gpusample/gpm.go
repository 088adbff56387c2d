package gpusample

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/wake"
)

// GPM metrics read for every window, in this order.
var gpmMetricIDs = []nvml.GpmMetricId{
	nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_SM_OCCUPANCY, nvml.GPM_METRIC_ANY_TENSOR_UTIL,
	nvml.GPM_METRIC_DRAM_BW_UTIL, nvml.GPM_METRIC_PCIE_TX_PER_SEC, nvml.GPM_METRIC_PCIE_RX_PER_SEC,
	nvml.GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, nvml.GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
}

// calMetricIDs are what calibration reads to see whether a pair of samples
// spans a refresh: any counter that moves shows it, and a read computes
// every metric asked for (the simulated library scans its timeline per
// metric), so calibration, which reads every calStep, asks for three: SM
// activity (kernels, collectives), PCIe (copies; on the H200 it moves even
// at idle) and NVLink (collectives).
var calMetricIDs = []nvml.GpmMetricId{
	nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_PCIE_RX_PER_SEC, nvml.GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
}

// gpmMu serializes GPM calls across devices. Measured on two H200s (driver
// 580.159.04): nvmlGpmMetricsGet called from two goroutines at once, one
// per device, crashed the process with SIGSEGV inside libnvidia-ml within
// seconds; one call at a time never did. Each call takes 0.1–0.5 ms, so
// serializing costs nothing at 10 samples/s per device.
var gpmMu sync.Mutex

const (
	// calStep is the sampling period while measuring the refresh: fine
	// enough to place a refresh within ±1 ms, coarse enough that one
	// GpmSampleGet (90–190 µs on the H200) stays under 10% of a core.
	calStep = 2 * time.Millisecond
	// gpmMargin is how long after an estimated refresh the sampler reads:
	// it covers the ±calStep/2 uncertainty plus timer jitter.
	gpmMargin = 10 * time.Millisecond
	// recalUnaligned: how often alignment is retried while the GPU was busy
	// but no refresh was seen yet.
	recalUnaligned = 5 * time.Second
)

// recalAfter is how long after the n-th calibration (from 1) the phase is
// measured again. Each calibration lengthens the span the period is
// measured over, so the intervals can grow: the first period estimate
// (a few %) drifts less than half a period within 1 s, the second within
// 5 s, and from then on 30 s keeps the prediction within a few ms.
func recalAfter(n int) time.Duration {
	switch n {
	case 0, 1:
		return time.Second
	case 2:
		return 5 * time.Second
	}
	return 30 * time.Second
}

type gpmSampler struct {
	s *Source
	d *device

	prev, cur  nvml.GpmSample // steady-state pair
	calA, calB nvml.GpmSample // calibration pair, so prev stays valid across a calibration
	// req is the metrics request, reused under gpmMu: a new one (its
	// array of every metric, ~2 KiB) on each call was the sidecar's
	// largest allocation on a job of 8 devices.
	req nvml.GpmMetricsGetType

	prevT        int64 // Unix ns of the prev sample (midpoint of the call); 0: none
	lastEnd      int64 // end of the last window emitted
	period       time.Duration
	phase        int64 // Unix ns of one observed refresh; valid when aligned
	anchor       int64 // Unix ns of the first refresh observed; 0 none
	calibrations int
	aligned      bool
	busyCal      bool // a calibration ran while the GPU was busy
	lastCal      time.Time
	lastBusy     bool // the last window showed SM activity
}

// get snapshots the counters into smp and returns the host time of the
// snapshot (midpoint of the call, Unix ns).
func (g *gpmSampler) get(smp nvml.GpmSample) (int64, bool) {
	lo, hi, ok := g.read(smp)
	return lo + (hi-lo)/2, ok
}

// read takes a sample; the counters it holds were read at some instant
// within [lo, hi] (Unix ns), the call's start and return.
func (g *gpmSampler) read(smp nvml.GpmSample) (lo, hi int64, ok bool) {
	gpmMu.Lock()
	t0 := time.Now()
	ret := smp.Get(g.d.h)
	t1 := time.Now()
	gpmMu.Unlock()
	cost := t1.Sub(t0).Nanoseconds()
	g.s.st.gpmSamples.Add(1)
	g.s.st.gpmCostNS.Add(cost)
	storeMax(&g.s.st.gpmMaxNS, cost)
	if ret != nvml.SUCCESS {
		g.s.countErr(g.d, "nvmlGpmSampleGet", ret)
		return 0, 0, false
	}
	return t0.UnixNano(), t1.UnixNano(), true
}

// metrics computes ids between two samples; an unknown metric is -1. ok
// is false when the call itself failed.
func (g *gpmSampler) metrics(a, b nvml.GpmSample, ids []nvml.GpmMetricId) (vals []float64, ok bool) {
	vals = make([]float64, len(ids))
	gpmMu.Lock()
	var ret nvml.Return
	done := false
	if d := g.s.gpmDirect; d != nil {
		ret, done = d.metrics(a, b, ids, vals)
	}
	if !done {
		ret = g.metricsVia(a, b, ids, vals)
	}
	gpmMu.Unlock()
	if ret != nvml.SUCCESS {
		g.s.countErr(g.d, "nvmlGpmMetricsGet", ret)
		return nil, false
	}
	return vals, true
}

// metricsVia is metrics through nvml.Interface (a test's fake NVML, or a
// library whose symbol the direct call did not find), under gpmMu.
func (g *gpmSampler) metricsVia(a, b nvml.GpmSample, ids []nvml.GpmMetricId, vals []float64) nvml.Return {
	m := &g.req
	*m = nvml.GpmMetricsGetType{NumMetrics: uint32(len(ids)), Sample1: a, Sample2: b}
	for i, id := range ids {
		m.Metrics[i].MetricId = uint32(id)
	}
	ret := g.s.lib.GpmMetricsGet(m)
	if ret == nvml.SUCCESS {
		for i := range ids {
			vals[i] = gpmValue(nvml.Return(m.Metrics[i].NvmlReturn), m.Metrics[i].Value)
		}
	}
	return ret
}

// gpmValue is one metric's value as metrics reports it: -1 where NVML
// could not compute it. Measured on the H200: between two reads of one
// refresh, DRAM bandwidth comes back NaN with SUCCESS (a zero-time
// division).
func gpmValue(ret nvml.Return, v float64) float64 {
	if ret != nvml.SUCCESS || math.IsNaN(v) || math.IsInf(v, 0) {
		return -1
	}
	return v
}

// changed reports whether a pair of samples spans a counter refresh: with
// no refresh between them every counter delta, hence every metric, is 0.
// An idle GPU looks the same, which is why alignment needs a busy GPU and is
// retried while unaligned.
func changed(vals []float64) bool {
	return slices.ContainsFunc(vals, func(v float64) bool { return v > 0 })
}

// calPair is a pair of calibration reads with a refresh between them: the
// metrics of the refresh interval that ended there (each read holds the
// counters of the last refresh before it, and the reads are calStep apart,
// far less than a period), to become a window once the phase is known.
type calPair struct {
	lo, hi int64 // the first read's start, the second's return
	vals   []float64
}

// calibrate samples every calStep until it has seen a few refreshes (or the
// budget is spent) and sets the phase and period from them. The first time
// (no window emitted yet) it returns a window for each refresh interval it
// saw end, so that the GPU is covered from the sampler's start rather than
// from the end of calibration: a sidecar attached to a running job would
// otherwise be blind to SM activity, and so to its comm stalls, for the
// calibration's ~400 ms. It then leaves the last calibration read as the
// steady state's previous sample, so the steady windows chain on.
func (g *gpmSampler) calibrate(ctx context.Context) []gpmWindow {
	first := g.prevT == 0 && g.lastEnd == 0
	g.lastCal = time.Now()
	// The first calibration needs a few refreshes to measure the period;
	// later ones measure it against the first refresh ever seen, so two
	// refreshes suffice and the steady sampling pauses for ~2 periods only.
	want, budget := 4, max(4*g.period, 400*time.Millisecond)
	if g.anchor != 0 {
		want, budget = 2, 3*g.period
	}
	deadline := time.Now().Add(budget)
	aLo, aHi, ok := g.read(g.calA)
	if !ok {
		return nil
	}
	var changes []int64 // midpoints of the pairs that spanned a refresh
	var pairs []calPair // with first: every metric of each such pair
	// The pairs themselves: the refresh came after the first read's
	// counters were taken (at or after its call began) and before the
	// second's (at or before its call returned), whatever the scheduler did
	// around the calls, so it lies inside.
	var spans [][2]int64
	tick := time.NewTicker(calStep)
	defer tick.Stop()
	for len(changes) < want && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		bLo, bHi, ok := g.read(g.calB)
		if !ok {
			return nil
		}
		if vals, ok := g.metrics(g.calA, g.calB, calMetricIDs); ok && changed(vals) {
			changes = append(changes, (aLo+aHi+bLo+bHi)/4)
			spans = append(spans, [2]int64{aLo, bHi})
			if first {
				if all, ok := g.metrics(g.calA, g.calB, gpmMetricIDs); ok {
					pairs = append(pairs, calPair{lo: aLo, hi: bHi, vals: all})
				}
			}
		}
		g.calA, g.calB = g.calB, g.calA
		aLo, aHi = bLo, bHi
	}
	if len(changes) == 0 {
		g.s.log.Debug("gpm refresh not observed (idle GPU?); sampling unaligned", "device", g.d.info.Index)
		return nil
	}
	// The period: spacings are whole multiples of it (a refresh of an idle
	// GPU shows no change), so count periods against a first guess and
	// divide the whole span by the count. Against the first refresh ever
	// seen the span grows with every calibration, so the estimate converges
	// and the predicted refreshes stop drifting from the real ones.
	// Each estimate uses the narrowest spans: a read delayed by the
	// scheduler widens its span and blurs where the refresh was.
	mid := func(sp [2]int64) int64 { return (sp[0] + sp[1]) / 2 }
	narrowest := func(sps [][2]int64) [2]int64 {
		return slices.MinFunc(sps, func(a, b [2]int64) int {
			return int((a[1] - a[0]) - (b[1] - b[0]))
		})
	}
	p := g.period
	if len(changes) >= 2 {
		var diffs []time.Duration
		for i := 1; i < len(changes); i++ {
			diffs = append(diffs, time.Duration(changes[i]-changes[i-1]))
		}
		// The first time, the smallest spacing is the guess (any spacing is
		// one or more periods, plus noise); later, the period measured so far.
		guess := g.period
		if g.anchor == 0 {
			guess = slices.Min(diffs)
		}
		h := len(spans) / 2
		a, b := mid(narrowest(spans[:h])), mid(narrowest(spans[h:]))
		if n := math.Round(float64(b-a) / float64(guess)); n >= 1 {
			p = time.Duration(float64(b-a) / n)
		}
	}
	cfg := g.s.cfg.GPMInterval
	if g.anchor == 0 && math.Abs(float64(p-cfg)) <= 0.03*float64(cfg) {
		// A few refreshes measured by a sampler the scheduler delays give
		// the period within a few %; the configured period (the hardware's
		// own, 100 ms on Hopper) is better unless clearly contradicted. The
		// span to the first refresh then refines it.
		p = cfg
	}
	best := mid(narrowest(spans))
	if g.anchor != 0 {
		if n := math.Round(float64(best-g.anchor) / float64(g.period)); n >= 1 {
			p = time.Duration(float64(best-g.anchor) / n)
		}
	} else {
		g.anchor = best
	}
	if p >= cfg/2 && p <= 2*cfg {
		g.period = p
	} else {
		g.s.log.Warn("gpm refresh period out of range; keeping the configured one",
			"device", g.d.info.Index, "measured", p, "configured", cfg)
		g.anchor = 0
	}
	g.calibrations++
	wasAligned := g.aligned
	g.phase = refreshPhase(spans, g.period)
	g.aligned = true
	g.d.mu.Lock()
	g.d.gpmPeriod, g.d.gpmAligned = g.period, true
	g.d.mu.Unlock()
	if !wasAligned {
		g.s.log.Info("gpm sampling aligned to the counter refresh", "device", g.d.info.Index,
			"period", g.period, "refreshes_seen", len(changes))
	}
	if !first {
		return nil
	}
	return g.steadyFrom(aLo, aHi, pairs)
}

// steadyFrom makes the first calibration's last read, taken at lo..hi and
// held in calA, the steady state's previous sample (its counters are those
// of the refresh before it), and returns the windows of pairs that chain
// up to that refresh.
func (g *gpmSampler) steadyFrom(lo, hi int64, pairs []calPair) []gpmWindow {
	g.prev, g.calA = g.calA, g.prev
	g.prevT = lo + (hi-lo)/2
	g.lastEnd = g.boundary(g.prevT)
	return calWindows(pairs, g.boundary, int64(g.period), g.lastEnd)
}

// calWindows turns calibration pairs into windows on the refresh grid
// (boundary), each one period long and ending at the refresh its pair
// spans: the run of them that chains, window to window, up to last, where
// the steady windows go on. A refresh interval calibration saw no counter
// move in (an idle GPU) breaks the chain: the windows before it are left
// out, so that the windows stay contiguous. So is a pair whose reads do
// not hold its grid refresh (the phase estimate disagrees with it).
func calWindows(pairs []calPair, boundary func(int64) int64, period, last int64) []gpmWindow {
	want := last // the end the next window back must have
	first := len(pairs)
	for i := len(pairs) - 1; i >= 0; i-- {
		c := pairs[i]
		end := boundary(c.hi)
		if end < c.lo || end != want {
			break
		}
		first, want = i, end-period
	}
	out := make([]gpmWindow, 0, len(pairs)-first)
	for _, c := range pairs[first:] {
		end, v := boundary(c.hi), c.vals
		out = append(out, gpmWindow{start: end - period, end: end,
			sm: pct(v[0]), occupancy: pct(v[1]), tensor: pct(v[2]), dram: pct(v[3]),
			pcieTx: mibps(v[4]), pcieRx: mibps(v[5]), nvlTx: mibps(v[6]), nvlRx: mibps(v[7])})
	}
	return out
}

// refreshPhase places the last refresh of spans as tightly as the spans
// allow: each span (a pair of reads with a refresh between them), shifted by
// whole periods, bounds the same instant; their intersection, from the
// narrowest span on, is narrower than any single span. A span that does not
// overlap what the narrower ones bound (the period is a little off over a
// long calibration) is left out.
func refreshPhase(spans [][2]int64, period time.Duration) int64 {
	p := float64(period)
	mid := func(sp [2]int64) int64 { return sp[0] + (sp[1]-sp[0])/2 }
	order := slices.Clone(spans)
	slices.SortStableFunc(order, func(a, b [2]int64) int { return cmp.Compare(a[1]-a[0], b[1]-b[0]) })
	lo, hi := order[0][0], order[0][1]
	for _, sp := range order[1:] {
		k := int64(math.Round(float64(mid(order[0])-mid(sp))/p)) * int64(period)
		if nlo, nhi := max(lo, sp[0]+k), min(hi, sp[1]+k); nlo <= nhi {
			lo, hi = nlo, nhi
		}
	}
	at := lo + (hi-lo)/2
	last := spans[len(spans)-1]
	return at + int64(math.Round(float64(mid(last)-at)/p))*int64(period)
}

// boundary is the latest estimated refresh at or before t.
func (g *gpmSampler) boundary(t int64) int64 {
	p := int64(g.period)
	k := (t - g.phase) / p
	if t < g.phase && (t-g.phase)%p != 0 {
		k--
	}
	return g.phase + k*p
}

// nextSample is when to read next: just after the next refresh when
// aligned, one period after the last read otherwise.
func (g *gpmSampler) nextSample(now int64) int64 {
	if !g.aligned {
		if g.prevT == 0 {
			return now
		}
		return max(now, g.prevT+int64(g.period))
	}
	return g.boundary(now-int64(gpmMargin)) + int64(g.period) + int64(gpmMargin)
}

// wait is how long from now until the next read. Aligned, on a period
// of at least twice a grid step plus gpmMargin, the read moves to the
// sidecar's wake-up grid (internal/wake): up to a grid step after the
// refresh plus gpmMargin is then at most half a period, well before the
// next refresh, and the devices' reads share one wake-up of the process
// instead of one each.
func (g *gpmSampler) wait(now int64) time.Duration {
	due := g.nextSample(now)
	if g.aligned && g.period >= 2*wake.Grid+2*gpmMargin {
		return wake.Until(time.Unix(0, now), time.Unix(0, due))
	}
	return time.Duration(due - now)
}

func (s *Source) gpmLoop(ctx context.Context, d *device, emit func(event.GPUWindow) bool) {
	g := &gpmSampler{s: s, d: d, period: s.cfg.GPMInterval}
	var all []nvml.GpmSample
	for _, p := range []*nvml.GpmSample{&g.prev, &g.cur, &g.calA, &g.calB} {
		smp, ret := s.lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			s.countErr(d, "nvmlGpmSampleAlloc", ret)
			s.freeSamples(d, all)
			return
		}
		*p = smp
		all = append(all, smp)
	}
	defer s.freeSamples(d, all)
	d.mu.Lock()
	d.gpmPeriod = g.period
	d.mu.Unlock()

	if !g.calibrateAndPublish(ctx, emit) {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := time.Now().UnixNano()
		// Unaligned, the first window that shows the GPU busy (the job
		// started computing after the sidecar did) calibrates at once:
		// until then every window may be up to a period off.
		due := (g.aligned && time.Since(g.lastCal) > recalAfter(g.calibrations)) ||
			(!g.aligned && g.lastBusy && (!g.busyCal || time.Since(g.lastCal) > recalUnaligned))
		if due && !g.aligned {
			g.busyCal = true
		}
		if due {
			if !g.calibrateAndPublish(ctx, emit) {
				return
			}
			now = time.Now().UnixNano()
		}
		timer.Reset(g.wait(now))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		t, ok := g.get(g.cur)
		if !ok {
			continue
		}
		if g.prevT == 0 {
			g.prev, g.cur, g.prevT = g.cur, g.prev, t
			if g.aligned {
				g.lastEnd = g.boundary(t)
			} else {
				g.lastEnd = t
			}
			continue
		}
		// Windows chain end to start; the counters in a sample are those of
		// the refresh before it.
		start, end := g.lastEnd, t
		if g.aligned {
			end = g.boundary(t)
		}
		if end <= start {
			continue // no refresh since prev: keep prev, read again later
		}
		vals, ok := g.metrics(g.prev, g.cur, gpmMetricIDs)
		if ok && g.aligned && g.lastBusy && !changed(vals) {
			// The counters did not move although the GPU was just busy: the
			// read most likely came before the refresh (the phase drifted).
			// Keep prev so the next read spans the refresh, and re-measure
			// the phase soon. If the GPU really went idle, the next pair
			// shows no change either and is reported (lastBusy is now false).
			g.lastBusy = false
			g.s.st.gpmMisses.Add(1)
			if time.Since(g.lastCal) > recalUnaligned {
				g.calibrations = min(g.calibrations, 1) // re-measure within a second
			}
			continue
		}
		g.prev, g.cur, g.prevT = g.cur, g.prev, t
		if !ok {
			g.lastEnd = end
			continue
		}
		w := gpmWindow{start: start, end: end,
			sm: pct(vals[0]), occupancy: pct(vals[1]), tensor: pct(vals[2]), dram: pct(vals[3]),
			pcieTx: mibps(vals[4]), pcieRx: mibps(vals[5]), nvlTx: mibps(vals[6]), nvlRx: mibps(vals[7])}
		if !g.publish(w, emit) {
			return
		}
	}
}

// publish keeps w for the device's hardware context and sends it as a
// GPU window where its SM activity is known; false when emit says stop.
func (g *gpmSampler) publish(w gpmWindow, emit func(event.GPUWindow) bool) bool {
	d := g.d
	d.addGPMWindow(w)
	g.lastEnd = max(g.lastEnd, w.end)
	g.lastBusy = w.sm > 0.01
	if w.sm < 0 {
		return true // SM activity unknown: no idle fraction to report
	}
	// Unaligned, a sample holds the counters of the last refresh before
	// it, up to a period earlier than the read.
	var skew int64
	if !g.aligned {
		skew = int64(g.period)
	}
	return emit(event.GPUWindow{Device: d.info.Index, UUID: d.info.UUID, Start: w.start, End: w.end,
		IdleFraction: 1 - w.sm, Source: event.SourceGPM, SMActivity: w.sm, TensorActivity: w.tensor, Skew: skew})
}

// calibrateAndPublish calibrates and sends the windows of the refresh
// intervals the first calibration saw; false when emit says stop.
func (g *gpmSampler) calibrateAndPublish(ctx context.Context, emit func(event.GPUWindow) bool) bool {
	for _, w := range g.calibrate(ctx) {
		if !g.publish(w, emit) {
			return false
		}
	}
	return true
}

// pct converts a GPM percentage to 0..1, keeping -1 (unknown).
func pct(v float64) float64 {
	if v < 0 {
		return -1
	}
	return min(v/100, 1)
}

// mibps converts GPM MiB/s to bytes/s, keeping -1 (unknown).
func mibps(v float64) float64 {
	if v < 0 {
		return -1
	}
	return v * (1 << 20)
}

// freeSamples releases GPM samples; a failure is counted like any NVML
// error (the sampler goes on either way).
func (s *Source) freeSamples(d *device, all []nvml.GpmSample) {
	for _, a := range all {
		if ret := a.Free(); ret != nvml.SUCCESS {
			s.countErr(d, "nvmlGpmSampleFree", ret)
		}
	}
}
