package correlate

import (
	"fmt"
	"sort"

	"github.com/gaptrace/gaptrace/event"
)

// The work clock: a training loop enqueues the same data movement every
// iteration (the batch's copies, the gradients' all-reduces) and the same
// number of kernels, while host code adds synchronisations at will (a
// scalar read, a loss check, logging every so often). When the syncs per
// step vary, steps are counted by an enqueued operation that occurs a fixed
// number of times per step, between two of which everything else enqueued
// repeats; the step still ends at a sync, the one of the segment after
// which the host took longest to enqueue again.

const (
	tokMax = 256 // enqueue tokens remembered for clock detection
	// scalarBytes: copies and memsets this small are host code reading or
	// setting scalars, which it does at will; they neither clock steps nor
	// make two steps differ.
	scalarBytes = 4096
	clockMaxM   = 4 // most occurrences of the clock per step considered
	clockSegMin = 6 // segments compared at least before a clock is trusted
	clockKeys   = 16
	// clockEvery: tokens between detection attempts.
	clockEvery = 4
)

// tokKey identifies an enqueued operation across steps.
type tokKey struct {
	kind   event.Kind
	stream uint64
	bytes  uint64
	op     event.NCCLOp
	comm   uint64
}

// token is one enqueued operation that can clock steps.
type token struct {
	key      tokKey
	t        int64
	launches uint64 // kernels launched since the previous token
	syncs    int    // syncs since the previous token
}

// clockState is the clock a stepper counts steps by.
type clockState struct {
	key   tokKey
	m     int   // occurrences per step
	phase int   // which occurrence (mod m) starts a step
	occ   int64 // occurrences numbered so far
	// The live segment since the last boundary token, and the previous one,
	// to notice when the pattern is lost.
	seg, prev segFeat
	havePrev  bool
}

// segFeat is what one step enqueued, for comparing steps.
type segFeat struct {
	launches uint64
	counts   map[tokKey]int
	syncs    int
}

func (a *segFeat) same(b *segFeat, launchesSeen bool) bool {
	if launchesSeen && !launchesClose(a.launches, b.launches) {
		return false
	}
	if len(a.counts) != len(b.counts) {
		return false
	}
	for k, n := range a.counts {
		if b.counts[k] != n {
			return false
		}
	}
	return true
}

func launchesClose(x, y uint64) bool {
	if x < y {
		x, y = y, x
	}
	return x-y <= launchJitter || float64(x-y) <= launchJitterRel*float64(x)
}

// tokenOf is the clock token of an enqueue, if it can be one.
func tokenOf(ev *event.Event) (tokKey, bool) {
	switch ev.Kind {
	case event.KindMemcpyAsync, event.KindMemset:
		if ev.Bytes <= scalarBytes {
			return tokKey{}, false
		}
		return tokKey{kind: ev.Kind, stream: ev.Stream, bytes: ev.Bytes}, true
	case event.KindCollective:
		return tokKey{kind: ev.Kind, stream: ev.Stream, bytes: ev.Bytes, op: ev.Op, comm: ev.Comm}, true
	}
	return tokKey{}, false
}

// clockFound is a detected clock and how steps look under it.
type clockFound struct {
	key          tokKey
	m, phase     int
	segLen       float64 // tokens per step
	syncsVary    bool    // the syncs per step differ between steps
	syncsPerStep int     // when they do not
	occ          int64   // occurrences of key in the ring, numbered from 0
}

