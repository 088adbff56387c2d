package gpusample

import (
	"slices"
	"testing"
	"time"
)

// refreshPhase follows the narrowest spans: a wide last span (a read the
// scheduler delayed) and a span that does not agree with the narrow ones
// do not move the phase.
func TestRefreshPhaseNarrowestSpans(t *testing.T) {
	ms := func(f float64) int64 { return int64(f * float64(time.Millisecond)) }
	period := 100 * time.Millisecond
	spans := [][2]int64{
		{ms(995), ms(1004)},      // contains 1000
		{ms(1099.6), ms(1100.4)}, // the narrowest: 1100
		{ms(1104), ms(1108)},     // disagrees with it
		{ms(1180), ms(1230)},     // the last, wide: contains 1200
	}
	got := refreshPhase(spans, period)
	if d := time.Duration(got - ms(1200)); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("phase %v off the last refresh at 1200 ms by %v", time.Duration(got), d)
	}
	if got := refreshPhase(spans[:1], period); got != ms(999.5) {
		t.Errorf("one span: phase %v, want its midpoint", time.Duration(got))
	}
}

// Calibration's pairs become the windows that chain up to where the steady
// windows go on: a refresh interval no counter moved in, or a pair whose
// reads do not hold its grid refresh, cuts the chain there.
func TestCalWindowsChainToTheSteadyWindows(t *testing.T) {
	const R = 100
	grid := func(x int64) int64 { return x / R * R } // refreshes at multiples of R
	pair := func(refresh int64, sm float64) calPair {
		return calPair{lo: refresh - 1, hi: refresh + 1, vals: []float64{sm, 0, 0, 0, 0, 0, 0, 0}}
	}
	for _, tc := range []struct {
		name  string
		pairs []calPair
		last  int64
		want  [][2]int64
	}{
		{"every refresh", []calPair{pair(100, 50), pair(200, 60), pair(300, 70), pair(400, 80)}, 400,
			[][2]int64{{0, 100}, {100, 200}, {200, 300}, {300, 400}}},
		{"an idle interval between", []calPair{pair(100, 50), pair(300, 70), pair(400, 80)}, 400,
			[][2]int64{{200, 300}, {300, 400}}},
		{"steady windows start later", []calPair{pair(100, 50), pair(200, 60)}, 300, nil},
		{"a pair off the grid", []calPair{pair(100, 50), {lo: 210, hi: 230, vals: make([]float64, 8)}, pair(300, 70)}, 300,
			[][2]int64{{200, 300}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := calWindows(tc.pairs, grid, R, tc.last)
			var spans [][2]int64
			for _, w := range got {
				spans = append(spans, [2]int64{w.start, w.end})
			}
			if !slices.Equal(spans, tc.want) {
				t.Fatalf("windows %v, want %v", spans, tc.want)
			}
			if len(got) > 0 && got[len(got)-1].sm != 0.8 && tc.last == 400 {
				t.Errorf("last window's SM activity %v, want 0.8", got[len(got)-1].sm)
			}
		})
	}
}
