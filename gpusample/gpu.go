// Package gpusample is gaptrace's view of the GPU itself, read through NVML
// (github.com/NVIDIA/go-nvml): when each device was busy, how busy its SMs
// were, and the hardware state that slows busy time down.
//
// Lifecycle: Open loads the NVML library, initialises it, enumerates the
// devices and looks up every optional entry point once; Run samples until
// its context ends (at most once per Source); Close shuts NVML down. Health,
// HWContext, DevicesForPID and Stats may be called at any time, from any
// goroutine, before, during and after Run.
//
// Invariants:
//   - No NVML function is called unless the loaded library exports it.
//     go-nvml binds symbols lazily, so calling an entry point an older
//     driver lacks would kill the whole process; Open records which
//     optional features the library has and every call site checks them.
//   - Windows are in Unix nanoseconds (NVML timestamps are CLOCK_REALTIME
//     microseconds). For each (device, source) the windows Run emits are
//     contiguous and never overlap: utilization samples are read
//     incrementally from the last timestamp seen, so none is counted twice,
//     and a sample lost to the driver's ring overflowing is counted in
//     Stats, never papered over with a wide window.
//   - GPM windows follow the counters' own refresh: the sampler measures the
//     refresh phase and period (about 100 ms on Hopper) and samples just
//     after each refresh, so every window is exactly one counter interval.
//     The refresh intervals its first calibration read (~400 ms, four
//     refreshes) become windows too once the phase is known, so the GPU is
//     covered from the first refresh after sampling began.
//     Its metrics are read through the loaded library's nvmlGpmMetricsGet
//     with a request kept in C memory (gpmcall.go): go-nvml copies its
//     19 KB request twice a call. A test's fake NVML goes through go-nvml.
//   - Without NVML (no library, no device, no permission) Open returns an
//     error wrapping ErrNoNVML, ErrNoDevice or ErrPermission with one clear
//     message; callers trace on host evidence alone and report Unavailable.
//
// Measured on an H200 (driver 580.159.04, TestHardwareGPU under a bf16
// matmul load): one utilization sample per 200 ms; a GetSamples call costs
// ~2 ms whatever it returns; GPM counters refresh every 100.1 ms (median of
// 30 spacings, 99.3–100.6 ms); a GpmSampleGet costs ~85 µs; between two
// reads of one refresh every GPM metric is 0 except DRAM bandwidth, which is
// NaN with NVML_SUCCESS (treated as unknown); at idle the PCIe metrics still
// move, so a refresh is visible even on an idle GPU.
package gpusample

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/event"
)

// Errors Open wraps; test them with errors.Is.
var (
	ErrNoNVML     = errors.New("nvml library not available")
	ErrNoDevice   = errors.New("no nvidia gpu available")
	ErrPermission = errors.New("no permission to use nvml")
)

// DefaultLibrary is the NVML library loaded when Config.LibPath and
// GAPTRACE_NVML_LIB are empty: the driver's, found through the loader path.
const DefaultLibrary = "libnvidia-ml.so.1"

