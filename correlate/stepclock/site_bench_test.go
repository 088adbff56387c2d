package stepclock

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// BenchmarkMicroBatches: the accumulation test over the launches between
// a site's calls in a full ring of one-sync iterations (no accumulation:
// every group size and phase is tried). It runs for each site on every
// site check, so it must not allocate per phase.
func BenchmarkMicroBatches(b *testing.B) {
	l := make([]uint64, SiteRing/2)
	for i := range l {
		l[i] = 9 + uint64(i%3)
	}
	b.ReportAllocs()
	for b.Loop() {
		if g := microBatches(l); g != 0 {
			b.Fatalf("microBatches = %d, want 0", g)
		}
	}
}

// BenchmarkScore: one site check's scoring of a full ring of a loop
// that copies its batch, syncs at its loss read and, every fifth
// iteration, reads a metric from a second site.
func BenchmarkScore(b *testing.B) {
	loss := Site{Key: "train.py:40 step<train.py:90 main", Name: "train.py:40 step", Frames: []string{"train.py:40 step", "train.py:90 main"}}
	metric := Site{Key: "train.py:55 log<train.py:92 main", Name: "train.py:55 log", Frames: []string{"train.py:55 log", "train.py:92 main"}}
	batch := Key{Kind: event.KindMemcpy, Dir: event.CUMemcpyHtoD, Stream: 7, Bytes: 1 << 20}
	var items []Item
	for i := 0; len(items) < SiteRing; i++ {
		t := int64(i) * 1e6
		items = append(items, Item{TID: 1, Key: batch, T: t}, Item{Site: loss, TID: 1, Launches: 9, T: t + 5e5})
		if i%5 == 4 {
			items = append(items, Item{Site: metric, TID: 1, T: t + 6e5})
		}
	}
	items = items[:SiteRing]
	b.ReportAllocs()
	for b.Loop() {
		if p, ok := Score(items).Pick(1); !ok || p.Site.Key != loss.Key {
			b.Fatalf("pick %+v %v, want the loss read", p, ok)
		}
	}
}
