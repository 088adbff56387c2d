package gpusample

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gaptrace/gaptrace/event"
)

// fakeGPU is a healthy Hopper GPU behind go-nvml's mock. A mock method left
// nil panics when called, which is how the tests prove an entry point the
// library lacks is never called.
type fakeGPU struct {
	lib       *mock.Interface
	dev       *mock.Device
	absent    map[string]bool
	shutdowns atomic.Int32
	pids      []uint32
}

func newFakeGPU(absent ...string) *fakeGPU {
	f := &fakeGPU{absent: map[string]bool{}}
	for _, a := range absent {
		f.absent[a] = true
	}
	f.dev = &mock.Device{
		GetNameFunc: func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS },
		GetUUIDFunc: func() (string, nvml.Return) { return "GPU-test", nvml.SUCCESS },
		GpmQueryDeviceSupportFunc: func() (nvml.GpmSupport, nvml.Return) {
			return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS
		},
		GetMaxPcieLinkGenerationFunc: func() (int, nvml.Return) { return 5, nvml.SUCCESS },
		GetMaxPcieLinkWidthFunc:      func() (int, nvml.Return) { return 16, nvml.SUCCESS },
		GetCurrPcieLinkGenerationFunc: func() (int, nvml.Return) {
			return 5, nvml.SUCCESS
		},
		GetCurrPcieLinkWidthFunc: func() (int, nvml.Return) { return 16, nvml.SUCCESS },
		GetMaxClockInfoFunc:      func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS },
		GetClockInfoFunc:         func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 141 << 30, Used: 1 << 30}, nvml.SUCCESS
		},
		GetTemperatureThresholdFunc: func(nvml.TemperatureThresholds) (uint32, nvml.Return) { return 87, nvml.SUCCESS },
		GetTemperatureFunc:          func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 40, nvml.SUCCESS },
		GetCurrentClocksEventReasonsFunc: func() (uint64, nvml.Return) {
			return 0, nvml.SUCCESS
		},
		GetEccModeFunc: func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
			return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
		},
		GetTotalEccErrorsFunc: func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.SUCCESS
		},
		GetPersistenceModeFunc: func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			var out []nvml.ProcessInfo
			for _, p := range f.pids {
				out = append(out, nvml.ProcessInfo{Pid: p})
			}
			return out, nvml.SUCCESS
		},
		GetSamplesFunc: func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			return nvml.VALUE_TYPE_UNSIGNED_INT, nil, nvml.ERROR_NOT_FOUND
		},
	}
	ext := &mock.ExtendedInterface{LookupSymbolFunc: func(sym string) error {
		if f.absent[sym] {
			return fmt.Errorf("undefined symbol: %s", sym)
		}
		return nil
	}}
	f.lib = &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { f.shutdowns.Add(1); return nvml.SUCCESS },
		ExtensionsFunc:             func() nvml.ExtendedInterface { return ext },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "580.95.05", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return f.dev, nvml.SUCCESS },
	}
	return f
}

func quietCfg() Config {
	return Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		SampleInterval: 5 * time.Millisecond, HWInterval: 5 * time.Millisecond, GPMInterval: 10 * time.Millisecond}
}

func TestMockOpenErrors(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(*fakeGPU)
		absent    []string
		want      error
		shutdowns int32
	}{
		{name: "library not found", want: ErrNoNVML,
			setup: func(f *fakeGPU) { f.lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND } }},
		{name: "init no permission", want: ErrPermission,
			setup: func(f *fakeGPU) { f.lib.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION } }},
		{name: "driver not loaded", want: ErrNoDevice,
			setup: func(f *fakeGPU) { f.lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED } }},
		{name: "no device", want: ErrNoDevice, shutdowns: 1,
			setup: func(f *fakeGPU) { f.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS } }},
		{name: "count no permission", want: ErrPermission, shutdowns: 1,
			setup: func(f *fakeGPU) {
				f.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NO_PERMISSION }
			}},
		{name: "device no permission", want: ErrPermission, shutdowns: 1,
			setup: func(f *fakeGPU) {
				f.lib.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_NO_PERMISSION }
			}},
		{name: "no samples entry point", want: ErrNoNVML, shutdowns: 1, absent: []string{"nvmlDeviceGetSamples"}},
		{name: "no device count entry point", want: ErrNoNVML, shutdowns: 1,
			absent: []string{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeGPU(tc.absent...)
			if tc.setup != nil {
				tc.setup(f)
			}
			s, err := open(f.lib, quietCfg())
			if !errors.Is(err, tc.want) || s != nil {
				t.Fatalf("open = %v, %v; want %v", s, err, tc.want)
			}
			if got := f.shutdowns.Load(); got != tc.shutdowns {
				t.Errorf("Shutdown called %d times, want %d", got, tc.shutdowns)
			}
			if f := Unavailable(err); f.Level != WARN || f.Fix == "" || f.Device != -1 {
				t.Errorf("Unavailable(%v) = %+v", err, f)
			}
		})
	}
}

