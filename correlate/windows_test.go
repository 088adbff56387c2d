package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestNoComputeSkewedWindows: GPM windows taken before the sampler aligned
// to the counter refresh hold counters up to Skew older than they say. A
// span is idle only where every window that may hold it read zero: a zero
// window stamped over the job's first iterations, whose counters came
// from before them, must not make those iterations setup.
func TestNoComputeSkewedWindows(t *testing.T) {
	const R = 100 * ms
	win := func(a, b int64, sm float64, skew int64) event.GPUWindow {
		return event.GPUWindow{Start: t0 + a, End: t0 + b, Source: event.SourceGPM, SMActivity: sm, IdleFraction: 1 - sm, Skew: skew}
	}
	for _, c := range []struct {
		name        string
		wins        []event.GPUWindow
		a, b        int64 // the span, from t0
		none, known bool
	}{
		{"aligned zero", []event.GPUWindow{win(0, R, 0, 0), win(R, 2*R, 0, 0), win(2*R, 3*R, 0.6, 0)}, 140 * ms, 160 * ms, true, true},
		// Stamped [100,200) but its counters may be those of [0,100): the
		// next window, busy, may hold the span.
		{"skewed zero, busy after", []event.GPUWindow{win(0, R, 0, R), win(R, 2*R, 0, R), win(2*R, 3*R, 0.6, R)}, 140 * ms, 160 * ms, false, true},
		{"skewed zeros all along", []event.GPUWindow{win(0, R, 0, R), win(R, 2*R, 0, R), win(2*R, 3*R, 0, R), win(3*R, 4*R, 0.5, R)}, 140 * ms, 160 * ms, true, true},
		// The windows reach past the span only by less than their skew.
		{"skewed, not reported yet", []event.GPUWindow{win(0, R, 0, R), win(R, 2*R, 0, R)}, 140 * ms, 160 * ms, false, false},
	} {
		d := &device{bg: -1}
		for _, w := range c.wins {
			d.addWindow(w)
		}
		none, known := d.noCompute(t0+c.a, t0+c.b)
		if none != c.none || known != c.known {
			t.Errorf("%s: none %v known %v, want %v %v", c.name, none, known, c.none, c.known)
		}
	}
}
