package gpusample

import (
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
