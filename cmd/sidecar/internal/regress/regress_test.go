package regress

import (
	"math"
	"math/rand/v2"
	"testing"
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
		iv := welch(a, b)
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
	base := Run{Steps: 50, ByCause: map[string][]float64{"io.read": normal(r, 50, 10e6, 1e6), "comm": normal(r, 50, 5e6, 1e6)}}
	cur := Run{Steps: 60, ByCause: map[string][]float64{"io.read": normal(r, 60, 20e6, 1e6), "comm": normal(r, 60, 5e6, 1e6),
		"cpu": normal(r, 60, 3e6, 0.5e6)}}
	for _, run := range []*Run{&base, &cur} {
		run.ByCause[Total] = make([]float64, run.Steps)
		for c, xs := range run.ByCause {
			if c != Total {
				for i, x := range xs {
					run.ByCause[Total][i] += x
				}
			}
		}
	}
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
