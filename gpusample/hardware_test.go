package gpusample

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/event"
)

// hwChildEnv marks the child process in which TestHardwareGPU talks to the
// real driver: the rest of this test binary has bound go-nvml's symbols to
// the simulated library, and a process can only bind them once.
const hwChildEnv = "GAPTRACE_GPU_HW_CHILD"

// TestHardwareGPU validates the source on a real GPU (the H200 of the
// project): the GPM refresh period and sample cost, alignment of the
// sampler to the refresh, and contiguous windows from both sources. Run it
// while a CUDA workload keeps the GPU busy (the refresh is only visible
// when counters move):
//
//	go test -count=1 -run TestHardwareGPU -v ./gpusample
//
// It skips where NVML or a GPM-capable device is absent.
func TestHardwareGPU(t *testing.T) {
	if os.Getenv(hwChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHardwareGPU$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), hwChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("child output:\n%s", out)
		if err == nil && strings.Contains(string(out), "--- SKIP") {
			t.Skip("skipped in the child; its reason is in the output above")
		}
		if err != nil {
			t.Fatalf("hardware child failed: %v", err)
		}
		return
	}

	s, err := Open(Config{})
	if err != nil {
		t.Skipf("no usable NVML: %v", err)
	}
	defer s.Close()
	t.Logf("driver %s, devices %+v", s.Driver(), s.Devices())
	idx := slices.IndexFunc(s.devs, func(d *device) bool { return d.info.GPMSupported })
	if idx < 0 {
		t.Skip("no GPM-capable device")
	}
	d := s.devs[idx]

	measureGPMRefresh(t, s, d)
	checkSourceOnHardware(t, s, d)
}

// measureGPMRefresh measures the GPM refresh period raw: it reads every
// 1 ms for 3 s and expects ~100 ms between changes, as on Hopper.
func measureGPMRefresh(t *testing.T, s *Source, d *device) {
	t.Helper()
	g := &gpmSampler{s: s, d: d, period: 100 * time.Millisecond}
	a, ret := s.lib.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		t.Fatalf("GpmSampleAlloc: %v", ret)
	}
	defer func() { _ = a.Free() }()
	b, ret := s.lib.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		t.Fatalf("GpmSampleAlloc: %v", ret)
	}
	defer func() { _ = b.Free() }()
	tA, ok := g.get(a)
	if !ok {
		t.Fatal("GpmSampleGet failed")
	}
	var changes []int64
	var unchanged, firstVals []float64
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		time.Sleep(time.Millisecond)
		tB, ok := g.get(b)
		if !ok {
			t.Fatal("GpmSampleGet failed")
		}
		vals, ok := g.metrics(a, b, gpmMetricIDs)
		if !ok {
			t.Fatal("GpmMetricsGet failed")
		}
		if changed(vals) {
			changes = append(changes, (tA+tB)/2)
			if firstVals == nil {
				firstVals = vals
			}
		} else if unchanged == nil {
			unchanged = vals
		}
		a, b, tA = b, a, tB
	}
	st := s.Stats()
	t.Logf("GpmSampleGet cost: mean %.1f µs, max %.1f µs over %d calls", st.GPMCostMeanUS, st.GPMCostMaxUS, st.GPMSamples)
	t.Logf("metrics of a pair spanning a refresh: %v; of a pair without one: %v", firstVals, unchanged)
	if len(changes) < 5 {
		t.Skipf("only %d GPM refreshes seen in 3 s: the GPU is idle; run a CUDA load and repeat", len(changes))
	}
	var diffs []time.Duration
	for i := 1; i < len(changes); i++ {
		diffs = append(diffs, time.Duration(changes[i]-changes[i-1]))
	}
	slices.Sort(diffs)
	med := diffs[len(diffs)/2]
	t.Logf("refresh spacing: min %v median %v max %v over %d refreshes", diffs[0], med, diffs[len(diffs)-1], len(changes))
	if med < 80*time.Millisecond || med > 130*time.Millisecond {
		t.Errorf("median GPM refresh spacing %v, expected ~100 ms on Hopper", med)
	}
}

// checkSourceOnHardware runs the source itself and checks its windows:
// contiguous, GPM aligned to the refresh, no unchanged reads under load.
func checkSourceOnHardware(t *testing.T, s *Source, d *device) {
	t.Helper()
	// 5 s or GAPTRACE_HW_SECONDS (long enough to see the phase
	// re-measured: > 40 s).
	dur := 5 * time.Second
	if v, err := strconv.Atoi(os.Getenv("GAPTRACE_HW_SECONDS")); err == nil && v > 0 {
		dur = time.Duration(v) * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	ch := make(chan event.GPUWindow, 1024)
	go func() { _ = s.Run(ctx, ch); close(ch) }()
	var nv, gp []event.GPUWindow
	for w := range ch {
		if w.Device != d.info.Index {
			continue
		}
		if w.Source == event.SourceGPM {
			gp = append(gp, w)
		} else {
			nv = append(nv, w)
		}
	}
	st := s.Stats()
	t.Logf("stats after 5 s: %+v", st)
	if !st.GPMAligned {
		t.Errorf("GPM sampler not aligned to the refresh under load")
	}
	for _, seq := range [][]event.GPUWindow{nv, gp} {
		for i := 1; i < len(seq); i++ {
			if seq[i].Start != seq[i-1].End {
				t.Errorf("%s windows %d/%d not contiguous", seq[i].Source, i-1, i)
			}
		}
	}
	var nvLen []time.Duration
	for _, w := range nv {
		nvLen = append(nvLen, time.Duration(w.End-w.Start))
	}
	slices.Sort(nvLen)
	if len(nvLen) > 0 {
		t.Logf("utilization sample period: median %v over %d samples", nvLen[len(nvLen)/2], len(nvLen))
	}
	if want := int(dur / (100 * time.Millisecond)); len(gp) < want*6/10 {
		t.Errorf("%d GPM windows in %v, want ~%d", len(gp), dur, want)
	}
	// Aligned reads never see unchanged counters while the GPU is busy: a
	// GPM window with no SM activity inside a busy utilization window
	// means a read came before the refresh.
	var gpLen []time.Duration
	zeroUnderLoad := 0
	for _, w := range gp {
		gpLen = append(gpLen, time.Duration(w.End-w.Start))
		for _, u := range nv {
			if u.Start <= w.Start && w.End <= u.End && u.IdleFraction < 0.2 && w.SMActivity < 0.01 {
				zeroUnderLoad++
			}
		}
	}
	slices.Sort(gpLen)
	if len(gpLen) > 0 {
		t.Logf("GPM window length: min %v median %v max %v over %d windows; %d without SM activity under load",
			gpLen[0], gpLen[len(gpLen)/2], gpLen[len(gpLen)-1], len(gpLen), zeroUnderLoad)
	}
	if zeroUnderLoad > len(gp)/50 {
		t.Errorf("%d of %d GPM windows show no SM activity while utilization says busy: reads not aligned to the refresh",
			zeroUnderLoad, len(gp))
	}
	for _, f := range s.Health() {
		t.Logf("health: dev %d %-12s %-4s %s", f.Device, f.Check, f.Level, f.Detail)
	}
}
