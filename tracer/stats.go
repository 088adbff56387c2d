package tracer

import (
	"slices"

	"github.com/gaptrace/gaptrace/event"
)

// Stats returns a snapshot of attachments and counters.
func (t *Tracer) Stats() Stats {
	t.mu.Lock()
	s := Stats{
		Attached:  append([]ProbeInfo(nil), t.tpInfo...),
		Missing:   append([]string(nil), t.missing...),
		Processes: len(t.procs),
	}
	for _, msg := range t.unmapped {
		s.Missing = append(s.Missing, msg)
	}
	for _, ps := range t.procs {
		for _, la := range ps.libs {
			s.Attached = append(s.Attached, la.info...)
			s.Attached = append(s.Attached, la.launchInfo...)
		}
	}
	closed := t.closed
	t.mu.Unlock()
	s.EventsRead = t.eventsRead.Load()
	s.DecodeErrors = t.decodeErrors.Load()
	s.EventsByKind = make(map[string]uint64, recKinds)
	for k := range recKinds {
		if n := t.eventsByKind[k].Load(); n > 0 {
			s.EventsByKind[k.String()] = n
		}
	}
	s.ShortSyscalls = make(map[event.SyscallClass]uint64)
	if closed {
		return s
	}
	if m := t.shared[cudaMapRingDrops]; m != nil {
		var perCPU []uint64
		if err := m.Lookup(uint32(0), &perCPU); err == nil {
			for _, v := range perCPU {
				s.RingDrops += v
			}
		}
	}
	if m := t.shared[cudaMapShortCalls]; m != nil {
		var k cudaShortKey
		var n uint64
		it := m.Iterate()
		for it.Next(&k, &n) {
			s.ShortSyscalls[event.SyscallClass(k.Class)] += n
		}
	}
	return s
}

// Processes returns the pids traced now: the roots passed to Trace and the
// descendants whose fork the tracer has seen (none under ProbesNull, whose
// programs record nothing), in ascending order.
func (t *Tracer) Processes() []int {
	t.mu.Lock()
	out := make([]int, 0, len(t.procs))
	for pid := range t.procs {
		out = append(out, int(pid))
	}
	t.mu.Unlock()
	slices.Sort(out)
	return out
}