// runFor runs s for d and returns the windows it sent.
func runFor(t *testing.T, s *Source, d time.Duration) []event.GPUWindow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ch := make(chan event.GPUWindow, 1024)
	if err := s.Run(ctx, ch); err != nil {
		t.Fatal(err)
	}
	close(ch)
	var out []event.GPUWindow
	for w := range ch {
		out = append(out, w)
	}
	return out
}

func TestMockGPMNotSupported(t *testing.T) {
	f := newFakeGPU("nvmlEventSetCreate")
	f.dev.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) {
		return nvml.GpmSupport{}, nvml.ERROR_NOT_SUPPORTED
	}
	// GpmSampleAllocFunc stays nil: calling it would panic.
	s, err := open(f.lib, quietCfg())
	if err != nil {
		t.Fatal(err)
	}
	if s.Devices()[0].GPMSupported {
		t.Fatal("GPM reported supported")
	}
	runFor(t, s, 50*time.Millisecond)
	if st := s.Stats(); st.GPMSamples != 0 || st.GPMAligned {
		t.Errorf("stats: %+v", st)
	}
}

func TestMockAbsentEntryPoints(t *testing.T) {
	// An older driver: no GPM, no clock *event* reasons (only the older
	// throttle reasons), no PCIe link queries, no event sets.
	f := newFakeGPU("nvmlGpmSampleGet", "nvmlDeviceGetCurrentClocksEventReasons",
		"nvmlDeviceGetCurrPcieLinkGeneration", "nvmlEventSetWait_v2", "nvmlEventSetWait")
	f.dev.GpmQueryDeviceSupportFunc = nil
	f.dev.GetCurrentClocksEventReasonsFunc = nil
	f.dev.GetCurrPcieLinkGenerationFunc = nil
	f.dev.GetCurrPcieLinkWidthFunc = nil
	f.dev.GetMaxPcieLinkGenerationFunc = nil
	f.dev.GetMaxPcieLinkWidthFunc = nil
	f.dev.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) {
		return nvml.ClocksEventReasonSwPowerCap, nvml.SUCCESS
	}
	s, err := open(f.lib, quietCfg())
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Devices()[0]; d.GPMSupported || d.PCIeMaxGen != 0 {
		t.Fatalf("device: %+v", d)
	}
	runFor(t, s, 50*time.Millisecond)
	fs := s.Health()
	if th, ok := findCheck(fs, CheckThrottle); !ok || th.Level != WARN {
		t.Errorf("throttle through the older entry point: %+v", th)
	}
	if _, ok := findCheck(fs, CheckPCIe); ok {
		t.Error("PCIe finding without the PCIe entry points")
	}
	if _, ok := findCheck(fs, CheckXid); ok {
		t.Error("Xid finding without event sets")
	}
}

func TestMockSampleErrors(t *testing.T) {
	f := newFakeGPU("nvmlEventSetCreate")
	f.dev.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{}, nvml.SUCCESS }
	var calls atomic.Int32
	f.dev.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
		calls.Add(1)
		return 0, nil, nvml.ERROR_GPU_IS_LOST
	}
	s, err := open(f.lib, quietCfg())
	if err != nil {
		t.Fatal(err)
	}
	ws := runFor(t, s, 60*time.Millisecond)
	st := s.Stats()
	if len(ws) != 0 || st.Errors == 0 || uint64(calls.Load()) != st.SampleCalls {
		t.Errorf("windows %d, stats %+v, calls %d", len(ws), st, calls.Load())
	}

	// NOT_FOUND only means "nothing new": not an error.
	f2 := newFakeGPU("nvmlEventSetCreate")
	f2.dev.GpmQueryDeviceSupportFunc = f.dev.GpmQueryDeviceSupportFunc
	s2, err := open(f2.lib, quietCfg())
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, s2, 30*time.Millisecond)
	if st := s2.Stats(); st.Errors != 0 || st.SampleCalls == 0 {
		t.Errorf("NOT_FOUND counted as an error: %+v", st)
	}
}

func sample(ts uint64, pct uint32) nvml.Sample {
	var s nvml.Sample
	s.TimeStamp = ts
	binary.NativeEndian.PutUint32(s.SampleValue[:4], pct)
	return s
}

