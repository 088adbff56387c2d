package tracer

import (
	"errors"
	"sort"
	"time"

	"github.com/cilium/ebpf"

	"github.com/gaptrace/gaptrace/internal/wake"
)

// Marked launches: a loop that enqueues nothing but kernels (a benchmark
// with its input already on the device, syncing only to print the loss
// every tenth iteration) repeats no copy or collective the step clock can
// count, and its launches reach correlate as per-thread counts. What does
// repeat is the sequence of launched functions: the loop launches some
// function a fixed, small number of times per iteration (the loss, an
// optimizer kernel). The cuda_launch program counts launches per function
// and process (launch_fns); every markScan the tracer reads the counts and
// marks a few functions of each process, those launched fewest times but
// still launched now, one per rarity (so a function launched once per
// iteration is among them whatever runs once per ten). A marked function's
// launches are emitted with their handle (Event.Mark), and correlate's
// clock counts steps by them as it does by copies. Only under ProbesFull:
// lite sees no launch, and auto's windows are too short to learn in.

const (
	markScan = 50 * time.Millisecond
	// markHorizon scans: a function is a candidate when it was launched
	// at least markMinLaunches times over the last markHorizon scans (or
	// all of them, early on) and at least once in the latter half (the
	// loop still runs it).
	markHorizon     = 128
	markMinLaunches = 2
	markSettled     = 4
	markFresh       = 8
	// markMaxRate: launches per second above which a function is not
	// marked (each of its launches would be an event): a loop of 2 ms
	// iterations launches its once-an-iteration functions 500 times a
	// second.
	markMaxRate = 1000
	// markMax: functions marked per process, one per rarity; markKeep:
	// marked functions kept while they are still launched, whether or not
	// the latest pick chose them (the clock counts by them meanwhile).
	markMax  = 4
	markKeep = 8
	// markBin: a pick's next function must be launched this many times as
	// often as the previous one to be of another rarity.
	markBin = 1.25
)

// fnSnap is one scan's launch counts of a process, by function handle.
type fnSnap map[uint64]uint64

// markState is what the tracer remembers of one process's functions.
type markState struct {
	snaps  []fnSnap // the last markHorizon+1 scans, oldest first
	marked map[uint64]bool
	// first: the pick of the previous scan while nothing is marked yet.
	// The first marks wait until two scans in a row pick the same: a
	// function launched every iteration is a candidate only once it was
	// launched twice, by which time one launched thrice an iteration has
	// been for a while, and a clock found on the latter alone would count
	// thirds of iterations.
	first []uint64
}

// candidate is a function a pick may mark: d launches over the horizon.
type candidate struct {
	h uint64
	d uint64
}

// candidates are the functions launched at least markMinLaunches times
// over the snapshots (taken every apart) and at least once in their
// latter half, at no more than markMaxRate.
func candidates(snaps []fnSnap, every time.Duration) []candidate {
	if len(snaps) < 2 {
		return nil
	}
	span := every * time.Duration(len(snaps)-1)
	old, mid, now := snaps[0], snaps[(len(snaps)-1)/2], snaps[len(snaps)-1]
	var cs []candidate
	for h, n := range now {
		d := n - min(n, old[h])
		if d < markMinLaunches || n <= mid[h] {
			continue
		}
		if span > 0 && float64(d) > markMaxRate*span.Seconds() {
			continue
		}
		cs = append(cs, candidate{h, d})
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].d != cs[j].d {
			return cs[i].d < cs[j].d
		}
		return cs[i].h < cs[j].h
	})
	return cs
}

// pickMarks chooses up to markMax functions of distinct rarity, rarest
// first: among the functions a loop launches, one launched once per
// iteration is launched fewest times, but a function launched every tenth
// iteration (a loss read) or once per checkpoint is rarer still, so one
// of each rarity is marked and the clock keeps the finest that repeats.
func pickMarks(cs []candidate) []uint64 {
	var out []uint64
	var last uint64
	for _, c := range cs {
		if len(out) == markMax {
			break
		}
		if len(out) > 0 && float64(c.d) < markBin*float64(last) {
			continue
		}
		out = append(out, c.h)
		last = c.d
	}
	return out
}

// settled says whether a first pick need not wait for the next scan to
// agree: its rarest function was launched markSettled times already.
func settled(pick []uint64, cs []candidate) bool {
	if len(pick) == 0 {
		return false
	}
	for _, c := range cs {
		if c.h == pick[0] {
			return c.d >= markSettled
		}
	}
	return false
}

// fresh says whether a function was launched once so far, within the last
// markFresh scans: it may be the loop's rarest, one iteration in, and the
// first pick waits for it.
func fresh(snaps []fnSnap) bool {
	old, now := snaps[0], snaps[len(snaps)-1]
	recent := snaps[max(0, len(snaps)-1-markFresh)]
	for h, n := range now {
		if d := n - min(n, old[h]); d == 1 && n > recent[h] {
			return true
		}
	}
	return false
}

