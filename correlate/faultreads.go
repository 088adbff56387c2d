package correlate

import (
	"cmp"
	"slices"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// faultRead is a thread's burst of page faults on one mapped file
// (event.KindFaultRead): from..to on the CPU, reading it.
type faultRead struct {
	from, to int64
	count    uint64
	path     string
	// stack: the code of its first fault (Python frames included).
	stack     []event.Frame
	truncated bool
}

// faultReads keeps each thread's recent fault bursts, in time order, for
// the gaps decided after them; like samples they skip the reorder queue,
// and are kept as long.
type faultReads struct {
	byTID  map[uint32][]faultRead
	n      int
	newest int64
}

// add keeps ev, a KindFaultRead; one whose file is unknown (the mapping
// was gone before the tracer read the process's maps) is dropped.
func (r *faultReads) add(ev *event.Event) {
	if ev.Path == "" || ev.Count == 0 || ev.End < ev.Start {
		return
	}
	if r.byTID == nil {
		r.byTID = make(map[uint32][]faultRead)
	}
	f := faultRead{from: ev.Start, to: ev.End, count: ev.Count, path: ev.Path, stack: ev.Stack, truncated: ev.StackTruncated}
	l := r.byTID[ev.TID]
	if n := len(l); n > 0 && l[n-1].to > f.to {
		i, _ := slices.BinarySearchFunc(l, f.to, func(x faultRead, t int64) int { return cmp.Compare(x.to, t) })
		l = slices.Insert(l, i, f)
	} else {
		l = append(l, f)
	}
	newest := l[len(l)-1].to
	drop := 0
	for drop < len(l) && (l[drop].to < newest-sampleKeep || len(l)-drop > maxThreadSamples) {
		drop++
	}
	r.byTID[ev.TID] = slices.Delete(l, 0, drop)
	r.newest = max(r.newest, newest)
	if r.n++; r.n%4096 == 0 {
		for tid, l := range r.byTID {
			if len(l) == 0 || l[len(l)-1].to < r.newest-sampleKeep {
				delete(r.byTID, tid)
			}
		}
	}
}

// mappedReads gives io.read the time g's thread spent on the CPU walking
// mapped files through page faults during g, out of its cpu time: touching
// cold pages of a memory-mapped dataset costs the fault handler's CPU
// (finding, reading ahead and mapping the pages) as well as the blocks the
// scheduler shows (those are io.read already), and both are what a user
// changes by reading the file differently. The tracer reports a thread's
// consecutive faults on one file as a burst, on the CPU from its first
// fault to its last (event.KindFaultRead); a burst that straddles g's edge
// counts for the part of its span inside g. Each file gets its part in the
// evidence (op "fault"), and the dominant cause is chosen again; a gap
// that reads mostly through faults gets the faulting code's stack.
func (s *samples) mappedReads(g *Gap) {
	cpu := g.Breakdown[CauseCPU]
	l := s.reads.byTID[g.TID]
	if cpu <= 0 || len(l) == 0 {
		return
	}
	i, _ := slices.BinarySearchFunc(l, g.Start+1, func(x faultRead, t int64) int { return cmp.Compare(x.to, t) })
	type part struct {
		ns    int64
		calls uint64
		top   *faultRead // the burst whose stack names the code best
		topNS int64
	}
	byFile := map[string]*part{}
	var files []string
	total := int64(0)
	for ; i < len(l) && l[i].from < g.End; i++ {
		ns, calls := l[i].readIn(g.Start, g.End)
		if ns <= 0 {
			continue
		}
		p := byFile[l[i].path]
		if p == nil {
			p = &part{}
			byFile[l[i].path] = p
			files = append(files, l[i].path)
		}
		p.ns += ns
		p.calls += calls
		total += ns
		if len(l[i].stack) > 0 && (p.top == nil || len(l[i].stack) > len(p.top.stack) ||
			len(l[i].stack) == len(p.top.stack) && ns > p.topNS) {
			// The deepest stack (one taken with its Python frames),
			// then the most time.
			p.top, p.topNS = &l[i], ns
		}
	}
	moved := int64(0)
	var top *part
	for i, f := range files {
		if p := byFile[f]; p.top != nil && (top == nil || p.ns > top.ns) {
			top = p
		}
		ns := byFile[f].ns
		switch {
		case total > cpu && i == len(files)-1:
			ns = cpu - moved
		case total > cpu:
			// The gap's cpu is what its thread ran outside any event;
			// faults timed on another clock may exceed it by a little.
			ns = int64(float64(ns) * float64(cpu) / float64(total))
		}
		if ns <= 0 {
			continue
		}
		moved += ns
		addFileNS(&g.Evidence, attribute.FileEvidence{Path: f, Op: "fault", Calls: int(max(byFile[f].calls, 1)), NS: ns})
	}
	if moved <= 0 {
		return
	}
	if g.Breakdown[CauseCPU] -= moved; g.Breakdown[CauseCPU] <= 0 {
		delete(g.Breakdown, CauseCPU)
	}
	g.Breakdown[CauseIORead] += moved
	g.Cause = attribute.Dominant(g.Breakdown)
	if top != nil && g.Cause == CauseIORead && 2*faultNS(g.Evidence.Files) >= g.Breakdown[CauseIORead] {
		// The gap reads mostly through page faults (on the CPU here,
		// blocked in them as KindOffCPU): their code is the cause's.
		g.Evidence.Stack, g.Evidence.StackTruncated = top.top.stack, top.top.truncated
	}
}

// faultNS is the time of the files' page faults (op "fault").
func faultNS(files []attribute.FileEvidence) int64 {
	ns := int64(0)
	for _, f := range files {
		if f.Op == "fault" {
			ns += f.NS
		}
	}
	return ns
}

// readIn is f's time inside [a, b), the part of its span inside, and
// its faults there, in proportion.
func (f *faultRead) readIn(a, b int64) (int64, uint64) {
	frac := f.within(a, b)
	if frac <= 0 {
		return 0, 0
	}
	if f.to == f.from {
		return 0, f.count // one fault, timed no further than its start
	}
	return int64(float64(f.to-f.from) * frac), uint64(float64(f.count)*frac + 0.5)
}

// within is the share of f's span inside [a, b); a burst of no span
// counts wholly when it lies in the window.
func (f *faultRead) within(a, b int64) float64 {
	from, to := max(f.from, a), min(f.to, b)
	switch span := f.to - f.from; {
	case span <= 0 && f.from >= a && f.from < b:
		return 1
	case span <= 0 || to <= from:
		return 0
	default:
		return float64(to-from) / float64(span)
	}
}

// addFileNS merges f into ev's files (same path and op: calls and time
// add up), ordered and capped as Attribution.Result leaves them
// (attribute.TopFiles).
func addFileNS(ev *Evidence, f attribute.FileEvidence) {
	for i := range ev.Files {
		if e := &ev.Files[i]; e.Path == f.Path && e.Op == f.Op {
			e.Calls += f.Calls
			e.NS += f.NS
			f = *e
			ev.Files = slices.Delete(ev.Files, i, i+1)
			break
		}
	}
	ev.Files = append(ev.Files, f)
	ev.Files = attribute.TopFiles(ev.Files)
}