func TestUtilReaderIncremental(t *testing.T) {
	r := &utilReader{dev: 0}
	// First call: history; the newest sample anchors the sequence.
	wins, lost := r.feed(nvml.VALUE_TYPE_UNSIGNED_INT, []nvml.Sample{sample(1000, 50), sample(1167, 20)})
	if len(wins) != 1 || lost != 0 {
		t.Fatalf("first feed: %v lost %d", wins, lost)
	}
	// Out of order, with a duplicate of an already-read sample.
	wins, lost = r.feed(nvml.VALUE_TYPE_UNSIGNED_INT, []nvml.Sample{sample(1501, 0), sample(1167, 20), sample(1334, 100)})
	if len(wins) != 2 || lost != 0 {
		t.Fatalf("second feed: %+v lost %d", wins, lost)
	}
	if wins[0].Start != 1167_000 || wins[0].End != 1334_000 || wins[0].IdleFraction != 0 ||
		wins[1].Start != 1334_000 || wins[1].End != 1501_000 || wins[1].IdleFraction != 1 {
		t.Errorf("windows: %+v", wins)
	}
	// Nothing new: nothing out.
	if wins, _ := r.feed(nvml.VALUE_TYPE_UNSIGNED_INT, []nvml.Sample{sample(1501, 0)}); len(wins) != 0 {
		t.Errorf("re-read sample produced %v", wins)
	}
	// Two samples lost by the driver: counted, window limited to one period.
	wins, lost = r.feed(nvml.VALUE_TYPE_UNSIGNED_INT, []nvml.Sample{sample(2002, 40)})
	if lost != 2 || len(wins) != 1 || wins[0].Start != 1835_000 || math.Abs(wins[0].IdleFraction-0.6) > 1e-9 {
		t.Errorf("after loss: %+v lost %d", wins, lost)
	}
	// Double-typed samples decode too.
	var d nvml.Sample
	d.TimeStamp = 2169
	binary.NativeEndian.PutUint64(d.SampleValue[:], math.Float64bits(25.0))
	wins, _ = r.feed(nvml.VALUE_TYPE_DOUBLE, []nvml.Sample{d})
	if len(wins) != 1 || wins[0].Start != 2002_000 || math.Abs(wins[0].IdleFraction-0.75) > 1e-9 {
		t.Errorf("double sample: %+v", wins)
	}
}

func TestDevicesForPIDThroughNSpid(t *testing.T) {
	f := newFakeGPU()
	// The trainer is pid 4242 here and pid 7 in its container; the driver
	// reports the container's id.
	f.pids = []uint32{7, 9000}
	s, err := open(f.lib, quietCfg())
	if err != nil {
		t.Fatal(err)
	}
	s.procRoot = t.TempDir()
	dir := filepath.Join(s.procRoot, "4242")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := "Name:\tpython\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t7\n"
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := s.DevicesForPID(4242); !slices.Equal(got, []int{0}) {
		t.Fatalf("DevicesForPID(4242) = %v, want [0]", got)
	}
	if got := s.DevicesForPID(5555); len(got) != 0 {
		t.Fatalf("DevicesForPID(5555) = %v, want none", got)
	}
	// 9000 is neither traced pid nor alias: it shares the GPU.
	if p, _ := findCheck(s.Health(), CheckProcesses); p.Level != WARN || !slices.Contains([]string{"[9000]"}, p.state) {
		t.Errorf("processes finding: %+v", p)
	}
}

func TestHWContextAggregation(t *testing.T) {
	f := newFakeGPU()
	s, err := open(f.lib, quietCfg())
	if err != nil {
		t.Fatal(err)
	}
	d := s.devs[0]
	s.SetTraced([]int{100})
	d.addSnapshot(hwSnapshot{t: 50, smClock: 1980, pcieGen: 5, pcieWidth: 16, tempC: 40, pids: []uint32{100}})
	d.addSnapshot(hwSnapshot{t: 150, smClock: 1400, throttle: nvml.ClocksEventReasonSwPowerCap, pcieGen: 5, pcieWidth: 8, tempC: 70, pids: []uint32{100, 200}})
	d.addSnapshot(hwSnapshot{t: 400, smClock: 1000, throttle: 0x40, pids: []uint32{300}}) // after the range
	d.addGPMWindow(gpmWindow{start: 0, end: 100, sm: 0.2, occupancy: -1, tensor: 0.1, dram: -1, pcieTx: -1, pcieRx: -1, nvlTx: -1, nvlRx: -1})
	d.addGPMWindow(gpmWindow{start: 100, end: 200, sm: 0.8, occupancy: -1, tensor: 0.4, dram: -1, pcieTx: -1, pcieRx: -1, nvlTx: -1, nvlRx: -1})
	d.addGPMWindow(gpmWindow{start: 200, end: 300, sm: 0.5, occupancy: -1, tensor: 0.2, dram: -1, pcieTx: -1, pcieRx: -1, nvlTx: -1, nvlRx: -1})
	d.addXid(xidEvent{t: 120, code: 79})
	d.addXid(xidEvent{t: 300, code: 48})

	hc := s.HWContext(0, 75, 250)
	// SM: (0.2*25 + 0.8*100 + 0.5*50) / 175
	wantSM := (0.2*25 + 0.8*100 + 0.5*50) / 175
	if math.Abs(hc.SMActivity-wantSM) > 1e-9 || hc.SMOccupancy != -1 {
		t.Errorf("SM activity %v (want %v), occupancy %v", hc.SMActivity, wantSM, hc.SMOccupancy)
	}
	if hc.SMClockMHz != 1400 || hc.PCIeWidth != 8 || hc.TemperatureC != 70 ||
		!slices.Equal(hc.ThrottleReasons, []string{"sw_power_cap"}) ||
		!slices.Equal(hc.OtherProcesses, []uint32{200}) || !slices.Equal(hc.XidErrors, []uint64{79}) {
		t.Errorf("context: %+v", hc)
	}
	if s.HWContext(7, 0, 1) != nil {
		t.Error("context for an unknown device")
	}
}
