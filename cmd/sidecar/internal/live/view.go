package live

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/whatif"
)

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
	// TopCode are the sites CPU samples found most often in gaps charged
	// to the CPU, a lock or a loader's work (Note: samples and gaps).
	TopCode []TopItem
	LastGap *correlate.Gap
	Stats   Stats
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
	// StepClocks: what each process's steps are counted by (the step
	// site found, for --step-at), most steps first.
	StepClocks []correlate.StepClock
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
		v.StepClocks = slices.Clone(a.snap.StepClocks)
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
	for _, cs := range a.topCode(3) {
		v.TopCode = append(v.TopCode, codeItem(cs))
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