// Config configures a Source. Zero values select the defaults.
type Config struct {
	// LibPath is the NVML library to load (--nvml-lib); empty: the
	// GAPTRACE_NVML_LIB environment variable, then DefaultLibrary.
	LibPath string
	// SampleInterval is how often utilization samples are read. Default
	// 500 ms. Measured on the H200 (driver 580): one sample per 200 ms, and
	// a GetSamples call costs ~2 ms (mean, max 4 ms) however many samples it
	// returns. The driver keeps a ring of many seconds, so reading every
	// 500 ms loses nothing, costs ~0.4% of a core, and delays a window by at
	// most 0.7 s; 200 ms would cost 1%.
	SampleInterval time.Duration
	// GPMInterval is the GPM sampling period before the refresh period is
	// measured (default 100 ms, the H200's counter refresh). The sampler
	// replaces it with the measured period once it has seen the counters
	// change; sampling faster only re-reads unchanged counters.
	GPMInterval time.Duration
	// HWInterval is how often clocks, throttle reasons, temperature, PCIe
	// link, ECC, persistence, memory and processes are read (default 1 s).
	HWInterval time.Duration
	Logger     *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.LibPath == "" {
		c.LibPath = os.Getenv("GAPTRACE_NVML_LIB")
	}
	if c.LibPath == "" {
		c.LibPath = DefaultLibrary
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = 500 * time.Millisecond
	}
	if c.GPMInterval <= 0 {
		c.GPMInterval = 100 * time.Millisecond
	}
	if c.HWInterval <= 0 {
		c.HWInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// DeviceInfo describes one device as NVML enumerated it.
type DeviceInfo struct {
	Index         int
	Name          string
	UUID          string
	GPMSupported  bool
	PCIeMaxGen    uint32 // 0 when unknown
	PCIeMaxWidth  uint32
	MaxSMClockMHz uint32
	MemTotalBytes uint64
	SlowdownTempC uint32 // temperature at which the GPU slows down; 0 unknown
}

// Stats counts what the source did; costs are wall time of the NVML calls.
type Stats struct {
	SampleCalls      uint64  // nvmlDeviceGetSamples calls
	Samples          uint64  // utilization samples read
	SamplesLost      uint64  // samples the driver dropped before they were read
	SampleCostMeanUS float64 // per GetSamples call
	SampleCostMaxUS  float64
	GPMSamples       uint64 // nvmlGpmSampleGet calls, calibration included
	// GPMMisses counts reads that found the counters unchanged right after
	// a busy window: the read came before the refresh (phase drift; the
	// phase is then re-measured) or the GPU went idle exactly then.
	GPMMisses     uint64
	GPMCostMeanUS float64
	GPMCostMaxUS  float64
	// GPMRefresh is the measured GPM counter refresh period (largest over
	// devices; 0 until measured). GPMAligned says whether every GPM
	// device's sampler is aligned to its refresh.
	GPMRefresh     time.Duration
	GPMAligned     bool
	Windows        uint64 // windows sent
	Errors         uint64 // NVML calls that failed unexpectedly
	ChangesDropped uint64 // change findings dropped because nobody read Changes
	Xids           uint64
}

// features are the optional NVML capabilities the loaded library exports.
type features struct {
	samples, name, uuid, gpm, clocks, eventReasons, throttleReasons bool
	temp, tempThreshold, pcie, ecc, eccErrors, persistence, mem     bool
	procs, events, driver                                           bool
}

// symbolGroups: a feature is present when, for every group, at least one
// symbol of the group is exported (go-nvml picks the newest version itself).
var featureSymbols = []struct {
	set    func(*features)
	groups [][]string
}{
	{func(f *features) { f.samples = true }, [][]string{{"nvmlDeviceGetSamples"}}},
	{func(f *features) { f.name = true }, [][]string{{"nvmlDeviceGetName"}}},
	{func(f *features) { f.uuid = true }, [][]string{{"nvmlDeviceGetUUID"}}},
	{func(f *features) { f.gpm = true }, [][]string{{"nvmlGpmQueryDeviceSupport"}, {"nvmlGpmSampleAlloc"},
		{"nvmlGpmSampleFree"}, {"nvmlGpmSampleGet"}, {"nvmlGpmMetricsGet"}}},
	{func(f *features) { f.clocks = true }, [][]string{{"nvmlDeviceGetClockInfo"}, {"nvmlDeviceGetMaxClockInfo"}}},
	{func(f *features) { f.eventReasons = true }, [][]string{{"nvmlDeviceGetCurrentClocksEventReasons"}}},
	{func(f *features) { f.throttleReasons = true }, [][]string{{"nvmlDeviceGetCurrentClocksThrottleReasons"}}},
	{func(f *features) { f.temp = true }, [][]string{{"nvmlDeviceGetTemperature"}}},
	{func(f *features) { f.tempThreshold = true }, [][]string{{"nvmlDeviceGetTemperatureThreshold"}}},
	{func(f *features) { f.pcie = true }, [][]string{{"nvmlDeviceGetCurrPcieLinkGeneration"}, {"nvmlDeviceGetCurrPcieLinkWidth"},
		{"nvmlDeviceGetMaxPcieLinkGeneration"}, {"nvmlDeviceGetMaxPcieLinkWidth"}}},
	{func(f *features) { f.ecc = true }, [][]string{{"nvmlDeviceGetEccMode"}}},
	{func(f *features) { f.eccErrors = true }, [][]string{{"nvmlDeviceGetTotalEccErrors"}}},
	{func(f *features) { f.persistence = true }, [][]string{{"nvmlDeviceGetPersistenceMode"}}},
	{func(f *features) { f.mem = true }, [][]string{{"nvmlDeviceGetMemoryInfo"}}},
	{func(f *features) { f.procs = true }, [][]string{{"nvmlDeviceGetComputeRunningProcesses_v3",
		"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"}}},
	{func(f *features) { f.events = true }, [][]string{{"nvmlEventSetCreate"}, {"nvmlEventSetFree"},
		{"nvmlDeviceRegisterEvents"}, {"nvmlDeviceGetSupportedEventTypes"}, {"nvmlEventSetWait_v2", "nvmlEventSetWait"}}},
	{func(f *features) { f.driver = true }, [][]string{{"nvmlSystemGetDriverVersion"}}},
}

// requiredSymbols must all be present (in one of their versions) for the
// source to work at all: init, enumeration and error strings.
var requiredSymbols = [][]string{
	{"nvmlInit_v2", "nvmlInit"}, {"nvmlShutdown"}, {"nvmlErrorString"},
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
	{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
}

// Source reads the GPU's own view from NVML. Create it with Open.
type Source struct {
	cfg      Config
	log      *slog.Logger
	lib      nvml.Interface
	have     features
	driver   string
	devs     []*device
	procRoot string // "/proc"; tests point it elsewhere
	// gpmDirect: nvmlGpmMetricsGet called without go-nvml's copies (the
	// library Open loaded); nil: through lib.
	gpmDirect *directGPM

	changes chan Finding
	ran     atomic.Bool
	running atomic.Bool
	closed  atomic.Bool

	tracedMu sync.Mutex
	traced   map[uint32]bool // traced pids and their NSpid aliases

	st statCounters
}

type statCounters struct {
	sampleCalls, samples, samplesLost, gpmSamples, gpmMisses atomic.Uint64
	windows, errors, changesDropped, xids                    atomic.Uint64
	sampleCostNS, sampleCostMaxNS, gpmCostNS, gpmMaxNS       atomic.Int64
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// Open loads NVML and enumerates the devices. The error wraps ErrNoNVML,
// ErrNoDevice or ErrPermission when NVML cannot be used; its message says
// why in one line.
func Open(cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	// Pin the library for the life of the process (RTLD_NODELETE): symbols
	// go-nvml has bound stay valid even if NVML is shut down and opened
	// again, which would otherwise unmap and possibly remap it elsewhere.
	pin := dl.New(cfg.LibPath, dl.RTLD_LAZY|dl.RTLD_GLOBAL|dl.RTLD_NODELETE)
	if err := pin.Open(); err != nil {
		return nil, fmt.Errorf("load %s: %w: %w", cfg.LibPath, err, ErrNoNVML)
	}
	s, err := open(nvml.New(nvml.WithLibraryPath(cfg.LibPath)), cfg)
	if err == nil {
		s.gpmDirect = newDirectGPM()
	}
	return s, err
}

func open(lib nvml.Interface, cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	s := &Source{cfg: cfg, log: cfg.Logger.With("component", "gpu"), lib: lib, procRoot: "/proc",
		changes: make(chan Finding, 256), traced: map[uint32]bool{}}

	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("load %s: %w", cfg.LibPath, ErrNoNVML)
	case nvml.ERROR_NO_PERMISSION:
		return nil, fmt.Errorf("nvml init: %s: %w", retString(ret), ErrPermission)
	case nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_GPU_NOT_FOUND:
		return nil, fmt.Errorf("nvml init: %s: %w", retString(ret), ErrNoDevice)
	default:
		return nil, fmt.Errorf("nvml init: %s: %w", retString(ret), ErrNoNVML)
	}
	ok := false
	defer func() {
		if !ok {
			// The open failed and says why; a failed shutdown of the
			// half-opened library adds nothing to it.
			_ = lib.Shutdown()
		}
	}()

	ext := lib.Extensions()
	has := func(group []string) bool {
		return slices.ContainsFunc(group, func(sym string) bool { return ext.LookupSymbol(sym) == nil })
	}
	for _, g := range requiredSymbols {
		if !has(g) {
			return nil, fmt.Errorf("%s lacks %s (driver too old?): %w", cfg.LibPath, g[0], ErrNoNVML)
		}
	}
	var missing []string
	for _, fs := range featureSymbols {
		all := true
		for _, g := range fs.groups {
			if !has(g) {
				all = false
				missing = append(missing, g[0])
			}
		}
		if all {
			fs.set(&s.have)
		}
	}
	if !s.have.samples {
		// The utilization samples are the point of this source.
		return nil, fmt.Errorf("%s lacks nvmlDeviceGetSamples: %w", cfg.LibPath, ErrNoNVML)
	}
	if len(missing) > 0 {
		s.log.Info("nvml library lacks optional entry points; their data is not collected", "missing", missing)
	}
	if s.have.driver {
		if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
			s.driver = v
		}
	}

	n, ret := lib.DeviceGetCount()
	switch {
	case ret == nvml.ERROR_NO_PERMISSION:
		return nil, fmt.Errorf("count devices: %s: %w", retString(ret), ErrPermission)
	case ret != nvml.SUCCESS:
		return nil, fmt.Errorf("count devices: %s: %w", retString(ret), ErrNoDevice)
	case n == 0:
		return nil, fmt.Errorf("nvml reports 0 devices: %w", ErrNoDevice)
	}
	var denied int
	for i := range n {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_NO_PERMISSION {
			denied++
			continue
		}
		if ret != nvml.SUCCESS {
			s.log.Warn("device unusable, skipped", "device", i, "err", retString(ret))
			continue
		}
		s.devs = append(s.devs, s.newDevice(i, h))
	}
	if len(s.devs) == 0 {
		if denied > 0 {
			return nil, fmt.Errorf("open %d devices: %w", denied, ErrPermission)
		}
		return nil, fmt.Errorf("no usable device among %d: %w", n, ErrNoDevice)
	}
	for _, d := range s.devs {
		s.log.Info("gpu", "device", d.info.Index, "name", d.info.Name, "uuid", d.info.UUID,
			"gpm", d.info.GPMSupported, "pcie_max", fmt.Sprintf("Gen%d x%d", d.info.PCIeMaxGen, d.info.PCIeMaxWidth),
			"driver", s.driver)
	}
	ok = true
	return s, nil
}

func retString(r nvml.Return) string {
	// Return.Error calls nvmlErrorString once a library is loaded (a
	// required symbol) and go-nvml's own table otherwise.
	return fmt.Sprintf("%s (%d)", r.Error(), int32(r))
}

// Devices lists the devices NVML enumerated, in index order.
func (s *Source) Devices() []DeviceInfo {
	out := make([]DeviceInfo, len(s.devs))
	for i, d := range s.devs {
		out[i] = d.info
	}
	return out
}

// Driver is the driver version NVML reports ("" when unknown).
func (s *Source) Driver() string { return s.driver }

func (s *Source) device(idx int) *device {
	for _, d := range s.devs {
		if d.info.Index == idx {
			return d
		}
	}
	return nil
}

// Run samples every device until ctx ends and sends its windows. It
// returns nil when ctx ends; it may be called once. The send blocks (with
// ctx) rather than drop: windows are few (≤ ~15/s per device) and each one
// carries idle time correlate must account for.
func (s *Source) Run(ctx context.Context, windows chan<- event.GPUWindow) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("gpu source: Run called twice")
	}
	if s.closed.Load() {
		return errors.New("gpu source: closed")
	}
	emit := func(w event.GPUWindow) bool {
		select {
		case windows <- w:
			s.st.windows.Add(1)
			return true
		case <-ctx.Done():
			return false
		}
	}
	s.running.Store(true)
	defer s.running.Store(false)
	var wg sync.WaitGroup
	for _, d := range s.devs {
		wg.Go(func() { s.utilLoop(ctx, d, emit) })
		if d.info.GPMSupported {
			wg.Go(func() { s.gpmLoop(ctx, d, emit) })
		}
		wg.Go(func() { s.hwLoop(ctx, d) })
	}
	if s.have.events {
		wg.Go(func() { s.eventLoop(ctx) })
	}
	wg.Wait()
	return nil
}

