package regress

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// Student's t 97.5% quantiles from tables.
func TestTQuantile(t *testing.T) {
	for df, want := range map[float64]float64{3: 3.182, 5: 2.571, 10: 2.228, 30: 2.042, 100: 1.984, math.Inf(1): 1.960} {
		if got := tQuantile975(df); math.Abs(got-want)/want > 0.01 {
			t.Errorf("t(0.975, %v) = %.4f, want %.3f", df, got, want)
		}
	}
}

func normal(r *rand.Rand, n int, mean, sd float64) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = math.Max(0, mean+sd*r.NormFloat64())
	}
	return xs
}

// The 95% interval of a difference of means holds the true difference in
// about 95% of repeated experiments, unequal variances and sizes included.
func TestWelchCoverage(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const trials = 2000
	covered := 0
	for range trials {
		a := normal(r, 12, 10e6, 1e6)
		b := normal(r, 40, 13e6, 4e6)
		iv := welch(momentsOf(a), momentsOf(b))
		if iv.Lo <= 3e6 && 3e6 <= iv.Hi {
			covered++
		}
	}
	if frac := float64(covered) / trials; frac < 0.93 || frac > 0.97 {
		t.Errorf("coverage %.3f, want about 0.95", frac)
	}
}

func TestCompareAndGrew(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	run := func(n int, by map[string][]float64) Run {
		r := Run{Steps: n, ByCause: map[string]Moments{}}
		total := make([]float64, n)
		for c, xs := range by {
			r.ByCause[c] = momentsOf(xs)
			for i, x := range xs {
				total[i] += x
			}
		}
		r.ByCause[Total] = momentsOf(total)
		return r
	}
	base := run(50, map[string][]float64{"io.read": normal(r, 50, 10e6, 1e6), "comm": normal(r, 50, 5e6, 1e6)})
	cur := run(60, map[string][]float64{"io.read": normal(r, 60, 20e6, 1e6), "comm": normal(r, 60, 5e6, 1e6),
		"cpu": normal(r, 60, 3e6, 0.5e6)})
	rows := Compare(base, cur)
	by := map[string]Row{}
	for _, row := range rows {
		by[row.Cause] = row
	}
	if rows[len(rows)-1].Cause != Total || len(rows) != 4 {
		t.Fatalf("rows %+v: want comm, cpu, io.read, total", rows)
	}
	io := by["io.read"]
	if math.Abs(io.Base.Mean-10) > 0.5 || math.Abs(io.New.Mean-20) > 0.5 || io.Change.Lo < 9 || io.Change.Hi > 11 {
		t.Errorf("io.read %+v: want about 10 → 20 ms/step", io)
	}
	if !io.Grew(50, 0.1) || io.Grew(120, 0.1) {
		t.Errorf("io.read grew ~100%%: Grew(50) %v, Grew(120) %v", io.Grew(50, 0.1), io.Grew(120, 0.1))
	}
	if by["comm"].Grew(5, 0.1) {
		t.Errorf("comm did not change: %+v", by["comm"])
	}
	if cpu := by["cpu"]; !math.IsInf(cpu.ChangePct, 1) || !cpu.Grew(1000, 0.1) || cpu.Grew(1000, 5) {
		t.Errorf("cpu (absent before, 3 ms/step now): %+v", cpu)
	}
}

// The summary's running sums give the moments the samples do.
func TestStepIdleMoments(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var s StepIdle
	var reads, totals []float64
	for n := range 200 {
		read, comm := int64(20e6+4e6*r.NormFloat64()), int64(0)
		if n%4 == 0 {
			comm = 7e6
		}
		s.Step(correlate.StepResult{Step: correlate.Step{Number: int64(n), ByCause: map[correlate.Cause]int64{correlate.CauseIORead: read, correlate.CauseComm: comm}}})
		reads, totals = append(reads, float64(read)), append(totals, float64(read+comm))
	}
	s.Step(correlate.StepResult{Step: correlate.Step{Window: true, ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 1e12}}})
	got := s.Summary()
	for c, want := range map[string]Moments{"io.read": momentsOf(reads), Total: momentsOf(totals)} {
		g := got[c]
		if g.Steps != 200 || math.Abs(g.MeanNS-want.MeanNS) > 1 || math.Abs(g.SDNS-want.SDNS)/want.SDNS > 1e-6 {
			t.Errorf("%s: %+v, want %+v", c, g, want)
		}
	}
	if c := got["comm"]; c.MeanNS != 7e6/4 {
		t.Errorf("comm every 4th step: %+v", c)
	}
}
