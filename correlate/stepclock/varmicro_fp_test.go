package stepclock

import (
	"math/rand/v2"
	"testing"
)

// TestMicroBatchesNotVaryingIterations: the launches between an optimizer
// step's syncs in a loop whose data picks 2 to 6 micro-batches a step
// (each a forward and a backward, the optimizer's two kernels after them)
// are no accumulation, whatever the draw: the intervals launch more and
// less than their median by chance, not one phase more than all others.
func TestMicroBatchesNotVaryingIterations(t *testing.T) {
	found := 0
	for seed := range uint64(400) {
		r := rand.New(rand.NewPCG(seed, 7))
		l := make([]uint64, 20+r.IntN(90))
		for i := range l {
			l[i] = uint64(2*(2+r.IntN(5)) + 2)
		}
		if g := microBatches(l); g != 0 {
			found++
			if found <= 3 {
				t.Errorf("seed %d: microBatches(%v) = %d, want 0", seed, l, g)
			}
		}
	}
	if found > 0 {
		t.Errorf("%d of 400 draws taken for accumulation", found)
	}
}
