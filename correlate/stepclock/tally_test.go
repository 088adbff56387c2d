package stepclock

import (
	"math/rand/v2"
	"testing"
)

// TestTallyCountsAsAMap: the tally's counts are a map's, across its move
// from the linear slice to the map and back after a reset.
func TestTallyCountsAsAMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tl tally
	for round, distinct := range []int{3, tallyLinear, tallyLinear + 1, 60, 5} {
		tl.reset()
		want := map[Key]int{}
		for range 400 {
			k := Key{Bytes: uint64(r.IntN(distinct)), Stream: 9}
			want[k]++
			if got := tl.add(k); got != want[k] {
				t.Fatalf("round %d (%d keys): count %d, want %d", round, distinct, got, want[k])
			}
		}
	}
}
