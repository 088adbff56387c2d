package stepclock

import "testing"

func TestFrameworkClockAccumulation(t *testing.T) {
	// Four micro-batches an iteration: the markers come once an
	// iteration, with other regions and a profiler step between.
	var c FrameworkClock
	ends := 0
	names := []string{"## forward ##", "ProfilerStep#1", "Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad"}
	for it := 0; it < 10; it++ {
		for _, n := range names {
			var end bool
			c, end = c.Take(Marker{TID: 7, Name: n, T: int64(it)})
			if end {
				ends++
			}
		}
	}
	// The first profiler step started the clock (one step), the first
	// optimizer step took it over; every later optimizer step ends one.
	if ends != 11 || c.Class != MarkerOptimizerStep || c.Name != "Optimizer.step#SGD.step" {
		t.Fatalf("ends %d clock %+v", ends, c)
	}
}

func TestFrameworkClockThreadsAndOptimizers(t *testing.T) {
	c, end := FrameworkClock{}.Take(Marker{TID: 1, Name: "Optimizer.step#Adam.step"})
	if !end || !c.On() {
		t.Fatalf("first optimizer step: %v %+v", end, c)
	}
	for _, m := range []Marker{
		{TID: 2, Name: "Optimizer.step#Adam.step"}, // another thread
		{TID: 1, Name: "Optimizer.step#SGD.step"},  // another optimizer
		{TID: 1, Name: "ProfilerStep#4"},           // weaker marker
		{TID: 1, Name: "Optimizer.step"},           // not the prefix
	} {
		if _, end := c.Take(m); end {
			t.Errorf("%+v ended a step", m)
		}
	}
	p, _ := FrameworkClock{}.Take(Marker{TID: 3, Name: "ProfilerStep#0"})
	if p.Name != "ProfilerStep#N" {
		t.Errorf("profiler clock named %q", p.Name)
	}
	if _, end := p.Take(Marker{TID: 3, Name: "ProfilerStep#1"}); !end {
		t.Error("the next profiler step ended no step")
	}
}
