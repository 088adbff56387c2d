package stepclock

import (
	"slices"

	"github.com/gaptrace/gaptrace/event"
)

// Site weights: a training iteration launches its forward, backward and
// optimizer; an evaluation's batch, its forward only. Where two loops of
// one thread recur apart, the one whose iterations launch clearly more is
// the training's (PickSite), and a stepper remembers each site's weight
// while the stream holds one loop's calls only (an evaluation's batches
// filling it).

// heavier says whether b's iterations launch clearly more than c's (1),
// clearly fewer (-1), or neither (Heavier): the medians over the
// intervals that hold one iteration, where launches were seen (a sync's
// count of them may come at another call: the intervals with none say
// nothing).
func heavier(b, c *siteCand) int {
	return Heavier(medLaunches(b.work), medLaunches(c.work))
}

// Heavier says whether iterations of mb launches (a site's median between
// its calls) are clearly more than of mc (1), clearly fewer (-1), or
// neither (0: alike, or launches not seen): they must differ by more
// than a step's jitter (JitterRel) and by more than a few kernels.
func Heavier(mb, mc float64) int {
	switch {
	case mb == 0 || mc == 0:
		return 0
	case mb > (1+JitterRel)*mc && mb-mc > 2:
		return 1
	case mc > (1+JitterRel)*mb && mc-mb > 2:
		return -1
	}
	return 0
}

// medLaunches is the median of the counts in l, 0 where it is empty.
func medLaunches(l []uint64) float64 {
	if len(l) == 0 {
		return 0
	}
	v := slices.Clone(l)
	slices.Sort(v)
	return float64(v[len(v)/2])
}

// Weights is the median launches between consecutive calls of each site
// in items that recurs (SiteMinRuns calls at least), over the intervals
// that hold one iteration and some launches seen, by SiteID: what a stepper remembers of a site's iterations
// while the stream holds another loop's (an evaluation's) calls only.
//
// A site between whose calls nothing was launched at all, where the
// stream shows launches elsewhere after its first call (they are seen),
// weighs 0: per-tensor copies of a checkpoint are no iterations (an
// attach during one finds its site first). Launches seen only before
// its first call say nothing of it: auto's full window ended there, and
// its lite stretch sees none.
func Weights(items []Item) map[string]float64 { return Score(items).Weights() }

// Weights is the package's Weights over the scored stream.
func (sc *Scored) Weights() map[string]float64 {
	items := sc.items
	w := map[string]float64{}
	for _, c := range sc.cands {
		if len(c.at) < SiteMinRuns {
			continue
		}
		if m := medLaunches(c.work); m > 0 {
			w[SiteID(c.tid, c.site.Key)] = m
		} else if launchedAfter(items, c.at[0]) && slices.Max(c.launches) == 0 {
			w[SiteID(c.tid, c.site.Key)] = 0
		}
	}
	return w
}

// launchedAfter says whether a sited call after items[i] reports
// launches.
func launchedAfter(items []Item, i int) bool {
	for j := i + 1; j < len(items); j++ {
		if items[j].Site.Key != "" && items[j].Launches > 0 {
			return true
		}
	}
	return false
}

// SameWork says whether the sites a and b of tid, in items, each hold one
// same token (not a read, not a marked launch) once in most intervals
// between their calls (SiteGood): the batch copy an eager step and a CUDA
// graph's replay of it both make, which a checkpoint's per-tensor reads
// never hold.
func SameWork(items []Item, a, b string, tid uint32) bool {
	ka, kb := onceKeys(items, a, tid), onceKeys(items, b, tid)
	for k := range ka {
		if kb[k] {
			return true
		}
	}
	return false
}

// SameData says whether sites a and b on tid enclose the same data
// movement: the tokens that come exactly once in most of their intervals
// are the same, and there are some (the batch copy of an eager step and
// of a graph's replay; not an evaluation that copies the input alone,
// nor a checkpoint's reads). Blind to launches (lite), it is all that
// tells a loop that changed its site.
func SameData(items []Item, a, b string, tid uint32) bool {
	ka, kb := onceKeys(items, a, tid), onceKeys(items, b, tid)
	if len(ka) == 0 || len(ka) != len(kb) {
		return false
	}
	for k := range ka {
		if !kb[k] {
			return false
		}
	}
	return true
}

// onceKeys are the tokens that come exactly once in most intervals
// between consecutive calls of site key on tid.
func onceKeys(items []Item, key string, tid uint32) map[Key]bool {
	count := map[Key]int{}
	n, prev := 0, -1
	for i := range items {
		it := &items[i]
		if it.Site.Key != key || it.TID != tid {
			continue
		}
		if prev >= 0 {
			n++
			seen := map[Key]int{}
			for _, t := range items[prev+1 : i] {
				if t.Site.Key == "" && t.Key.Dir != event.CUMemcpyDtoH && t.Key.Fn == 0 {
					seen[t.Key]++
				}
			}
			for k, m := range seen {
				if m == 1 {
					count[k]++
				}
			}
		}
		prev = i
	}
	out := map[Key]bool{}
	for k, m := range count {
		if n > 0 && float64(m) >= SiteGood*float64(n) {
			out[k] = true
		}
	}
	return out
}
