package main

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gaptrace/gaptrace/internal/stats"
)

func TestMedianAndQuantile(t *testing.T) {
	if m := stats.Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := stats.Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	s := []float64{0, 10, 20, 30, 40}
	for _, c := range []struct{ q, want float64 }{{0, 0}, {1, 40}, {0.5, 20}, {0.125, 5}} {
		if got := quantile(s, c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
}

// TestBootstrapCoverage: for samples of 21 from a known distribution, the
// 95% interval holds the true median in about 95% of trials (the
// percentile bootstrap of a median is a little conservative or liberal at
// small n; 88–99% is what it should give), and it narrows as n grows.
func TestBootstrapCoverage(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const trials = 400
	trueMedian := math.Ln2 // of Exp(1)
	hit := 0
	var width21 float64
	for i := 0; i < trials; i++ {
		v := make([]float64, 21)
		for j := range v {
			v[j] = r.ExpFloat64()
		}
		iv := BootstrapMedian(v, 1000, 0.95, uint64(i))
		if iv.Lo > iv.Value || iv.Hi < iv.Value {
			t.Fatalf("interval %v does not hold its median", iv)
		}
		if iv.Lo <= trueMedian && trueMedian <= iv.Hi {
			hit++
		}
		width21 += iv.Hi - iv.Lo
	}
	cov := float64(hit) / trials
	if cov < 0.88 || cov > 0.99 {
		t.Errorf("coverage %.3f, want about 0.95", cov)
	}
	v := make([]float64, 201)
	for j := range v {
		v[j] = r.ExpFloat64()
	}
	iv := BootstrapMedian(v, 1000, 0.95, 7)
	if w := iv.Hi - iv.Lo; w > width21/trials/2 {
		t.Errorf("interval of n=201 is %.3f wide, n=21 %.3f on average: want it well narrower", w, width21/trials)
	}
	if a, b := BootstrapMedian(v, 500, 0.95, 3), BootstrapMedian(v, 500, 0.95, 3); a != b {
		t.Errorf("same seed, different intervals: %v %v", a, b)
	}
	if iv := BootstrapMedian(nil, 100, 0.95, 1); iv != (Interval{}) {
		t.Errorf("empty sample: %v", iv)
	}
}
