package correlate

// queued orders one buffered event (kept in Engine.slab, so the heap moves
// small pointer-free keys); seq keeps arrival order among equal keys.
type queued struct {
	end, start int64
	seq        uint64
	slot       int32
}

type evHeap []queued

func (h evHeap) Len() int { return len(h) }
func (h evHeap) Less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.end != b.end {
		return a.end < b.end
	}
	// Intervals that end at t come before point events at t, so a gap
	// closed by an enqueue at t sees the blocking call that returned at t.
	if a.start != b.start {
		return a.start < b.start
	}
	return a.seq < b.seq
}
func (h evHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evHeap) Push(x any)   { *h = append(*h, x.(queued)) }
func (h *evHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	*h = old[:n-1]
	return x
}
