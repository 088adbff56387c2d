package whatif

import (
	"math"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

const ms = int64(time.Millisecond)

func step(n int64, dur int64, by map[correlate.Cause]int64) correlate.Step {
	return correlate.Step{PID: 7, Number: n, Start: n * 1000 * ms, End: n*1000*ms + dur, ByCause: by}
}

func TestForStep(t *testing.T) {
	half := 0.5
	for _, tc := range []struct {
		name string
		s    correlate.Step
		gaps []correlate.Gap
		want map[correlate.Cause]int64
	}{
		{
			name: "idle disappears with its cause",
			s:    step(1, 100*ms, map[correlate.Cause]int64{correlate.CauseIOWrite: 30 * ms, correlate.CauseCPU: 2 * ms}),
			want: map[correlate.Cause]int64{correlate.CauseIOWrite: 30 * ms, correlate.CauseCPU: 2 * ms},
		},
		{
			name: "a stall keeps the compute it overlapped",
			s:    step(2, 100*ms, map[correlate.Cause]int64{correlate.CauseComm: 40 * ms}),
			gaps: []correlate.Gap{{PID: 7, Step: 2, Kind: correlate.GapStall, Duration: 20 * ms,
				Breakdown: map[correlate.Cause]int64{correlate.CauseComm: 20 * ms},
				Evidence:  correlate.Evidence{SMActivity: &half}}},
			// 20 ms of comm idle, plus half of the 20 ms stall.
			want: map[correlate.Cause]int64{correlate.CauseComm: 30 * ms},
		},
		{
			name: "a stall without GPM is saved whole; other steps' stalls are ignored",
			s:    step(3, 100*ms, map[correlate.Cause]int64{correlate.CauseComm: 20 * ms}),
			gaps: []correlate.Gap{
				{PID: 7, Step: 3, Kind: correlate.GapStall, Breakdown: map[correlate.Cause]int64{correlate.CauseComm: 20 * ms}},
				{PID: 7, Step: 4, Kind: correlate.GapStall, Breakdown: map[correlate.Cause]int64{correlate.CauseComm: 20 * ms},
					Evidence: correlate.Evidence{SMActivity: &half}},
			},
			want: map[correlate.Cause]int64{correlate.CauseComm: 20 * ms},
		},
		{
			name: "a loader wait shorter than the compute is hidden by twice the workers",
			s:    step(5, 100*ms, map[correlate.Cause]int64{correlate.CauseLoaderWait: 40 * ms}),
			want: map[correlate.Cause]int64{correlate.CauseLoaderWait: 40 * ms},
		},
		{
			name: "a loader wait longer than the compute is only halved with the compute",
			// w = 80, C = 20: a batch every 100 ms, with twice the
			// workers every 50 ms: 50 ms saved.
			s:    step(6, 100*ms, map[correlate.Cause]int64{correlate.CauseLoaderWait: 80 * ms}),
			want: map[correlate.Cause]int64{correlate.CauseLoaderWait: 50 * ms},
		},
		{
			name: "nothing to save",
			s:    step(7, 100*ms, map[correlate.Cause]int64{correlate.CauseCPU: 0}),
			want: map[correlate.Cause]int64{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ForStep(tc.s, tc.gaps)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for c, ns := range tc.want {
				if got[c] != ns {
					t.Errorf("%s: got %d, want %d", c, got[c], ns)
				}
			}
		})
	}
}

// A checkpoint every 5 steps is amortized over all steps, and its fraction
// is of the total step time.
func TestAccumulatorAmortizesPeriodicCauses(t *testing.T) {
	a := New()
	if a.Estimates() != nil || a.MeanStepNS() != 0 {
		t.Fatal("estimates before any step")
	}
	for n := int64(1); n <= 20; n++ {
		by := map[correlate.Cause]int64{correlate.CauseCPU: ms}
		dur := 10 * ms
		if n%5 == 0 {
			by[correlate.CauseIOWrite] = 30 * ms
			dur += 30 * ms
		}
		a.Step(correlate.StepResult{Step: step(n, dur, by)})
	}
	es := a.Estimates()
	if len(es) != 2 || es[0].Cause != correlate.CauseIOWrite || es[1].Cause != correlate.CauseCPU {
		t.Fatalf("estimates %+v, want io.write then cpu", es)
	}
	w := es[0]
	if w.SavedNSPerStep != 6*ms || w.Steps != 4 || w.MaxNS != 30*ms || w.Fix != Fix(correlate.CauseIOWrite) {
		t.Errorf("io.write %+v, want 6 ms/step over 4 steps, max 30 ms", w)
	}
	// 120 ms saved of 20×10 + 4×30 = 320 ms.
	if math.Abs(w.SavedFraction-120.0/320) > 1e-9 {
		t.Errorf("io.write fraction %v, want %v", w.SavedFraction, 120.0/320)
	}
	if a.MeanStepNS() != 16*ms {
		t.Errorf("mean step %d, want 16 ms", a.MeanStepNS())
	}
	j := JSONMap(es)
	if j[correlate.CauseIOWrite].SavedNSPerStep != 6*ms || j[correlate.CauseCPU].Steps != 20 {
		t.Errorf("json %+v", j)
	}
}

// The stalls a step carries refine it; idle gaps are taken from the
// step's ByCause, never counted twice; a late stall (carried by no step)
// changes nothing.
func TestAccumulatorUsesStallsOfTheirStep(t *testing.T) {
	a := New()
	act := 0.25
	gaps := []correlate.Gap{
		{PID: 7, Step: 1, Kind: correlate.GapIdle, Breakdown: map[correlate.Cause]int64{correlate.CauseIORead: 10 * ms}},
		{PID: 7, Step: 1, Kind: correlate.GapStall, Breakdown: map[correlate.Cause]int64{correlate.CauseComm: 40 * ms},
			Evidence: correlate.Evidence{SMActivity: &act}},
	}
	for _, g := range gaps {
		a.Gap(g)
	}
	a.Gap(correlate.Gap{PID: 7, Step: 1, Kind: correlate.GapStall, Late: true,
		Breakdown: map[correlate.Cause]int64{correlate.CauseComm: 40 * ms}})
	a.Step(correlate.StepResult{Step: step(1, 100*ms, map[correlate.Cause]int64{correlate.CauseIORead: 10 * ms, correlate.CauseComm: 40 * ms}),
		GapList: gaps})
	got := map[correlate.Cause]int64{}
	for _, e := range a.Estimates() {
		got[e.Cause] = e.SavedNSPerStep
	}
	if got[correlate.CauseIORead] != 10*ms || got[correlate.CauseComm] != 30*ms {
		t.Errorf("saved %v, want io.read 10 ms, comm 30 ms", got)
	}
}
