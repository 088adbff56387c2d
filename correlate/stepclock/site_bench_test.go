package stepclock

import "testing"

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
