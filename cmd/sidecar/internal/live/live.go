// Package live turns the correlation results of a tracing session into
// what a person watches: a view redrawn about once a second on a terminal,
// a compact log line every few seconds otherwise, and the summary printed
// at exit.
//
// An Aggregator is a correlate.Sink (tee it next to the exporter) that also
// takes periodic engine snapshots and pipeline statistics. It is safe for
// concurrent use: results arrive on the pipeline's goroutine, views are
// taken on the renderer's. Rendering is a pure function of a View so it can
// be tested without a terminal.
package live

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/whatif"
)

// Stats is what the pipeline reports about itself.
type Stats struct {
	Targets    []int    // traced PIDs (roots; descendants are implied)
	Attached   int      // probes attached
	Missing    []string // probes that could not be attached
	EventsRead uint64
	Drops      uint64 // events lost anywhere between the kernel and correlate
	GPUs       int    // devices NVML reports; 0 without NVML
	// Peers says how the exchange with the job's other sidecars stands
	// (--peers; "" when off), e.g. "serving 10.0.0.5:29601, 3 other
	// sidecars".
	Peers string
	// Export counts the spans' primary output (OTLP when configured, else
	// the spans file).
	Export ExportStats
	// The sidecar's own cost so far: CPU time (user + system) and peak
	// resident memory, read when the stats were taken (0: unknown).
	CPUNS    int64
	RSSBytes int64
	// EventsByKind: EventsRead by record kind (tracer.RecordKind's names).
	EventsByKind map[string]uint64
}

type fileAgg struct {
	ops   map[string]int64 // blocked ns per operation
	ns    int64
	bytes uint64
	calls int
}

type peerAgg struct {
	label string
	ns    int64
	bytes uint64
	calls int
}

// Aggregator accumulates results for the live view and the summary.
type Aggregator struct {
	mu      sync.Mutex
	start   time.Time
	now     func() time.Time
	stopped time.Time // when tracing stopped; zero while it runs

	snap     correlate.Summary
	haveSnap bool
	hangs    map[string]Hang // SetHang
	stats    Stats
	// costFrom and costAt: the first stats that carried the sidecar's
	// CPU time and when they came; its cost is rated from there, past
	// the start-up's loading of the probes.
	costFrom Stats
	costAt   time.Time

	steps     int64
	windows   int64       // fixed windows (no step period known), not steps
	stepEnds  []time.Time // wall time each step was received, for the rate
	stepWall  int64
	stepIdle  int64
	stepCause map[correlate.Cause]int64

	gaps     int64
	gapCause map[correlate.Cause]int64
	// files and peers hold at most maxTracked names each; beyond, the
	// name with the least blocked time is folded into the others total,
	// so a job that touches millions of files costs a bounded table
	// while the files that matter (the most blocked time) stay named.
	files      map[string]*fileAgg
	peers      map[string]*peerAgg
	otherFiles otherAgg
	otherPeers otherAgg
	lastGap    *correlate.Gap
	// sites: idle time by call site (sites.go), bounded like files.
	sites      map[string]*siteAgg
	otherSites otherAgg
	// code: CPU samples in gaps by site (code.go), bounded like sites.
	code      map[string]*correlate.CodeSummary
	otherCode otherAgg
	whatIf    func() []whatif.Estimate
}

// maxTracked bounds the files and the peers the view keeps by name.
const maxTracked = 256

// otherAgg is what was folded out of a bounded table.
type otherAgg struct {
	names int
	ns    int64
	bytes uint64
	calls int
}

// evictSmallest folds the entry with the least time out of m.
func evictSmallest[V any](m map[string]V, ns func(V) (int64, uint64, int), into *otherAgg) {
	var minK string
	var minNS int64
	first := true
	for k, v := range m {
		n, _, _ := ns(v)
		if first || n < minNS || n == minNS && k < minK {
			minK, minNS, first = k, n, false
		}
	}
	if first {
		return
	}
	n, b, c := ns(m[minK])
	into.names++
	into.ns += n
	into.bytes += b
	into.calls += c
	delete(m, minK)
}

// NewAggregator starts an aggregator whose clock is now (time.Now when nil).
func NewAggregator(now func() time.Time) *Aggregator {
	if now == nil {
		now = time.Now
	}
	return &Aggregator{start: now(), now: now, stepCause: map[correlate.Cause]int64{},
		gapCause: map[correlate.Cause]int64{}, files: map[string]*fileAgg{}, peers: map[string]*peerAgg{}}
}

// Stop freezes the clock: tracing has ended, and the summary's elapsed
// time and step rate cover the traced period only, not the shutdown.
func (a *Aggregator) Stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped.IsZero() {
		a.stopped = a.now()
	}
}

// Gap implements correlate.Sink.
func (a *Aggregator) Gap(g correlate.Gap) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gaps++
	if len(g.Breakdown) > 0 {
		for c, ns := range g.Breakdown {
			a.gapCause[c] += ns
		}
	} else {
		a.gapCause[g.Cause] += g.Duration
	}
	for _, f := range g.Evidence.Files {
		fa := a.files[f.Path]
		if fa == nil {
			if len(a.files) >= maxTracked {
				evictSmallest(a.files, func(f *fileAgg) (int64, uint64, int) { return f.ns, f.bytes, f.calls }, &a.otherFiles)
			}
			fa = &fileAgg{ops: map[string]int64{}}
			a.files[f.Path] = fa
		}
		fa.ops[f.Op] += f.NS
		fa.ns += f.NS
		fa.bytes += f.Bytes
		fa.calls += f.Calls
	}
	for _, p := range g.Evidence.Peers {
		pa := a.peers[p.Address]
		if pa == nil {
			if len(a.peers) >= maxTracked {
				evictSmallest(a.peers, func(p *peerAgg) (int64, uint64, int) { return p.ns, p.bytes, p.calls }, &a.otherPeers)
			}
			pa = &peerAgg{}
			a.peers[p.Address] = pa
		}
		if p.PID != 0 {
			pa.label = fmt.Sprintf("pid %d %s", p.PID, p.Comm)
		}
		pa.ns += p.NS
		pa.bytes += p.Bytes
		pa.calls += p.Calls
	}
	a.addSite(&g)
	a.addCode(&g)
	gc := g
	a.lastGap = &gc
}

// Step implements correlate.Sink.
func (a *Aggregator) Step(s correlate.StepResult) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.Window {
		// A fixed window stands in for steps where no period is known:
		// its idle counts, but it is no iteration.
		a.windows++
	} else {
		a.steps++
		a.stepEnds = append(a.stepEnds, a.now())
		if len(a.stepEnds) > 4096 {
			a.stepEnds = slices.Clone(a.stepEnds[len(a.stepEnds)-1024:])
		}
	}
	a.stepWall += s.End - s.Start
	a.stepIdle += s.IdleNS + s.StallNS
	for c, ns := range s.ByCause {
		a.stepCause[c] += ns
	}
}

// SetSummary records the engine's latest running totals; they win over
// what the aggregator adds up itself because they include results not yet
// emitted as steps.
func (a *Aggregator) SetSummary(s correlate.Summary) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.snap, a.haveSnap = s, true
}

// SetWhatIf names where views take their what-if estimates from.
func (a *Aggregator) SetWhatIf(f func() []whatif.Estimate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.whatIf = f
}

// SetStats records the pipeline's statistics.
func (a *Aggregator) SetStats(s Stats) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats = s
	if a.costAt.IsZero() && s.CPUNS > 0 {
		a.costFrom, a.costAt = s, a.now()
	}
}