// Stats returns the counters so far.
func (s *Source) Stats() Stats {
	st := Stats{
		SampleCalls:     s.st.sampleCalls.Load(),
		Samples:         s.st.samples.Load(),
		SamplesLost:     s.st.samplesLost.Load(),
		SampleCostMaxUS: float64(s.st.sampleCostMaxNS.Load()) / 1e3,
		GPMSamples:      s.st.gpmSamples.Load(),
		GPMMisses:       s.st.gpmMisses.Load(),
		GPMCostMaxUS:    float64(s.st.gpmMaxNS.Load()) / 1e3,
		Windows:         s.st.windows.Load(),
		Errors:          s.st.errors.Load(),
		ChangesDropped:  s.st.changesDropped.Load(),
		Xids:            s.st.xids.Load(),
	}
	if st.SampleCalls > 0 {
		st.SampleCostMeanUS = float64(s.st.sampleCostNS.Load()) / 1e3 / float64(st.SampleCalls)
	}
	if st.GPMSamples > 0 {
		st.GPMCostMeanUS = float64(s.st.gpmCostNS.Load()) / 1e3 / float64(st.GPMSamples)
	}
	anyGPM := false
	st.GPMAligned = true
	for _, d := range s.devs {
		if !d.info.GPMSupported {
			continue
		}
		anyGPM = true
		p, aligned := d.gpmState()
		st.GPMRefresh = max(st.GPMRefresh, p)
		st.GPMAligned = st.GPMAligned && aligned
	}
	st.GPMAligned = st.GPMAligned && anyGPM
	return st
}

// Close shuts NVML down. Call it after Run has returned.
func (s *Source) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", retString(ret))
	}
	return nil
}

// countErr counts an unexpected NVML failure and logs the first of each
// kind per device, so a failing call polled every 100 ms cannot flood logs.
func (s *Source) countErr(d *device, op string, ret nvml.Return) {
	s.st.errors.Add(1)
	if d.firstErr(op) {
		s.log.Warn("nvml call failed; further failures of this call are only counted",
			"device", d.info.Index, "call", op, "err", retString(ret))
	}
}
