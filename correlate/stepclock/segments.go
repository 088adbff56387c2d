package stepclock

import "sort"

// What the segments between a clock's occurrences hold, and how they
// are compared.

// SegSum is what one candidate step enqueued: its operations as a
// multiset hash, its launches and syncs, and the host time it spanned.
type SegSum struct {
	Ops      uint64
	Launches uint64
	Syncs    int
	Dur      int64
}

// phaseTimeRatio: the segments between an operation's occurrences at one
// position mod m are a slice of a step when nearly all of them are this
// many times shorter than nearly all the others. Stalls only lengthen
// segments (a few steps each), so they never make a position short.
const phaseTimeRatio = 4

// slicedByTime says whether an operation occurring m > 1 times per step
// explains unit, the segments between its consecutive occurrences, better
// than once per step does: their host time differs by their position mod m.
func slicedByTime(unit []SegSum) bool {
	for m := 2; m <= MaxM; m++ {
		if len(unit)/m >= SegMin && phasesDifferInTime(unit, m) {
			return true
		}
	}
	return false
}

// phasesDifferInTime says whether the segments at one position mod m are
// short: their upper quartile phaseTimeRatio times below the lower
// quartile of the segments at the other positions.
func phasesDifferInTime(unit []SegSum, m int) bool {
	quart := func(d []int64, q int) int64 {
		sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
		return d[min(len(d)-1, len(d)*q/4)]
	}
	for r := 0; r < m; r++ {
		var in, out []int64
		for i := range unit {
			if i%m == r {
				in = append(in, unit[i].Dur)
			} else {
				out = append(out, unit[i].Dur)
			}
		}
		if len(in) == 0 || len(out) == 0 {
			return false
		}
		if phaseTimeRatio*max(quart(in, 3), 1) < quart(out, 1) {
			return true
		}
	}
	return false
}

// hash is the operation's term in a segment's multiset hash.
func (k Key) hash() uint64 {
	h := uint64(k.Kind) + 1
	for _, v := range [...]uint64{uint64(k.Dir), k.Stream, k.Bytes, uint64(k.Op), k.Comm, k.Fn} {
		h = mix64(h ^ v)
	}
	return h
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func segSyncs(f []SegSum) []int {
	n := make([]int, len(f))
	for i := range f {
		n[i] = f[i].Syncs
	}
	return n
}

// modalMatch is how many steps hold the same operations as the most
// common step, with launch counts that fit its median given the launches
// neighbouring steps lend each other (LagFit), and that median. Comparing
// with the mode rather than the previous step charges an inserted
// checkpoint or evaluation one mismatch, not two.
func modalMatch(feats []SegSum, launchesSeen bool) (int, float64) {
	groups := map[uint64][]int{}
	var mode uint64
	for i := range feats {
		k := feats[i].Ops
		groups[k] = append(groups[k], i)
		if len(groups[k]) > len(groups[mode]) {
			mode = k
		}
	}
	g := groups[mode]
	l := make([]uint64, len(g))
	for i, s := range g {
		l[i] = feats[s].Launches
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	ref := float64(l[len(l)/2])
	if !launchesSeen || !fewCounts(l) {
		// Without launches, or where the loop's data picks how many
		// kernels a step launches (a router, sequence-length buckets):
		// no count is the step's, and the operations alone say which
		// steps are alike.
		return len(g), ref
	}
	n := 0
	var lag LagFit
	for i := range feats {
		if feats[i].Ops != mode {
			// What an inserted step lent or borrowed is unknown.
			lag.Reset()
			continue
		}
		if lag.Fit(feats[i].Launches, ref) {
			n++
		}
	}
	return n, ref
}

// PhasesDiffer says whether the segments between consecutive occurrences
// of an operation differ by their position mod m: a step holding m
// occurrences has its own work between each (a batch copy, then a copy
// into a graph's input, then the replay).
func PhasesDiffer(unit []SegSum, m int, launchesSeen bool) bool {
	var first, firstL uint64
	var firstLs []uint64
	for r := 0; r < m; r++ {
		var ph []SegSum
		for i := r; i < len(unit); i += m {
			ph = append(ph, unit[i])
		}
		if len(ph) == 0 {
			return false
		}
		groups := map[uint64]int{}
		var mode uint64
		for i := range ph {
			k := ph[i].Ops
			groups[k]++
			if groups[k] > groups[mode] {
				mode = k
			}
		}
		l := make([]uint64, len(ph))
		for i := range ph {
			l[i] = ph[i].Launches
		}
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		med := l[len(l)/2]
		if r == 0 {
			first, firstL, firstLs = mode, med, l
			continue
		}
		if mode != first {
			return true
		}
		// Launch counts tell phases apart when their medians differ and
		// both positions launch one of few counts: a loop runs the same
		// kernels at the same place of every iteration (an occurrence
		// missed or inserted by a checkpoint mixes two of them into a
		// position), while a loop whose data picks how many kernels a
		// step launches spreads each position's counts, and their
		// medians differ by chance.
		if launchesSeen && !launchesClose(med, firstL) && (fewCounts(l) || fewCounts(firstLs)) {
			return true
		}
	}
	return !launchesSeen && phasesDifferInTime(unit, m)
}

// fewCounts says whether sorted launch counts are mostly one or two
// counts (give or take countSlack of each): at least three in four.
func fewCounts(l []uint64) bool {
	taken := make([]bool, len(l))
	free := make([]int, len(l)+1) // counts not taken before each index
	covered := 0
	for pick := 0; pick < 2; pick++ {
		for i := range l {
			free[i+1] = free[i]
			if !taken[i] {
				free[i+1]++
			}
		}
		best, bestLo, bestHi := 0, 0, 0
		lo := 0
		for hi := range l {
			for l[hi]-l[lo] > 2*countSlack(l[hi]) {
				lo++
			}
			if n := free[hi+1] - free[lo]; n > best {
				best, bestLo, bestHi = n, lo, hi
			}
		}
		for k := bestLo; k <= bestHi; k++ {
			taken[k] = true
		}
		covered += best
	}
	return 4*covered >= 3*len(l)
}

// countSlack is how far a loop's launch count at one place may stray
// between iterations: none for a few launches, a twentieth of many (what
// a lagging flush moves across a boundary).
func countSlack(n uint64) uint64 { return n / 20 }

// clockPhase picks which occurrence (mod m) starts a step. A step ends at
// syncs it always makes (the final loss read, one per stream), while
// scalar reads come and go: the start is the occurrence whose preceding
// stretch held a sync in every step (the most syncs at least), and among
// those the one before which the host paused longest after a sync
// (fetching the next batch).
func clockPhase(toks []Token, o []int, m int, posts func(lo, hi int64) int64) int {
	if m == 1 {
		return 0
	}
	bestR, bestMin, bestV := 0, -1, int64(-1)
	for r := 0; r < m; r++ {
		var v []int64
		least := -1
		for i := r; i < len(o); i += m {
			if i == 0 {
				continue
			}
			n := 0
			for j := o[i-1] + 1; j <= o[i]; j++ {
				n += toks[j].Syncs
			}
			if least < 0 || n < least {
				least = n
			}
			v = append(v, posts(toks[o[i-1]].T, toks[o[i]].T))
		}
		if len(v) == 0 {
			continue
		}
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		med := v[len(v)/2]
		if least > bestMin || (least == bestMin && med > bestV) {
			bestR, bestMin, bestV = r, least, med
		}
	}
	return bestR
}