// detectClock finds the finest operation of the token ring that occurs a
// fixed number of times per step with the same work between.
func detectClock(toks []token, launchesSeen bool, posts func(lo, hi int64) int64) (clockFound, bool) {
	var keys []tokKey
	occ := map[tokKey][]int{}
	for i := range toks {
		k := toks[i].key
		if _, ok := occ[k]; !ok {
			if len(keys) == clockKeys {
				continue
			}
			keys = append(keys, k)
		}
		occ[k] = append(occ[k], i)
	}
	var best clockFound
	found := false
	for _, k := range keys {
		o := occ[k]
		for m := 1; m <= clockMaxM; m++ {
			nseg := (len(o) - 1) / m
			if nseg < clockSegMin {
				break
			}
			feats := make([]segFeat, nseg)
			for s := 0; s < nseg; s++ {
				f := segFeat{counts: map[tokKey]int{}}
				for j := o[s*m] + 1; j <= o[(s+1)*m]; j++ {
					f.launches += toks[j].launches
					f.syncs += toks[j].syncs
					f.counts[toks[j].key]++
				}
				feats[s] = f
			}
			match, syncSame := 0, 0
			for s := 1; s < nseg; s++ {
				if feats[s].same(&feats[s-1], launchesSeen) {
					match++
				}
				if feats[s].syncs == feats[s-1].syncs {
					syncSame++
				}
			}
			if float64(match) < matchMin*float64(nseg-1) {
				continue
			}
			// The finest clock wins; at equal step length the one that
			// occurs once per step, whose occurrence needs no phase.
			segLen := float64(o[nseg*m]-o[0]) / float64(nseg)
			if found && (segLen > best.segLen*1.01 || (segLen >= best.segLen*0.99 && m >= best.m)) {
				break
			}
			best = clockFound{key: k, m: m, segLen: segLen,
				syncsVary:    float64(syncSame) < matchMin*float64(nseg-1),
				syncsPerStep: feats[nseg-1].syncs, occ: int64(len(o))}
			best.phase = clockPhase(toks, o, m, posts)
			found = true
			break
		}
	}
	return best, found
}

// clockPhase picks which occurrence (mod m) starts a step: the one before
// which the host paused longest after a sync (fetching the next batch).
func clockPhase(toks []token, o []int, m int, posts func(lo, hi int64) int64) int {
	if m == 1 {
		return 0
	}
	bestR, bestV := 0, int64(-1)
	for r := 0; r < m; r++ {
		var v []int64
		for i := r; i < len(o); i += m {
			if i == 0 {
				continue
			}
			v = append(v, posts(toks[o[i-1]].t, toks[o[i]].t))
		}
		if len(v) == 0 {
			continue
		}
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		if med := v[len(v)/2]; med > bestV {
			bestR, bestV = r, med
		}
	}
	return bestR
}

// onLaunches counts kernels launched, for the clock's step comparison.
func (s *stepper) onLaunches(n uint64) { s.pendL += n }

// onToken feeds one enqueue that can clock steps; it reports whether a
// step ended.
func (s *stepper) onToken(set settings, key tokKey, t int64) bool {
	tok := token{key: key, t: t, launches: s.pendL, syncs: s.pendSyncs}
	s.pendL, s.pendSyncs = 0, 0
	s.toks = append(s.toks, tok)
	if len(s.toks) > tokMax {
		copy(s.toks, s.toks[len(s.toks)-tokMax:])
		s.toks = s.toks[:tokMax]
	}
	s.ntok++
	if s.mode == modeClock {
		return s.clockTick(set, &tok)
	}
	if s.ntok%clockEvery != 0 {
		return false
	}
	return s.tryClock(set)
}

// clockTick advances the clock by one token: a step ends at every m-th
// occurrence of its operation.
func (s *stepper) clockTick(set settings, tok *token) bool {
	c := s.clock
	c.seg.add(tok)
	if tok.key != c.key {
		return false
	}
	idx := c.occ
	c.occ++
	if int(idx%int64(c.m)) != c.phase {
		return false
	}
	if c.havePrev {
		s.checks[s.nchecks%lossRing] = c.seg.same(&c.prev, !set.lite)
		s.nchecks++
		if s.nchecks >= lossRing/2 {
			k, bad := min(s.nchecks, lossRing), 0
			for i := 0; i < k; i++ {
				if !s.checks[i] {
					bad++
				}
			}
			if 2*bad > k {
				set.log.Info("step pattern lost, falling back to fixed windows", "pid", s.pid)
				s.toWindows(s.stepEnd(tok.t))
				return true
			}
		}
	}
	c.prev, c.havePrev = c.seg, true
	c.seg = segFeat{counts: map[tokKey]int{}}
	s.boundary(s.stepEnd(tok.t), false)
	return true
}

