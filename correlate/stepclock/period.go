package stepclock

import (
	"sort"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// Period detection.
const (
	MaxPeriod = 16 // most syncs per step considered
	MatchMin  = 0.8
	// LaunchJitter, LaunchJitterRel: launch counts of two syncs this close
	// are the same step shape (data-dependent control flow adds a few).
	LaunchJitter    = 2
	LaunchJitterRel = 0.05
	// detectMin syncs at least are compared, over the last detectPeriods
	// periods or detectWindow syncs, whichever is more.
	detectMin     = 4
	detectPeriods = 4
	detectWindow  = 12
	// BatchFetchMin: the host time after a sync that marks fetching the
	// next batch, when it is also twice any other sync's.
	BatchFetchMin = int64(200 * time.Microsecond)
)

// Sync is what one synchronisation looked like; steps are where the
// sequence of signatures repeats.
type Sync struct {
	CUDA     event.CUDA
	Stream   uint64
	Launches uint64
	Copies   uint64
	Colls    uint64
	End      int64 // the GPU was done (the wakeup, where known)
	Ret      int64 // the call returned
	Wait     int64
	Idx      int64
	// post is the host time from the sync's return to the next enqueue,
	// -1 until known: fetching the next batch makes it longest after the
	// step's last sync.
	Post int64
	// idle: every launch since the previous sync was seen (full, or a
	// window of auto) and there was none, nor a collective; or, with
	// launches unseen (lite), GPM read zero SM activity on the whole
	// device all the while: the sync covered no GPU compute.
	Idle bool
	// from is where the span the sync covered began (the previous sync's
	// end, or its own start).
	From int64
	// gpmWait: launches were not seen and GPM has not yet reported on
	// the span; detection leaves the sync out until it does (gpmWaitMax).
	GPMWait bool
	// absorbed: the sync only waited for copies of device data into an
	// open gap (episode.go); inOp: they were a host operation's (a bulk
	// episode, torch.save), which lies between two iterations: no step
	// ends at its syncs, and the pause after the sync before it lasts
	// through it.
	Absorbed, InOp bool
}

// SameSync says whether two syncs look alike: the same call, stream,
// copies and collectives since the previous sync, and launches within
// LaunchJitter or LaunchJitterRel.
func SameSync(a, b *Sync) bool {
	if a.CUDA != b.CUDA || a.Stream != b.Stream || a.Copies != b.Copies || a.Colls != b.Colls {
		return false
	}
	x, y := a.Launches, b.Launches
	if x < y {
		x, y = y, x
	}
	// Launch counts jitter slightly with data-dependent control flow.
	return x-y <= LaunchJitter || float64(x-y) <= LaunchJitterRel*float64(x)
}

// DetectPeriod finds the smallest P for which recent signatures repeat, the
// phase whose sync waits longest (the end of the step's work), and the idx
// of the first sync of the stretch that repeats. Repeats
// known to have launched no kernel and issued no collective are not a
// loop's steps: a model's setup copies its parameters one by one, each
// followed by a sync, in a pattern that repeats layer after layer, and no
// kernel runs.
func DetectPeriod(hist []Sync) (period, phase int, from int64, ok bool) {
	for P := 1; P <= MaxPeriod; P++ {
		need := max(2*P, detectMin)
		if len(hist) < P+need {
			break
		}
		lo := max(P, len(hist)-max(detectPeriods*P, detectWindow))
		cmp, match := 0, 0
		for i := lo; i < len(hist); i++ {
			cmp++
			if SameSync(&hist[i], &hist[i-P]) {
				match++
			}
		}
		if cmp < need || float64(match) < MatchMin*float64(cmp) {
			continue
		}
		if allIdle(hist[lo-P+1:]) {
			continue
		}
		return P, phaseOf(hist[lo-P:], P), hist[lo-P].Idx, true
	}
	return 0, 0, 0, false
}

// allIdle says whether the syncs are all known to have covered no compute.
func allIdle(h []Sync) bool {
	for i := range h {
		if !h[i].Idle {
			return false
		}
	}
	return true
}

// phaseOf picks which sync of a period ends the step: the one after which
// the host takes clearly longest to enqueue again (it fetches the next
// batch), else the one that waits longest (the end of the step's work).
func phaseOf(h []Sync, P int) int {
	if P == 1 {
		return 0
	}
	median := func(r int, f func(*Sync) int64) int64 {
		var v []int64
		for i := range h {
			if int(h[i].Idx%int64(P)) == r {
				if x := f(&h[i]); x >= 0 {
					v = append(v, x)
				}
			}
		}
		if len(v) == 0 {
			return -1
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[len(v)/2]
	}
	// A sync followed at once by another sync (one per stream, say) does
	// not end the step: only syncs after which work is enqueued qualify.
	ok := make([]bool, P)
	any := false
	for i := range h {
		r := int((h[i].Idx + int64(P) - 1) % int64(P))
		if h[i].Launches+h[i].Copies+h[i].Colls > 0 && !ok[r] {
			ok[r], any = true, true
		}
	}
	if !any {
		for r := range ok {
			ok[r] = true
		}
	}
	best, first, second := -1, int64(-1), int64(-1)
	for r := 0; r < P; r++ {
		if !ok[r] {
			continue
		}
		m := median(r, func(s *Sync) int64 { return s.Post })
		if m > first {
			best, first, second = r, m, first
		} else if m > second {
			second = m
		}
	}
	if best >= 0 && first >= BatchFetchMin && first >= 2*max(second, 0) {
		return best
	}
	best, first = 0, -1
	for r := 0; r < P; r++ {
		if !ok[r] {
			continue
		}
		if m := median(r, func(s *Sync) int64 { return s.Wait }); m > first {
			best, first = r, m
		}
	}
	return best
}
