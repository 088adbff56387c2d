package cli

import (
	"container/heap"

	"github.com/gaptrace/gaptrace/correlate"
)

// reorderHorizon is how much trace time a gap is held for earlier ones to
// arrive. The engine delivers a gap up to about 2.4 s of trace time after
// a later-starting one (a decision waiting for GPU windows, holdMax plus
// windowWait, across processes finalised in map order); 10 s covers that
// with room for a slow sidecar. A gap later than that (held while the
// step period was still unknown over several long steps) is written when
// it arrives.
const reorderHorizon = int64(10e9)

// startOrder holds gaps until no earlier one can still arrive, so the gaps
// file is in start order although the engine finalises processes and
// decisions out of order.
type startOrder struct {
	h        gapHeap
	maxStart int64
	out      func(correlate.Gap)
}

type gapHeap []correlate.Gap

func (h gapHeap) Len() int           { return len(h) }
func (h gapHeap) Less(i, j int) bool { return h[i].Start < h[j].Start }
func (h gapHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *gapHeap) Push(x any)        { *h = append(*h, x.(correlate.Gap)) }
func (h *gapHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	*h = old[:len(old)-1]
	return g
}

func (o *startOrder) add(g correlate.Gap) {
	heap.Push(&o.h, g)
	o.maxStart = max(o.maxStart, g.Start)
	for o.h.Len() > 0 && o.maxStart-o.h[0].Start > reorderHorizon {
		o.out(heap.Pop(&o.h).(correlate.Gap))
	}
}

// flush writes everything held, in start order.
func (o *startOrder) flush() {
	for o.h.Len() > 0 {
		o.out(heap.Pop(&o.h).(correlate.Gap))
	}
}