func (f *segFeat) add(tok *token) {
	f.launches += tok.launches
	f.syncs += tok.syncs
	f.counts[tok.key]++
}

// stepEnd is where the open step ends given that the next one's clock
// operation was enqueued at t: at the sync after which the host clearly
// paused longest (fetching the next batch), else at the last sync before
// t (loops move the batch first, then compute and read their scalars), or
// at t when the step held no sync.
func (s *stepper) stepEnd(t int64) int64 {
	lo := s.openStart()
	var last, best, first, second int64 = 0, 0, -1, -1
	for i := range s.hist {
		h := &s.hist[i]
		if h.end <= lo || h.end > t {
			continue
		}
		last = max(last, h.end)
		switch {
		case h.post > first:
			best, first, second = h.end, h.post, first
		case h.post > second:
			second = h.post
		}
	}
	switch {
	case best > 0 && first >= batchFetchMin && first >= 2*max(second, 0):
		return best
	case last > 0:
		return last
	}
	return t
}

// maxPost is the longest post of the syncs in (lo, hi], -1 when none.
func (s *stepper) maxPost(lo, hi int64) int64 {
	v := int64(-1)
	for i := range s.hist {
		if h := &s.hist[i]; h.end > lo && h.end <= hi && h.post > v {
			v = h.post
		}
	}
	return v
}

// tryClock switches to the work clock when one is found and the sync
// period cannot make the same steps.
func (s *stepper) tryClock(set settings) bool {
	cf, ok := detectClock(s.toks, !set.lite, s.maxPost)
	if !ok {
		return false
	}
	// Steps of a constant number of syncs are the sync period's: it
	// also places comm stalls by their sync's position in the step. The
	// clock takes over where the syncs per step vary, or where the sync
	// period was never found or was lost (fixed windows).
	if !cf.syncsVary && s.mode != modeWindow {
		return false
	}
	prev := s.mode
	set.log.Debug("step period found", "pid", s.pid, "clock", cf.key.String(), "per_step", cf.m, "syncs_vary", cf.syncsVary)
	s.clock = &clockState{key: cf.key, m: cf.m, phase: cf.phase, occ: cf.occ,
		seg: segFeat{counts: map[tokKey]int{}}}
	s.mode = modeClock
	s.period, s.phase = 0, 0
	s.nchecks = 0
	if prev == modeUnknown {
		s.retroClock()
	}
	return true
}

// retroClock lays steps over the token history once a clock is found while
// gaps were held: a prologue window up to the first boundary, then one
// step per clock period.
func (s *stepper) retroClock() {
	c := s.clock
	var idx int64
	first := true
	for i := range s.toks {
		tok := &s.toks[i]
		c.seg.add(tok)
		if tok.key != c.key {
			continue
		}
		idx++
		if int((idx-1)%int64(c.m)) != c.phase {
			continue
		}
		if first {
			first = false
			s.open(s.origin, true)
		}
		c.seg = segFeat{counts: map[tokKey]int{}}
		s.boundary(s.stepEnd(tok.t), false)
	}
}

func (k tokKey) String() string {
	switch k.kind {
	case event.KindCollective:
		return fmt.Sprintf("%s %d bytes on stream %#x", k.op, k.bytes, k.stream)
	case event.KindMemset:
		return fmt.Sprintf("memset %d bytes on stream %#x", k.bytes, k.stream)
	}
	return fmt.Sprintf("copy %d bytes on stream %#x", k.bytes, k.stream)
}

// openStart is the start of the open step, 0 when none is open.
func (s *stepper) openStart() int64 {
	if n := len(s.steps); n > 0 && !s.steps[n-1].closed {
		return s.steps[n-1].Start
	}
	return 0
}

// undecided says whether a gap at midpoint t may still belong to a step
// the clock has not ended yet: under the clock a step's end is known only
// once the next step's operation is enqueued.
func (s *stepper) undecided(t int64) bool {
	if s.mode == modeUnknown {
		return true
	}
	if s.mode != modeClock {
		return false
	}
	o := s.openStart()
	return o == 0 || t >= o
}
