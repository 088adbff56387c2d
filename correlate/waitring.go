package correlate

import "slices"

// Ring statistics: a ring needs minHistory samples before it stands for
// what the process usually does (drain time, lite lead, comm baseline);
// the drain and the lead are the medians of the last drainRecent and
// leadRecent samples, the latest steps saying best what this one is like;
// the queue's depth when the feeder stops is the upper quartile of the
// last waitRecent sync waits.
const (
	minHistory  = 4
	drainRecent = 5
	leadRecent  = 9
	waitRecent  = 16
)

// waitRing holds the recent waits of one sync slot.
type waitRing struct {
	v [32]int64
	n int
}

func (r *waitRing) push(x int64) { r.v[r.n%len(r.v)] = x; r.n++ }

// recentMedian is the median of the last k values pushed (fewer when fewer
// were): the latest steps say best what this step's work looks like.
func (r *waitRing) recentMedian(k int) int64 {
	var buf [len(waitRing{}.v)]int64
	v := r.recentSorted(k, &buf)
	return v[len(v)/2]
}

// recentSorted is the last k values pushed (fewer when fewer were), sorted,
// in buf: the rings are read on every sync and enqueue, and a fresh slice
// each time was the engine's most frequent allocation.
func (r *waitRing) recentSorted(k int, buf *[len(waitRing{}.v)]int64) []int64 {
	k = min(k, r.n, len(r.v))
	v := buf[:k]
	for i := range v {
		v[i] = r.v[(r.n-1-i)%len(r.v)]
	}
	slices.Sort(v)
	return v
}

// low is the lower quartile of the values held: what an ordinary step
// takes. Not the minimum: one step that reached its sync unusually (a
// host delay in lite, an outlier) would lower the baseline for the whole
// ring and turn every ordinary step after it into a false stall.
func (r *waitRing) low() int64 {
	k := min(r.n, len(r.v))
	v := r.v
	slices.Sort(v[:k])
	return v[(k-1)/4]
}

// high is the upper quartile of the last k values pushed: a queue that
// is deep at one sync of a step (the step's last, on the stream that
// computes) is deep, however many other syncs return at once.
func (r *waitRing) high(k int) int64 {
	var buf [len(waitRing{}.v)]int64
	v := r.recentSorted(k, &buf)
	return v[(3*len(v))/4]
}
