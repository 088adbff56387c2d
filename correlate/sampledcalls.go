package correlate

import (
	"strings"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// Calls too short for the tracer's threshold (50 µs) are counted, not
// emitted: a checkpoint written as a thousand 8 KiB writes into the page
// cache (torch.save of many small tensors) leaves its thread on the CPU
// inside write(2) for most of the save, and the gap shows that time as
// cpu. A CPU sample taken there finds the thread's user stack at libc's
// syscall wrapper (the kernel runs on its behalf), so the share of the
// thread's samples in a gap's untraced on-CPU time that land in a read or
// write wrapper is the share of that time spent in short reads or writes.

// wrapperClass is the I/O call whose libc wrapper frame f is, SysOther
// when none.
func wrapperClass(f event.Frame) event.SyscallClass {
	if !strings.Contains(f.File, "/libc.so") && !strings.Contains(f.File, "/libc-") {
		return event.SysOther
	}
	switch strings.TrimLeft(f.Function, "_") {
	case "write", "libc_write", "GI___libc_write", "pwrite64", "libc_pwrite64", "pwrite", "writev", "pwritev", "pwritev2":
		return event.SysWrite
	case "read", "libc_read", "GI___libc_read", "pread64", "libc_pread64", "pread", "readv", "preadv", "preadv2":
		return event.SysRead
	}
	return event.SysOther
}

// sampledCalls moves from g's cpu to io.write and io.read the share of its
// thread's CPU samples, over its untraced on-CPU time, that were in short
// writes or reads; the time goes to the file the thread wrote (read)
// longest in the gap where one is known, and the dominant cause is chosen
// again.
func (s *samples) sampledCalls(g *Gap, th *attribute.Thread) {
	cpu := g.Breakdown[CauseCPU]
	l := s.byTID[g.TID]
	if cpu <= 0 || len(l) == 0 || th == nil {
		return
	}
	// Most gaps hold no sample in a read or write: skip the timeline walk.
	found := false
	for i := s.first(g.TID, g.Start); i < len(l) && l[i].at < g.End && !found; i++ {
		found = l[i].sys != event.SysOther
	}
	if !found {
		return
	}
	var n, writes, reads int
	for _, seg := range th.Segments(g.Start, g.End, nil) {
		if seg.Ev != nil {
			continue
		}
		for i := s.first(g.TID, seg.A); i < len(l) && l[i].at < seg.B; i++ {
			n++
			switch l[i].sys {
			case event.SysWrite:
				writes++
			case event.SysRead:
				reads++
			}
		}
	}
	if n == 0 || writes+reads == 0 {
		return
	}
	moved := int64(0)
	for _, m := range []struct {
		k     int
		cause Cause
		op    string
	}{{writes, CauseIOWrite, "write"}, {reads, CauseIORead, "read"}} {
		ns := cpu * int64(m.k) / int64(n)
		if ns <= 0 {
			continue
		}
		moved += ns
		g.Breakdown[m.cause] += ns
		if f := topFile(g.Evidence.Files, m.op); f != "" {
			addFileNS(&g.Evidence, attribute.FileEvidence{Path: f, Op: m.op, NS: ns})
		}
	}
	if g.Breakdown[CauseCPU] -= moved; g.Breakdown[CauseCPU] <= 0 {
		delete(g.Breakdown, CauseCPU)
	}
	g.Cause = attribute.Dominant(g.Breakdown)
}

// first is the index of tid's first sample at or after t.
func (s *samples) first(tid uint32, t int64) int {
	l := s.byTID[tid]
	lo, hi := 0, len(l)
	for lo < hi {
		m := (lo + hi) / 2
		if l[m].at < t {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// topFile is the file of files with the most time in operation op, "" when
// none.
func topFile(files []attribute.FileEvidence, op string) string {
	best, bestNS := "", int64(-1)
	for _, f := range files {
		if f.Op == op && f.NS > bestNS {
			best, bestNS = f.Path, f.NS
		}
	}
	return best
}
