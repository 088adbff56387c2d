package correlate

import (
	"cmp"
	"slices"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// CodeSample is one code location CPU samples found running during a gap
// (attribute.CodeSample).
type CodeSample = attribute.CodeSample

// Code roles.
const (
	RoleFeeder = attribute.RoleFeeder
	RoleHolder = attribute.RoleHolder
	RoleWorker = attribute.RoleWorker
)

// maxGapCode bounds the code locations one gap lists. holderReach is how
// far around a short lock wait a computing holder's samples are looked for
// (a sampling period at the default rate).
const (
	maxGapCode  = 5
	holderReach = int64(10e6)
)

// sample is one CPU sample kept for the gaps to come: its time and the
// frame it is charged to.
type sample struct {
	at     int64
	frame  event.Frame
	caller event.Frame // the job's frame that called frame's function; Function "" if none
	gc     bool
	// sys: the sample found the thread in a read or write (sampledcalls.go).
	sys event.SyscallClass
}

// samples keeps each thread's recent CPU samples, in time order, for the
// gaps decided after them (a gap is decided once the watermark passed
// it; samples skip the reorder queue).
type samples struct {
	byTID  map[uint32][]sample
	n      int   // samples added, for the sweep
	newest int64 // the newest sample's time
	// reads: each thread's page faults on mapped files (faultreads.go).
	reads faultReads
}

// sampleKeep is how far behind a thread's newest sample the older ones are
// kept: past the engine's longest hold of an undecided gap. maxThreadSamples
// bounds one thread's list whatever its rate.
const (
	sampleKeep       = int64(120e9)
	maxThreadSamples = 1 << 15
)

// add keeps ev, a KindCPUSample, charged to its site frame.
func (s *samples) add(ev *event.Event) {
	if len(ev.Stack) == 0 {
		return
	}
	// The site frame (SiteFrame: the innermost of the job's code, else the
	// innermost frame) and the job's frame that called it, from one walk.
	f, caller := ev.Stack[0], event.Frame{}
	if i := attribute.UserFrame(ev.Stack); i >= 0 {
		f = ev.Stack[i]
		caller, _ = attribute.CallerOf(ev.Stack, i)
	}
	gc := false
	for _, fr := range ev.Stack {
		if fr.Function == GCFunction && fr.File == GCFile {
			gc = true
			break
		}
	}
	if gc && f.Function == GCFunction {
		// Nothing of the job's own code above the collector.
		f = event.Frame{Function: GCFunction}
		caller = event.Frame{}
	}
	if s.byTID == nil {
		s.byTID = make(map[uint32][]sample)
	}
	l := s.byTID[ev.TID]
	smp := sample{at: ev.End, frame: f, caller: caller, gc: gc, sys: wrapperClass(ev.Stack[0])}
	if n := len(l); n > 0 && l[n-1].at > ev.End {
		// Out of order (another CPU's batch): keep the list sorted.
		i, _ := slices.BinarySearchFunc(l, ev.End, func(x sample, t int64) int { return cmp.Compare(x.at, t) })
		l = slices.Insert(l, i, smp)
	} else {
		l = append(l, smp)
	}
	drop := 0
	newest := l[len(l)-1].at
	for drop < len(l) && (l[drop].at < newest-sampleKeep || len(l)-drop > maxThreadSamples) {
		drop++
	}
	if drop > 0 {
		l = slices.Delete(l, 0, drop)
	}
	s.byTID[ev.TID] = l
	s.newest = max(s.newest, newest)
	if s.n++; s.n%4096 == 0 {
		// Threads that stopped running (exited, or asleep for minutes).
		for tid, l := range s.byTID {
			if l[len(l)-1].at < s.newest-sampleKeep {
				delete(s.byTID, tid)
			}
		}
	}
}

// code counts tid's samples in [a, b) by site, most first, at most
// maxGapCode.
func (s *samples) code(tid uint32, a, b int64, role string) []CodeSample {
	l := s.byTID[tid]
	i, _ := slices.BinarySearchFunc(l, a, func(x sample, t int64) int { return cmp.Compare(x.at, t) })
	type key struct {
		fn, file, callerFn, callerFile string
		line, callerLine               int
		gc                             bool
	}
	counts := map[key]int{}
	var order []key
	for ; i < len(l) && l[i].at < b; i++ {
		c := l[i].caller
		k := key{l[i].frame.Function, l[i].frame.Where(), c.Function, c.Where(), l[i].frame.Line, c.Line, l[i].gc}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	out := make([]CodeSample, 0, len(order))
	for _, k := range order {
		cs := CodeSample{Function: k.fn, File: k.file, Line: k.line, Samples: counts[k], TID: tid, Role: role, GC: k.gc}
		if k.callerFn != "" {
			cs.Caller = &event.Frame{Function: k.callerFn, File: k.callerFile, Line: k.callerLine}
		}
		out = append(out, cs)
	}
	slices.SortStableFunc(out, func(x, y CodeSample) int { return cmp.Compare(y.Samples, x.Samples) })
	if len(out) > maxGapCode {
		out = out[:maxGapCode]
	}
	return out
}

// GCFunction and GCFile name the frame the tracer puts innermost in a
// sample taken inside CPython's garbage collector.
const (
	GCFunction = "gc.collect"
	GCFile     = "<gc>"
)

// codeCauses are the causes whose time the thread spent running (or
// waiting to run, or waiting for a thread that ran): the samples say which
// code it was.
func codeCause(c Cause) bool {
	return c == CauseCPU || c == CauseCPUContention || c == CauseLock || c == CauseLoaderWait
}

// attachCode names the code that burned g: the samples of its thread
// during it, when part of it was charged to the CPU, to runqueue waits or
// to a lock or to page faults on a mapped file, or when no blocking
// call's stack names it (an off-CPU block in a page fault has none), and
// those of each lock holder and data-loader worker meanwhile.
func (s *samples) attachCode(g *Gap) {
	if len(s.byTID) == 0 {
		return
	}
	// Page faults on a mapped file (io.read, op "fault") ran on the CPU
	// too: the samples name the code that touched the pages when the
	// bursts' stacks do not.
	charged := codeCause(g.Cause) || faultNS(g.Evidence.Files) > 0
	for c, ns := range g.Breakdown {
		if ns > 0 && codeCause(c) {
			charged = true
		}
	}
	if !charged && len(g.Evidence.Stack) > 0 {
		return
	}
	g.Code = s.code(g.TID, g.Start, g.End, RoleFeeder)
	for i := range g.Evidence.LockHolders {
		h := &g.Evidence.LockHolders[i]
		h.Code = s.code(h.TID, g.Start, g.End, RoleHolder)
		if len(h.Code) == 0 && (h.Doing == CauseCPU || h.Doing == CauseCPUContention) {
			// A wait shorter than the sampling period often holds no
			// sample of the holder; one that computed holding the lock
			// (or waited for a CPU meanwhile, on a loaded machine) did
			// so before and after the wait too: its samples around
			// the wait, as far again on either side (at least
			// holderReach), name that computation.
			reach := max(g.Duration, holderReach)
			h.Code = s.code(h.TID, g.Start-reach, g.End+reach, RoleHolder)
		}
		g.Code = append(g.Code, h.Code...)
	}
	for i := range g.Evidence.Workers {
		// A data-loader worker process computes on its main thread.
		w := &g.Evidence.Workers[i]
		g.Code = append(g.Code, s.code(w.PID, g.Start, g.End, RoleWorker)...)
	}
	if len(g.Code) == 0 {
		g.Code = nil
	}
}
