package stats

import (
	"slices"
	"testing"
)

func TestMedian(t *testing.T) {
	in := []float64{5, 1, 4}
	for _, tc := range []struct {
		v    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {in, 4}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(tc.v); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.v, got, tc.want)
		}
		if got := MedianInPlace(slices.Clone(tc.v)); got != tc.want {
			t.Errorf("MedianInPlace(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
	if in[0] != 5 || in[1] != 1 {
		t.Errorf("Median sorted its input: %v", in)
	}
}
