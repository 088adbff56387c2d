package correlate

import (
	"cmp"
	"slices"

	"github.com/gaptrace/gaptrace/correlate/attribute"
)

// mappedReads gives io.read the share of g's cpu time that CPU samples of
// its thread caught inside the kernel's page-fault handler for a mapped
// file: touching cold pages of a memory-mapped dataset costs the handler's
// CPU (finding, reading ahead and mapping the pages) as well as the blocks
// the scheduler shows (those are io.read already), and both are what a
// user changes by reading the file differently. The share is the fault
// samples over all of the thread's samples in the gap (each one a
// sampling period of its CPU time); each file gets its samples' part in
// the evidence (op "fault"). The dominant cause is chosen again.
func (s *samples) mappedReads(g *Gap) {
	cpu := g.Breakdown[CauseCPU]
	l := s.byTID[g.TID]
	if cpu <= 0 || len(l) == 0 {
		return
	}
	i, _ := slices.BinarySearchFunc(l, g.Start, func(x sample, t int64) int { return cmp.Compare(x.at, t) })
	n := 0
	byFile := map[string]int{}
	var files []string
	for ; i < len(l) && l[i].at < g.End; i++ {
		n++
		if f := l[i].fault; f != "" {
			if byFile[f] == 0 {
				files = append(files, f)
			}
			byFile[f]++
		}
	}
	if len(files) == 0 {
		return
	}
	moved := int64(0)
	for _, f := range files {
		ns := cpu * int64(byFile[f]) / int64(n)
		if ns <= 0 {
			continue
		}
		moved += ns
		addFileNS(&g.Evidence, attribute.FileEvidence{Path: f, Op: "fault", Calls: byFile[f], NS: ns})
	}
	if moved <= 0 {
		return
	}
	if g.Breakdown[CauseCPU] -= moved; g.Breakdown[CauseCPU] <= 0 {
		delete(g.Breakdown, CauseCPU)
	}
	g.Breakdown[CauseIORead] += moved
	g.Cause = attribute.Dominant(g.Breakdown)
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
