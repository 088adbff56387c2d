package gpusample

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestDirectGPMMatchesGoNVML: the metrics read without go-nvml's copies
// are go-nvml's, metric by metric, on a pair of samples that spans a
// refresh of a busy simulated GPU.
func TestDirectGPMMatchesGoNVML(t *testing.T) {
	w := startWriter(t)
	testPattern(monoNow(), 40).write(w)
	s := openSim(t, Config{})
	if s.gpmDirect == nil {
		t.Fatal("Open found no nvmlGpmMetricsGet in the loaded library: GPM reads go through go-nvml's copies")
	}
	h := s.devs[0].h
	var smp [2]nvml.GpmSample
	for i := range smp {
		var ret nvml.Return
		if smp[i], ret = s.lib.GpmSampleAlloc(); ret != nvml.SUCCESS {
			t.Fatalf("GpmSampleAlloc: %v", ret)
		}
		defer func() { _ = smp[i].Free() }()
	}
	if ret := smp[0].Get(h); ret != nvml.SUCCESS {
		t.Fatalf("GpmSampleGet: %v", ret)
	}
	time.Sleep(simGPMRefresh + 20*time.Millisecond) // at least one refresh between
	if ret := smp[1].Get(h); ret != nvml.SUCCESS {
		t.Fatalf("GpmSampleGet: %v", ret)
	}
	direct := make([]float64, len(gpmMetricIDs))
	ret, done := s.gpmDirect.metrics(smp[0], smp[1], gpmMetricIDs, direct)
	if !done || ret != nvml.SUCCESS {
		t.Fatalf("direct metrics: done=%v ret=%v", done, ret)
	}
	m := nvml.GpmMetricsGetType{NumMetrics: uint32(len(gpmMetricIDs)), Sample1: smp[0], Sample2: smp[1]}
	for i, id := range gpmMetricIDs {
		m.Metrics[i].MetricId = uint32(id)
	}
	if ret := s.lib.GpmMetricsGet(&m); ret != nvml.SUCCESS {
		t.Fatalf("go-nvml GpmMetricsGet: %v", ret)
	}
	busy := false
	for i, id := range gpmMetricIDs {
		want := m.Metrics[i].Value
		if m.Metrics[i].NvmlReturn != uint32(nvml.SUCCESS) {
			want = -1
		}
		if direct[i] != want {
			t.Errorf("metric %d: direct %v, go-nvml %v", id, direct[i], want)
		}
		busy = busy || (id == nvml.GPM_METRIC_SM_UTIL && want > 0)
	}
	if !busy {
		t.Errorf("SM activity 0 across a refresh of a busy GPU: the pair compared nothing (%v)", direct)
	}
	// A sample that is not go-nvml's goes back to nvml.Interface.
	if _, done := s.gpmDirect.metrics(fakeSample{}, smp[1], gpmMetricIDs, direct); done {
		t.Error("direct call took a sample of another implementation")
	}
}

type fakeSample struct{ nvml.GpmSample }

func BenchmarkGPMMetrics(b *testing.B) {
	s := openSim(b, Config{})
	g := &gpmSampler{s: s, d: s.devs[0]}
	a, _ := s.lib.GpmSampleAlloc()
	c, _ := s.lib.GpmSampleAlloc()
	if a.Get(s.devs[0].h) != nvml.SUCCESS || c.Get(s.devs[0].h) != nvml.SUCCESS {
		b.Fatal("GpmSampleGet failed")
	}
	for _, direct := range []bool{false, true} {
		name := "go-nvml"
		if direct {
			name = "direct"
		}
		b.Run(name, func(b *testing.B) {
			keep := s.gpmDirect
			if !direct {
				s.gpmDirect = nil
			}
			defer func() { s.gpmDirect = keep }()
			b.ReportAllocs()
			for b.Loop() {
				g.metrics(a, c, gpmMetricIDs)
			}
		})
	}
}
