package stepclock

import (
	"math"
	"slices"

	"github.com/gaptrace/gaptrace/event"
)

// Iterations whose size the data picks. A loop that packs a varying
// number of micro-batches into each optimizer step (a token budget over
// samples of varying length) copies each micro-batch's input once, so the
// batch copy comes two to six times between two calls of the step's sync:
// more than SiteRepeat, and oneIteration refuses the interval. A site
// read every N-th iteration (or every T seconds) sees one token N times
// too, but there every iteration launches the same work, optimizer
// included, so the launches between its calls are N times one
// iteration's. Where the count varies between intervals (VariedCounts
// values at least), the launches tell them apart: an optimizer step's
// interval launches a part per micro-batch and a fixed part once (the
// optimizer), launches = a·k + b with b clearly above zero; a read every
// N-th iteration has b = 0 (or -1: the sync counts the launches since the
// thread's last flush, and the interval's first launch flushes). Lite
// sees no launches and cannot tell them apart: such a site does not
// clock there.

// VariedCounts: the least distinct token counts between a site's calls
// before its launches are fitted against them.
const VariedCounts = 3

// sized is one interval between two calls of a site: its most repeated
// token's count and its thread's launches.
type sized struct {
	k int
	l uint64
}

// repeats is how many times span's most repeated token comes (copies
// to the host and marked launches left out, as oneIteration does).
func repeats(span []Item, seen *tally) int {
	seen.reset()
	most := 0
	for i := range span {
		it := &span[i]
		if it.Site.Key != "" || it.Key.Dir == event.CUMemcpyDtoH || it.Key.Fn != 0 {
			continue
		}
		most = max(most, seen.add(it.Key))
	}
	return most
}

// tally counts tokens by key. An interval between two calls holds a
// handful of distinct tokens, and a new map for each interval of each
// site was most of what a site check allocated; past tallyLinear keys it
// counts in a map, reused too.
type tally struct {
	keys []Key
	n    []int
	m    map[Key]int
}

const tallyLinear = 16

func (t *tally) reset() {
	t.keys, t.n = t.keys[:0], t.n[:0]
	if len(t.m) > 0 {
		clear(t.m)
	}
}

// add counts k once more and returns its count.
func (t *tally) add(k Key) int {
	if len(t.m) > 0 {
		t.m[k]++
		return t.m[k]
	}
	for i := range t.keys {
		if t.keys[i] == k {
			t.n[i]++
			return t.n[i]
		}
	}
	if len(t.keys) < tallyLinear {
		t.keys, t.n = append(t.keys, k), append(t.n, 1)
		return 1
	}
	if t.m == nil {
		t.m = make(map[Key]int, 2*tallyLinear)
	}
	for i, kk := range t.keys {
		t.m[kk] = t.n[i]
	}
	t.keys, t.n = t.keys[:0], t.n[:0]
	t.m[k]++
	return t.m[k]
}

// variedGood is how many of xs hold one iteration of a loop whose
// iterations hold a varying number of micro-batches: 0 unless the
// counts take VariedCounts values and the launches fit a·k + b with a
// fixed part b of a launch at least, clearly above the fit's scatter; then the intervals within the scatter allowed, and their
// launches.
func variedGood(xs []sized) (int, []uint64) {
	byK := map[int][]uint64{}
	n := 0
	for _, x := range xs {
		if x.k > 0 && x.l > 0 {
			byK[x.k] = append(byK[x.k], x.l)
			n++
		}
	}
	// Each count's median launches: an interval that also holds an
	// evaluation's batches is an outlier of its own count, or a count
	// of its own held by too few intervals to be fitted.
	var ks, ls []float64
	for k, l := range byK {
		if len(l) >= 2 && 20*len(l) >= n {
			ks, ls = append(ks, float64(k)), append(ls, medLaunches(l))
		}
	}
	if len(ks) < VariedCounts || n < SiteMinRuns {
		return 0, nil
	}
	a, b := fitLine(ks, ls)
	var res []float64
	for _, x := range xs {
		if x.k > 0 && x.l > 0 {
			res = append(res, math.Abs(float64(x.l)-(a*float64(x.k)+b)))
		}
	}
	sorted := slices.Clone(res)
	slices.Sort(sorted)
	if scatter := sorted[len(sorted)/2]; a < 1 || b < 1 || b < 4*scatter+0.5 {
		return 0, nil
	}
	var work []uint64
	for _, x := range xs {
		if x.k > 0 && x.l > 0 && math.Abs(float64(x.l)-(a*float64(x.k)+b)) <= math.Max(2, 0.1*float64(x.l)) {
			work = append(work, x.l)
		}
	}
	return len(work), work
}

// fitLine is the least-squares line y = a·x + b through the points.
func fitLine(x, y []float64) (a, b float64) {
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx, sy, sxx, sxy = sx+x[i], sy+y[i], sxx+x[i]*x[i], sxy+x[i]*y[i]
	}
	n := float64(len(x))
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, 0
	}
	a = (n*sxy - sx*sy) / den
	return a, (sy - a*sx) / n
}

// Varied says whether the site key on tid recurs in items once per
// iteration of a varying number of micro-batches (variedGood): the steps
// a weaker clock laid before it, one per micro-batch, cut its iterations
// into varying numbers of steps.
func Varied(items []Item, key string, tid uint32) bool {
	c := candOf(scoreSites(items), key, tid)
	return c != nil && c.varied && recurs(c)
}

// oneIteration says whether span, the stream between two calls of a site
// on tid, holds work (the thread launched, or a token came) and no token
// more than repeat times.
func oneIteration(span []Item, tid uint32, repeat int, seen *tally) bool {
	work := false
	seen.reset()
	for i := range span {
		it := &span[i]
		if it.Site.Key != "" {
			work = work || it.TID == tid && it.Launches > 0
			continue
		}
		if it.Key.Dir == event.CUMemcpyDtoH {
			continue
		}
		work = true
		if it.Key.Fn != 0 {
			// A marked launch: a function an iteration may launch any
			// number of times.
			continue
		}
		if seen.add(it.Key) > repeat {
			return false
		}
	}
	return work
}

// tokened says whether span holds a token other than a read or a marked
// launch.
func tokened(span []Item) bool {
	for i := range span {
		if it := &span[i]; it.Site.Key == "" && it.Key.Dir != event.CUMemcpyDtoH && it.Key.Fn == 0 {
			return true
		}
	}
	return false
}

// variedShort says whether xs may yet prove a loop of varying
// micro-batches that variedGood cannot judge: the intervals whose
// launches were seen hold the same token two or more different numbers
// of times, but fewer than VariedCounts of those numbers recur enough to
// fit (the data picks 3 micro-batches most of the time, 2 now and then).
func variedShort(xs []sized) bool {
	byK := map[int]int{}
	n := 0
	for _, x := range xs {
		if x.k > 0 && x.l > 0 {
			byK[x.k]++
			n++
		}
	}
	fit := 0
	for _, c := range byK {
		if c >= 2 && 20*c >= n {
			fit++
		}
	}
	return len(byK) >= 2 && fit < VariedCounts
}
