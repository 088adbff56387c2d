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
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
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
	whatIf     func() []whatif.Estimate
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

// CauseTime is one cause's share of the lost GPU time.
type CauseTime struct {
	Cause correlate.Cause
	NS    int64
	Share float64 // of all lost (idle + stall) time, 0..1
}

// opsNoteWidth is the width of the operations column of the top files.
const opsNoteWidth = 11

// opsNote names a file's operations, the most blocking first, as many as
// fit the column: "write+fsync", not every call made on it.
func opsNote(ops map[string]int64) string {
	names := slices.Collect(maps.Keys(ops))
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(ops[b], ops[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	note := ""
	for i, n := range names {
		next := n
		if i > 0 {
			next = note + "+" + n
		}
		if i > 0 && len(next) > opsNoteWidth {
			break
		}
		note = next
	}
	return note
}

// TopItem is one file or peer in the evidence ranking.
type TopItem struct {
	Name  string
	Note  string // ops for files, owner for peers
	NS    int64
	Bytes uint64
	Calls int
}

// View is one frame: everything the live view or a log line shows.
type View struct {
	Title       string
	Elapsed     time.Duration
	Steps       int64
	StepsPerSec float64
	// Windows: fixed time windows that stood in for steps while no step
	// period was known; not counted in Steps.
	Windows  int64
	Gaps     int64
	WallNS   int64
	LostNS   int64 // idle + stall
	IdleNS   int64
	StallNS  int64
	IdlePct  float64 // lost / wall, 0..100; -1 when unknown
	ByCause  []CauseTime
	TopFiles []TopItem
	TopPeers []TopItem
	// OtherFiles and OtherPeers total what is not in the top rows
	// (Name says how many); nil when nothing is left out.
	OtherFiles *TopItem
	OtherPeers *TopItem
	// TopSites are the call sites with the most idle time (Note: gaps
	// and causes).
	TopSites []TopItem
	LastGap  *correlate.Gap
	Stats    Stats
	// Losses: what the engine got but could not use in full (late and
	// forced events, dropped intervals, incomplete steps, gaps after their
	// step), from its latest snapshot.
	Losses correlate.Losses
	// WhatIf is what removing each cause would save, largest first.
	WhatIf []whatif.Estimate
	// whatIfBlock: the summary's what-if block rather than the live line.
	whatIfBlock bool
	// Probes is "auto" when the per-launch probes come and go; FullShare
	// is then the share of the time they were attached (0..1).
	Probes    string
	FullShare float64
	// Hangs: every hang seen, ongoing or ended (SetHang).
	Hangs []Hang
	// CPUPct is the sidecar's CPU time as a share of one core (-1: not
	// known yet), and EventsPerSec the records it handled a second, both
	// since its first stats once those are 5 s old, else since the start.
	CPUPct       float64
	EventsPerSec float64
}

// View takes a consistent frame. title names what is traced.
func (a *Aggregator) View(title string) View {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if !a.stopped.IsZero() {
		now = a.stopped
	}
	v := View{Title: title, Elapsed: now.Sub(a.start), Steps: a.steps, Windows: a.windows, Gaps: a.gaps, Stats: a.stats, IdlePct: -1, CPUPct: -1}
	from, at := a.costFrom, a.costAt
	if at.IsZero() || now.Sub(at) < 5*time.Second {
		from, at = Stats{}, a.start // start-up included
	}
	if span := now.Sub(at).Seconds(); a.stats.CPUNS > 0 && span >= 1 {
		v.CPUPct = 100 * float64(a.stats.CPUNS-from.CPUNS) / 1e9 / span
		v.EventsPerSec = float64(a.stats.EventsRead-from.EventsRead) / span
	}
	v.Stats.Missing = slices.Clone(a.stats.Missing)
	v.Stats.Targets = slices.Clone(a.stats.Targets)

	// Step rate over the last ten seconds, which tracks changes (a
	// checkpoint) better than the mean since start.
	const rateWindow = 10 * time.Second
	var recent int
	for i := len(a.stepEnds) - 1; i >= 0 && now.Sub(a.stepEnds[i]) <= rateWindow; i-- {
		recent++
	}
	switch {
	case !a.stopped.IsZero() && v.Elapsed > 0:
		v.StepsPerSec = float64(a.steps) / v.Elapsed.Seconds()
	case recent > 0:
		span := min(rateWindow, v.Elapsed)
		if span > 0 {
			v.StepsPerSec = float64(recent) / span.Seconds()
		}
	}

	if a.haveSnap {
		v.Losses = a.snap.Losses
	}
	var byCause map[correlate.Cause]int64
	switch {
	case a.haveSnap && a.snap.WallNS > 0:
		v.WallNS, v.IdleNS, v.StallNS = a.snap.WallNS, a.snap.GPUIdleNS, a.snap.GPUStallNS
		if a.snap.Probes == correlate.ProbesAuto {
			v.Probes, v.FullShare = a.snap.Probes, float64(a.snap.ProbesFullNS)/float64(a.snap.WallNS)
		}
		byCause = a.snap.ByCause
		v.Steps = max(v.Steps, a.snap.Steps)
		v.Windows = max(v.Windows, a.snap.Windows)
		v.Gaps = max(v.Gaps, a.snap.Gaps)
		v.Stats.Drops = max(v.Stats.Drops, a.snap.DroppedEvents)
	case a.stepWall > 0:
		v.WallNS, v.IdleNS = a.stepWall, a.stepIdle
		byCause = a.stepCause
	default:
		byCause = a.gapCause
	}
	v.LostNS = v.IdleNS + v.StallNS
	// The engine's snapshot and step totals come every few steps, the gaps
	// as they are found: a frame between the two could show gaps and the
	// last of them beside "nothing attributed" and an idle GPU. Until the
	// totals catch up, the gaps already seen stand in for them.
	if gapNS := sumNS(a.gapCause); gapNS > v.LostNS && gapNS >= sumNS(byCause) {
		byCause, v.LostNS = a.gapCause, gapNS
		v.IdleNS = max(v.IdleNS, gapNS-v.StallNS)
		if v.WallNS == 0 {
			v.WallNS = int64(now.Sub(a.start))
		}
	}
	if v.WallNS > 0 {
		v.IdlePct = min(100, 100*float64(v.LostNS)/float64(v.WallNS))
	}
	v.ByCause = CauseShares(byCause)
	for path, f := range a.files {
		v.TopFiles = append(v.TopFiles, TopItem{Name: path, Note: opsNote(f.ops), NS: f.ns, Bytes: f.bytes, Calls: f.calls})
	}
	for addr, p := range a.peers {
		v.TopPeers = append(v.TopPeers, TopItem{Name: addr, Note: p.label, NS: p.ns, Bytes: p.bytes, Calls: p.calls})
	}
	v.TopFiles, v.OtherFiles = topAndRest(v.TopFiles, 5, a.otherFiles, "files")
	v.TopPeers, v.OtherPeers = topAndRest(v.TopPeers, 3, a.otherPeers, "peers")
	for _, cs := range a.topSites(3) {
		v.TopSites = append(v.TopSites, siteItem(cs))
	}
	if a.lastGap != nil {
		g := *a.lastGap
		v.LastGap = &g
	}
	if a.whatIf != nil {
		v.WhatIf = a.whatIf()
	}
	v.Hangs = a.hangList()
	return v
}

// topAndRest keeps the n items with the most time and sums the rest,
// with what was already folded out, into one "others" item.
func topAndRest(items []TopItem, n int, folded otherAgg, what string) ([]TopItem, *TopItem) {
	items = top(items, len(items))
	rest := TopItem{NS: folded.ns, Bytes: folded.bytes, Calls: folded.calls}
	count := folded.names
	if len(items) > n {
		for _, it := range items[n:] {
			rest.NS += it.NS
			rest.Bytes += it.Bytes
			rest.Calls += it.Calls
		}
		count += len(items) - n
		items = items[:n]
	}
	if count == 0 {
		return items, nil
	}
	rest.Name = fmt.Sprintf("(%d other %s)", count, what)
	if folded.names > 0 {
		// Folded names are not remembered, so how many were distinct is
		// not known: no count rather than a wrong one.
		rest.Name = fmt.Sprintf("(other %s)", what)
	}
	return items, &rest
}

func top(items []TopItem, n int) []TopItem {
	slices.SortFunc(items, func(x, y TopItem) int {
		return cmp.Or(cmp.Compare(y.NS, x.NS), cmp.Compare(x.Name, y.Name))
	})
	if len(items) > n {
		items = items[:n]
	}
	return items
}

// CauseShares orders causes by time (largest first, then the taxonomy
// order) and computes each one's share; causes with no time are left out.
func CauseShares(by map[correlate.Cause]int64) []CauseTime {
	var total int64
	for _, ns := range by {
		if ns > 0 {
			total += ns
		}
	}
	order := func(c correlate.Cause) int {
		if i := slices.Index(correlate.Causes, c); i >= 0 {
			return i
		}
		return len(correlate.Causes)
	}
	var out []CauseTime
	for c, ns := range by {
		if ns <= 0 {
			continue
		}
		out = append(out, CauseTime{Cause: c, NS: ns, Share: float64(ns) / float64(total)})
	}
	slices.SortFunc(out, func(x, y CauseTime) int {
		return cmp.Or(cmp.Compare(y.NS, x.NS), cmp.Compare(order(x.Cause), order(y.Cause)), cmp.Compare(x.Cause, y.Cause))
	})
	return out
}

// Bar draws a bar of width cells for a fraction 0..1, with eighth-block
// resolution so small shares still show.
func Bar(frac float64, width int) string {
	frac = max(0, min(1, frac))
	eighths := int(frac*float64(width*8) + 0.5)
	full, rem := eighths/8, eighths%8
	var b strings.Builder
	b.WriteString(strings.Repeat("█", full))
	cells := full
	if rem > 0 {
		b.WriteRune([]rune("▏▎▍▌▋▊▉")[rem-1])
		cells++
	}
	b.WriteString(strings.Repeat("·", width-cells))
	return b.String()
}

// FormatNS prints a duration in the unit a person reads fastest.
func FormatNS(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d >= 100*time.Second:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%d ns", ns)
}

// FormatBytes prints a byte count in binary units.
func FormatBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func formatElapsed(d time.Duration) string {
	s := int(d.Seconds())
	return fmt.Sprintf("%02d:%02d:%02d", s/3600, s/60%60, s%60)
}

func pct(p float64) string {
	if p < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", p)
}

// Frame renders the live view of v, width columns wide. The same text is
// used for the terminal and (as the body) for the final summary.
func Frame(v View, width int) string {
	width = max(60, min(width, 120))
	var b strings.Builder
	fmt.Fprintf(&b, "gaptrace · %s · %s\n", Escape(v.Title), formatElapsed(v.Elapsed))
	fmt.Fprintf(&b, "steps %d (%.1f/s)%s   GPU idle %s   gaps %d   dropped events %d\n",
		v.Steps, v.StepsPerSec, windowsNote(v.Windows), pct(v.IdlePct), v.Gaps, v.Stats.Drops)
	writeHangs(&b, v, width)
	writeLosses(&b, v.Losses, width)
	if v.Stats.Peers != "" {
		fmt.Fprintf(&b, "peers: %s\n", trimRight(Escape(v.Stats.Peers), width-7))
	}
	if l := exportLine(v.Stats.Export); l != "" {
		b.WriteString(l + "\n")
	}
	if v.Probes == correlate.ProbesAuto {
		// Gaps outside the windows are decided as lite decides them.
		fmt.Fprintf(&b, "probes auto: %.1f%% of the time at full (per-launch probes), the rest lite\n", 100*v.FullShare)
	}
	writeCauses(&b, v, width)
	writeWhatIf(&b, v)
	writeEvidence(&b, v, width)
	writeSites(&b, v, width)
	if v.CPUPct >= 0 {
		fmt.Fprintf(&b, "gaptrace itself: %.1f%% of a core · %s peak resident · %.0f events/s\n",
			v.CPUPct, FormatBytes(uint64(max(0, v.Stats.RSSBytes))), v.EventsPerSec)
	}
	if v.LastGap != nil {
		g := v.LastGap
		probes := ""
		if g.Probes != "" {
			probes = ", probes " + g.Probes
		}
		fmt.Fprintf(&b, "last gap: %s %s (pid %d tid %d, step %d%s)\n", FormatNS(g.Duration), g.Cause, g.PID, g.TID, g.Step, probes)
		if c := g.Evidence.Collective; c != nil && (c.LatePID != 0 || c.LateRank != nil) {
			who := fmt.Sprintf("pid %d (rank unknown)", c.LatePID)
			if c.LateRank != nil {
				who = fmt.Sprintf("rank %d (pid %d)", *c.LateRank, c.LatePID)
			}
			if c.LateSidecar != "" {
				// Traced by another sidecar of the job (--peers): its pid
				// is that sidecar's view.
				who = fmt.Sprintf("%s, sidecar %s", strings.TrimSuffix(who, ")"), c.LateSidecar) + ")"
			}
			fmt.Fprintf(&b, "  waited on %s, %s late\n", Escape(who), FormatNS(c.LateByNS))
		}
		if d := gapDetail(g); d != "" {
			b.WriteString("  " + trimRight(Escape(d), max(20, width-2)) + "\n")
		}
		if hs := g.Evidence.LockHolders; len(hs) > 0 {
			b.WriteString("  " + trimRight(Escape(holderLine(hs[0])), max(20, width-2)) + "\n")
		}
	}
	return b.String()
}

// holderLine says which thread a gap's feeder waited on and what that
// thread did meanwhile.
func holderLine(h correlate.LockHolderEvidence) string {
	who := fmt.Sprintf("tid %d", h.TID)
	if h.Comm != "" {
		who += " (" + h.Comm + ")"
	}
	d := fmt.Sprintf("waited %s on %s", FormatNS(h.NS), who)
	switch h.Doing {
	case "":
	case correlate.CauseCPU:
		d += ", which computed holding the lock"
	case correlate.CauseSleep:
		d += ", which slept holding the lock"
	default:
		d += ", which was in " + string(h.Doing)
	}
	switch {
	case h.File != "":
		d += " on " + h.File
	case h.Peer != "":
		d += " with " + h.Peer
	}
	return d
}

// gapDetail is the one line that says what a gap's copy or host operation
// was, when it has one.
func gapDetail(g *correlate.Gap) string {
	if c := g.Evidence.Copy; c != nil {
		d := fmt.Sprintf("%s %s %.1f MB at %.1f GB/s", c.Call, c.Direction, float64(c.Bytes)/1e6, c.GBps)
		if c.Pageable {
			d = "pageable " + d
		}
		if c.Fix != "" {
			d += ": " + c.Fix
		}
		return d
	}
	if e := g.Evidence.Episode; e != nil {
		return fmt.Sprintf("%s %s: %d copies %s, serialization %s, %d writes %s, fsync %s", e.Kind, e.File,
			e.Copies, FormatNS(e.CopyNS), FormatNS(e.SerializeNS), e.Writes, FormatNS(e.WriteNS), FormatNS(e.FsyncNS))
	}
	return ""
}

func writeCauses(b *strings.Builder, v View, width int) {
	if len(v.ByCause) == 0 {
		b.WriteString("\nidle by cause: nothing attributed yet\n")
		return
	}
	fmt.Fprintf(b, "\nidle by cause (%s lost of %s)\n", FormatNS(v.LostNS), FormatNS(v.WallNS))
	barW := width - 16 - 10 - 8 - 4
	for _, c := range v.ByCause {
		fmt.Fprintf(b, "  %-15s %s %9s %6.1f%%\n", c.Cause, Bar(c.Share, barW), FormatNS(c.NS), 100*c.Share)
	}
}

func trimLeft(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

func writeEvidence(b *strings.Builder, v View, width int) {
	nameW := width - 41
	if len(v.TopFiles) > 0 {
		fmt.Fprintf(b, "\ntop files%s %9s %10s\n", strings.Repeat(" ", max(0, nameW+15-9)), "blocked", "bytes")
		for _, f := range v.TopFiles {
			fmt.Fprintf(b, "  %-*s %-*s %9s %10s\n", nameW, trimLeft(Escape(f.Name), nameW), opsNoteWidth, Escape(f.Note), FormatNS(f.NS), FormatBytes(f.Bytes))
		}
		if o := v.OtherFiles; o != nil {
			fmt.Fprintf(b, "  %-*s %-*s %9s %10s\n", nameW, o.Name, opsNoteWidth, "", FormatNS(o.NS), FormatBytes(o.Bytes))
		}
	}
	if len(v.TopPeers) > 0 {
		fmt.Fprintf(b, "\ntop peers%s %9s %10s\n", strings.Repeat(" ", max(0, nameW+15-9)), "blocked", "bytes")
		for _, p := range v.TopPeers {
			fmt.Fprintf(b, "  %-*s %-11s %9s %10s\n", nameW, trimLeft(Escape(p.Name+" "+p.Note), nameW), "", FormatNS(p.NS), FormatBytes(p.Bytes))
		}
		if o := v.OtherPeers; o != nil {
			fmt.Fprintf(b, "  %-*s %-11s %9s %10s\n", nameW, o.Name, "", FormatNS(o.NS), FormatBytes(o.Bytes))
		}
	}
}

// lossNames are the engine's loss counters as the views name them, in
// the order they are shown: the live line's label, the log line's key.
var lossNames = []struct {
	label, key string
	n          func(*correlate.Losses) uint64
}{
	{"late events", "late", func(l *correlate.Losses) uint64 { return l.LateEvents }},
	{"forced events", "forced", func(l *correlate.Losses) uint64 { return l.ForcedEvents }},
	{"incomplete steps", "incomplete_steps", func(l *correlate.Losses) uint64 { return l.IncompleteSteps }},
	{"gaps after their step", "gaps_after_step", func(l *correlate.Losses) uint64 { return l.GapsAfterStep }},
	{"dropped intervals", "dropped_intervals", func(l *correlate.Losses) uint64 { return l.DroppedIntervals }},
}

// writeLosses names the engine's losses that are not zero under the line
// that says how many events were dropped, where one looks for what a
// sidecar that falls behind lost; nothing when none.
func writeLosses(b *strings.Builder, l correlate.Losses, width int) {
	line := ""
	for _, n := range lossNames {
		c := n.n(&l)
		if c == 0 {
			continue
		}
		item := fmt.Sprintf("%s %d", n.label, c)
		if line != "" && len(line)+3+len(item) > width {
			b.WriteString(line + "\n")
			line = ""
		}
		if line == "" {
			line = "  " + item
		} else {
			line += "   " + item
		}
	}
	if line != "" {
		b.WriteString(line + "\n")
	}
}

// windowsNote says how many fixed windows stood in for steps, if any.
func windowsNote(n int64) string {
	switch n {
	case 0:
		return ""
	case 1:
		return " + 1 window"
	}
	return fmt.Sprintf(" + %d windows", n)
}

// LogLine renders v as one line for logs (stdout not a terminal).
func LogLine(v View) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gaptrace elapsed=%s steps=%d rate=%.1f/s gpu_idle=%s gaps=%d drops=%d",
		v.Elapsed.Round(time.Second), v.Steps, v.StepsPerSec, pct(v.IdlePct), v.Gaps, v.Stats.Drops)
	if v.Windows > 0 {
		fmt.Fprintf(&b, " windows=%d", v.Windows)
	}
	if e := v.Stats.Export; e.Errors > 0 || e.Dropped > 0 {
		fmt.Fprintf(&b, " export_errors=%d export_dropped=%d export_failing=%t", e.Errors, e.Dropped, e.Failing)
	}
	b.WriteString(hangsLog(v))
	for _, n := range lossNames {
		if c := n.n(&v.Losses); c > 0 {
			fmt.Fprintf(&b, " %s=%d", n.key, c)
		}
	}
	if len(v.ByCause) > 0 {
		b.WriteString(" causes=")
		for i, c := range v.ByCause {
			if i == 4 {
				break
			}
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s:%.0f%%", c.Cause, 100*c.Share)
		}
	}
	if w := shownWhatIf(v.WhatIf, 1); len(w) > 0 {
		fmt.Fprintf(&b, " what_if=%s:-%s/step:-%.1f%%", w[0].Cause, strings.ReplaceAll(formatSaving(w[0].SavedNSPerStep), " ", ""), 100*w[0].SavedFraction)
	}
	if len(v.TopFiles) > 0 {
		fmt.Fprintf(&b, " top_file=%s", logValue(v.TopFiles[0].Name))
	}
	if len(v.TopPeers) > 0 {
		fmt.Fprintf(&b, " top_peer=%s", logValue(v.TopPeers[0].Name))
	}
	if len(v.TopSites) > 0 {
		fmt.Fprintf(&b, " top_site=%s", logValue(v.TopSites[0].Name))
	}
	return b.String()
}

// Outputs names the files a session wrote, for the summary.
type Outputs struct {
	Gaps, Spans, Summary, OTLP, Prometheus string
	Trace                                  string // --perfetto-out
	Windows                                string // --windows-out
	Record                                 string // --record
}

// Summary renders the final summary of a session.
func Summary(v View, out Outputs, width int) string {
	var b strings.Builder
	rule := strings.Repeat("─", max(60, min(width, 120)))
	b.WriteString(rule + "\n")
	b.WriteString("summary\n")
	v.whatIfBlock = true
	b.WriteString(Frame(v, width))
	if len(v.Stats.Missing) > 0 {
		fmt.Fprintf(&b, "\nprobes not attached (%d): %s\n", len(v.Stats.Missing), Escape(missingList(v.Stats.Missing, 6)))
	}
	if v.Steps == 0 && v.Windows == 0 && v.Gaps == 0 {
		b.WriteString("\nno GPU activity was attributed: the target made no CUDA calls gaptrace could see\n" +
			"(is libcuda.so loaded by it? run `gaptrace check --pid PID`)\n")
	}
	var files []string
	for _, f := range []struct{ what, path string }{
		{"gaps", out.Gaps}, {"spans", out.Spans}, {"summary", out.Summary}, {"OTLP", out.OTLP}, {"metrics", out.Prometheus},
		{"trace", out.Trace}, {"windows", out.Windows}, {"record", out.Record},
	} {
		if f.path != "" {
			files = append(files, fmt.Sprintf("  %-8s %s", f.what, Escape(f.path)))
		}
	}
	if len(files) > 0 {
		b.WriteString("\noutputs\n" + strings.Join(files, "\n") + "\n")
	}
	b.WriteString(rule + "\n")
	return b.String()
}

// missingList shortens the tracer's "library path: symbol NAME" warnings
// to distinct names, at most n of them.
func missingList(missing []string, n int) string {
	var names []string
	for _, m := range missing {
		if i := strings.LastIndex(m, "symbol "); i >= 0 {
			m = m[i+len("symbol "):]
		}
		if !slices.Contains(names, m) {
			names = append(names, m)
		}
	}
	if len(names) > n {
		return strings.Join(names[:n], ", ") + fmt.Sprintf(", … (%d more)", len(names)-n)
	}
	return strings.Join(names, ", ")
}

// Terminal keeps the frame in the bottom rows of the terminal and leaves
// the rows above to everyone else: it sets the terminal's scroll region
// (DECSTBM) to the rows above the frame, so the traced command, which writes
// to the same terminal directly, scrolls there and never across the frame.
// gaptrace interposes nothing between the command and the terminal: if
// gaptrace dies (kill -9), the command's output keeps flowing; only the last
// frame stays on screen until `reset` (or `tput csr`).
//
// Each update is one write, saving and restoring the cursor around it, so it
// cannot interleave with the command's writes (the tty serializes write
// calls) and leaves the command's cursor where it was. Safe for concurrent
// use.
type Terminal struct {
	W io.Writer
	// Rows reports the terminal's height; nil or 0 (unknown) draws nothing.
	Rows func() int

	mu       sync.Mutex
	reserved int // rows held for the frame at the bottom (0: none)
	height   int // terminal height the scroll region was set for
	stopped  bool
}

// minOutputRows are kept for the command's output however tall the frame.
const minOutputRows = 4

// SizeKnown says whether the terminal reports a height the frame can be
// drawn in. A pseudo-terminal nobody sized (script(1) run without a
// terminal, some CI runners and serial consoles) reports 0 rows: Draw
// would draw nothing there.
func (t *Terminal) SizeKnown() bool {
	return t.Rows != nil && t.Rows() >= minOutputRows+1
}

const (
	saveCursor    = "\x1b7"
	restoreCursor = "\x1b8"
)

// Draw replaces the previous frame with frame. The area grows with the
// frame and never shrinks while tracing, so the command's text above does
// not jump up and down; a frame taller than the terminal allows is cut.
func (t *Terminal) Draw(frame string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped || t.Rows == nil {
		return
	}
	h := t.Rows()
	if h < minOutputRows+1 {
		return
	}
	lines := strings.Split(strings.TrimSuffix(frame, "\n"), "\n")
	need := max(len(lines), t.reserved)
	need = min(need, h-minOutputRows)
	var b strings.Builder
	switch {
	case t.reserved == 0:
		// Make room below the cursor (scrolling what is on screen up if
		// needed), go back to the line the command writes next, and
		// fence the rows below it off.
		b.WriteString(strings.Repeat("\n", need))
		fmt.Fprintf(&b, "\x1b[%dA", need)
		fmt.Fprintf(&b, "%s\x1b[1;%dr%s", saveCursor, h-need, restoreCursor)
	case need > t.reserved || h != t.height:
		if grow := need - t.reserved; grow > 0 && h == t.height {
			// Scroll the command's region up by grow rows, then follow
			// its cursor up before the region shrinks.
			fmt.Fprintf(&b, "%s\x1b[%d;1H%s%s\x1b[%dA", saveCursor, h-t.reserved, strings.Repeat("\n", grow), restoreCursor, grow)
		}
		fmt.Fprintf(&b, "%s\x1b[1;%dr%s", saveCursor, h-need, restoreCursor)
	}
	t.reserved, t.height = need, h
	b.WriteString(saveCursor)
	for i := range need {
		fmt.Fprintf(&b, "\x1b[%d;1H\x1b[2K", h-need+1+i)
		if i < len(lines) {
			b.WriteString(lines[i])
		}
	}
	b.WriteString(restoreCursor)
	io.WriteString(t.W, b.String()) //nolint:errcheck // a closed terminal is not worth failing the trace for
}

// Clear erases the frame for good and gives the whole terminal back:
// later output (the summary) goes where the command's cursor is.
func (t *Terminal) Clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	if t.reserved == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\x1b[r\x1b[%d;1H\x1b[J%s", saveCursor, t.height-t.reserved+1, restoreCursor)
	t.reserved = 0
	io.WriteString(t.W, b.String()) //nolint:errcheck // see Draw
}

// whatIfMin is the smallest saving worth a row: below half a percent of
// the step, a fix is not worth anyone's time.
const whatIfMin = 0.005

func shownWhatIf(es []whatif.Estimate, n int) []whatif.Estimate {
	var out []whatif.Estimate
	for _, e := range es {
		if len(out) == n {
			break
		}
		if e.SavedFraction >= whatIfMin {
			out = append(out, e)
		}
	}
	return out
}

// formatSaving prints a per-step saving with one decimal below 10 ms,
// where whole milliseconds would round most savings away.
func formatSaving(ns int64) string {
	if ns >= int64(time.Millisecond) && ns < 10*int64(time.Millisecond) {
		return fmt.Sprintf("%.1f ms", float64(ns)/1e6)
	}
	return FormatNS(ns)
}

// writeWhatIf writes one line in the live view, a block in the summary:
// per cause, the step time saved without it and the fix that removes it.
// A cause seen in few steps (a periodic checkpoint) says so, since its
// per-step figure is an average over steps that mostly did not pay it.
func writeWhatIf(b *strings.Builder, v View) {
	if !v.whatIfBlock {
		es := shownWhatIf(v.WhatIf, 2)
		if len(es) == 0 {
			return
		}
		parts := make([]string, len(es))
		for i, e := range es {
			parts[i] = fmt.Sprintf("%s −%s/step (−%.1f%%)", e.Cause, formatSaving(e.SavedNSPerStep), 100*e.SavedFraction)
		}
		fmt.Fprintf(b, "what if: without %s\n", strings.Join(parts, ", "))
		return
	}
	es := shownWhatIf(v.WhatIf, 5)
	if len(es) == 0 {
		return
	}
	b.WriteString("\nwhat if (step time saved per step, each cause removed alone)\n")
	for _, e := range es {
		fmt.Fprintf(b, "  without %-15s −%s/step (−%.1f%%) — %s\n", e.Cause, formatSaving(e.SavedNSPerStep), 100*e.SavedFraction, e.Fix)
		if v.Steps > 0 && e.Steps*10 < v.Steps*9 {
			fmt.Fprintf(b, "          %-15s paid in %d of %d steps, up to %s in one\n", "", min(e.Steps, v.Steps), v.Steps, formatSaving(e.MaxNS))
		}
	}
}