// update takes a scan's counts and returns the functions to mark and to
// unmark.
func (s *markState) update(now fnSnap, every time.Duration) (mark, unmark []uint64) {
	s.snaps = append(s.snaps, now)
	if len(s.snaps) > markHorizon+1 {
		s.snaps = s.snaps[len(s.snaps)-markHorizon-1:]
	}
	if s.marked == nil {
		s.marked = map[uint64]bool{}
	}
	cs := candidates(s.snaps, every)
	still := make(map[uint64]uint64, len(cs))
	for _, c := range cs {
		still[c.h] = c.d
	}
	pick := pickMarks(cs)
	if len(s.marked) == 0 && fresh(s.snaps) {
		s.first = nil
		return nil, nil
	}
	if len(s.marked) == 0 && !settled(pick, cs) {
		same := len(pick) > 0 && len(pick) == len(s.first)
		for i := 0; same && i < len(pick); i++ {
			same = pick[i] == s.first[i]
		}
		if s.first = pick; !same {
			return nil, nil
		}
	}
	want := map[uint64]bool{}
	for _, h := range pick {
		want[h] = true
	}
	// Marked functions still launched stay marked, the rarest first, up to
	// markKeep in all: switching marks would cost the clock its history.
	var kept []candidate
	for h := range s.marked {
		if d, ok := still[h]; ok && !want[h] {
			kept = append(kept, candidate{h, d})
		}
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].d < kept[j].d || kept[i].d == kept[j].d && kept[i].h < kept[j].h })
	for _, c := range kept {
		if len(want) >= markKeep {
			break
		}
		want[c.h] = true
	}
	for h := range want {
		if !s.marked[h] {
			mark = append(mark, h)
		}
	}
	for h := range s.marked {
		if !want[h] {
			unmark = append(unmark, h)
		}
	}
	sort.Slice(mark, func(i, j int) bool { return mark[i] < mark[j] })
	sort.Slice(unmark, func(i, j int) bool { return unmark[i] < unmark[j] })
	s.marked = want
	return mark, unmark
}

// markLoop scans launch_fns every markScan and marks each traced
// process's step-clocking functions.
func (t *Tracer) markLoop() {
	defer t.wg.Done()
	tick := wake.NewTicker(markScan)
	defer tick.Stop()
	states := map[uint32]*markState{}
	last := time.Now()
	for {
		select {
		case <-t.done:
			return
		case now := <-tick.C:
			tick.Next()
			every := now.Sub(last)
			last = now
			if err := t.scanMarks(states, every); err != nil {
				t.log.Warn("launch counts: scan failed; steps of loops that enqueue only kernels are not counted", "error", err)
				return
			}
		}
	}
}

// scanMarks reads launch_fns once and applies each traced process's
// marks.
func (t *Tracer) scanMarks(states map[uint32]*markState, every time.Duration) error {
	m := t.cuda.LaunchFns
	snaps := map[uint32]fnSnap{}
	counts := map[cudaLaunchFnKey]cudaLaunchFn{}
	if err := readLaunchFns(m, func(k cudaLaunchFnKey, v cudaLaunchFn) {
		counts[k] = v
		s := snaps[k.Tgid]
		if s == nil {
			s = fnSnap{}
			snaps[k.Tgid] = s
		}
		s[k.Handle] = v.Count
	}); err != nil {
		return err
	}
	t.mu.Lock()
	traced := make(map[uint32]bool, len(t.procs))
	for pid := range t.procs {
		traced[pid] = true
	}
	t.mu.Unlock()
	for pid := range states {
		if !traced[pid] {
			delete(states, pid)
		}
	}
	for pid := range traced {
		s := states[pid]
		if s == nil {
			s = &markState{}
			states[pid] = s
		}
		snap := snaps[pid]
		if snap == nil {
			snap = fnSnap{}
		}
		mark, unmark := s.update(snap, every)
		for _, h := range mark {
			if err := setMark(m, counts, pid, h, 1); err != nil {
				return err
			}
		}
		for _, h := range unmark {
			if err := setMark(m, counts, pid, h, 0); err != nil {
				return err
			}
		}
		if len(mark) > 0 {
			t.log.Debug("marked launched functions as step clocks", "pid", pid, "marked", len(s.marked), "new", len(mark))
		}
	}
	return nil
}

// setMark sets a function's mark, keeping the count the scan read (the
// launches counted since are lost to the next scan, which only ranks).
// A function that left the LRU map meanwhile is not put back.
func setMark(m *ebpf.Map, counts map[cudaLaunchFnKey]cudaLaunchFn, pid uint32, h uint64, mark uint32) error {
	k := cudaLaunchFnKey{Tgid: pid, Handle: h}
	v := counts[k]
	v.Mark = mark
	if err := m.Update(&k, &v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// readLaunchFns calls fn for every entry of launch_fns, in batches where
// the kernel supports them.
func readLaunchFns(m *ebpf.Map, fn func(cudaLaunchFnKey, cudaLaunchFn)) error {
	const chunk = 1024
	keys := make([]cudaLaunchFnKey, chunk)
	vals := make([]cudaLaunchFn, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(keys[i], vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case errors.Is(err, ebpf.ErrNotSupported):
			var k cudaLaunchFnKey
			var v cudaLaunchFn
			it := m.Iterate()
			for it.Next(&k, &v) {
				fn(k, v)
			}
			return it.Err()
		case err != nil:
			return err
		}
	}
}
