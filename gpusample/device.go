package gpusample

import (
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/event"
)

// History bounds: at the default periods these keep the last ~20–60
// minutes, far more than a step; older state is dropped oldest first.
const (
	maxSnapshots  = 4096
	maxGPMWindows = 32768
	maxXids       = 1024
)

// device is one GPU's handle, identity and recent history.
type device struct {
	info    DeviceInfo
	h       nvml.Device
	errSeen sync.Map // NVML call name -> struct{}: first failure logged

	mu         sync.Mutex
	snaps      []hwSnapshot // ascending time
	gpmWins    []gpmWindow  // ascending time, contiguous
	xids       []xidEvent
	lastBusy   float64 // busy fraction of the latest utilization window; -1 unknown
	findings   map[string]Finding
	gpmPeriod  time.Duration
	gpmAligned bool
}

// hwSnapshot is the hardware state read at one instant. Zero values of
// fields whose *Known flag is false mean "not read".
type hwSnapshot struct {
	t                           int64 // Unix ns
	smClock                     uint32
	throttle                    uint64
	throttleKnown               bool
	tempC                       uint32
	pcieGen, pcieWidth          uint32
	memUsed                     uint64
	eccOn, eccKnown             bool
	eccCorrected, eccUncorrect  uint64
	eccErrKnown                 bool
	persistenceOn, persistKnown bool
	pids                        []uint32
	pidsKnown                   bool
}

// gpmWindow holds the GPM metrics of one counter interval; -1 = unknown.
type gpmWindow struct {
	start, end                   int64
	sm, occupancy, tensor, dram  float64 // 0..1
	pcieTx, pcieRx, nvlTx, nvlRx float64 // bytes/s
}

type xidEvent struct {
	t    int64
	code uint64
}

func (s *Source) newDevice(idx int, h nvml.Device) *device {
	d := &device{h: h, lastBusy: -1, findings: map[string]Finding{}}
	d.info.Index = idx
	if s.have.name {
		if v, ret := h.GetName(); ret == nvml.SUCCESS {
			d.info.Name = v
		}
	}
	if s.have.uuid {
		if v, ret := h.GetUUID(); ret == nvml.SUCCESS {
			d.info.UUID = v
		}
	}
	if s.have.gpm {
		sup, ret := h.GpmQueryDeviceSupport()
		d.info.GPMSupported = ret == nvml.SUCCESS && sup.IsSupportedDevice != 0
	}
	if s.have.pcie {
		if v, ret := h.GetMaxPcieLinkGeneration(); ret == nvml.SUCCESS {
			d.info.PCIeMaxGen = uint32(v)
		}
		if v, ret := h.GetMaxPcieLinkWidth(); ret == nvml.SUCCESS {
			d.info.PCIeMaxWidth = uint32(v)
		}
	}
	if s.have.clocks {
		if v, ret := h.GetMaxClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			d.info.MaxSMClockMHz = v
		}
	}
	if s.have.mem {
		if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.info.MemTotalBytes = m.Total
		}
	}
	if s.have.tempThreshold {
		if v, ret := h.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); ret == nvml.SUCCESS {
			d.info.SlowdownTempC = v
		}
	}
	return d
}

func (d *device) firstErr(op string) bool {
	_, seen := d.errSeen.LoadOrStore(op, struct{}{})
	return !seen
}

func (d *device) gpmState() (time.Duration, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gpmPeriod, d.gpmAligned
}

func (d *device) addSnapshot(sn hwSnapshot) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.snaps = appendBounded(d.snaps, sn, maxSnapshots)
}

func (d *device) addGPMWindow(w gpmWindow) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gpmWins = appendBounded(d.gpmWins, w, maxGPMWindows)
}

func (d *device) addXid(x xidEvent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.xids = appendBounded(d.xids, x, maxXids)
}

// appendBounded appends and, past limit, drops the oldest half at once so
// the amortised cost stays O(1).
func appendBounded[T any](s []T, v T, limit int) []T {
	s = append(s, v)
	if len(s) > limit {
		s = append(s[:0], s[len(s)-limit/2:]...)
	}
	return s
}

// throttleNames maps clock event (throttle) reason bits to stable names.
// GPU idle is not a slowdown and is left out.
var throttleNames = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksEventReasonApplicationsClocksSetting, "applications_clocks"},
	{nvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
	{0x8, "hw_slowdown"},
	{nvml.ClocksEventReasonSyncBoost, "sync_boost"},
	{nvml.ClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
	{0x40, "hw_thermal_slowdown"},
	{0x80, "hw_power_brake_slowdown"},
	{nvml.ClocksEventReasonDisplayClockSetting, "display_clock"},
}

// ThrottleReasonNames names the slowdown reasons in an NVML clocks event
// reasons mask, in bit order.
func ThrottleReasonNames(mask uint64) []string {
	var out []string
	for _, t := range throttleNames {
		if mask&t.bit != 0 {
			out = append(out, t.name)
		}
	}
	return out
}

// HWContext summarises device dev's hardware state over [start,end) (Unix
// ns): the lowest SM clock, every throttle reason seen, the highest
// temperature, the narrowest PCIe link, the most memory used, the mean GPM
// activity weighted by overlap, processes other than the traced ones, and
// Xids. State read before start counts too: it held when the step began.
// It returns nil for an unknown device.
func (s *Source) HWContext(dev int, start, end int64) *event.HWContext {
	d := s.device(dev)
	if d == nil {
		return nil
	}
	hc := &event.HWContext{
		Device: dev, Name: d.info.Name, UUID: d.info.UUID,
		MaxSMClockMHz: d.info.MaxSMClockMHz, SlowdownTempC: d.info.SlowdownTempC,
		PCIeMaxGen: d.info.PCIeMaxGen, PCIeMaxWidth: d.info.PCIeMaxWidth,
		MemTotalBytes: d.info.MemTotalBytes,
		SMActivity:    -1, TensorActivity: -1, SMOccupancy: -1, DRAMBandwidth: -1,
		PCIeTxBytesPerSec: -1, PCIeRxBytesPerSec: -1, NVLinkTxBytesPerSec: -1, NVLinkRxBytesPerSec: -1,
	}
	traced := s.tracedSet()
	self := uint32(selfPID())

	d.mu.Lock()
	defer d.mu.Unlock()

	// Snapshots: the last one at or before start, and all inside the range.
	first := 0
	for i, sn := range d.snaps {
		if sn.t <= start {
			first = i
		}
	}
	var throttle uint64
	others := map[uint32]bool{}
	for _, sn := range d.snaps[first:] {
		if sn.t >= end {
			break
		}
		if sn.smClock > 0 && (hc.SMClockMHz == 0 || sn.smClock < hc.SMClockMHz) {
			hc.SMClockMHz = sn.smClock
		}
		throttle |= sn.throttle
		hc.TemperatureC = max(hc.TemperatureC, sn.tempC)
		if sn.pcieGen > 0 && (hc.PCIeGen == 0 || sn.pcieGen < hc.PCIeGen) {
			hc.PCIeGen = sn.pcieGen
		}
		if sn.pcieWidth > 0 && (hc.PCIeWidth == 0 || sn.pcieWidth < hc.PCIeWidth) {
			hc.PCIeWidth = sn.pcieWidth
		}
		hc.MemUsedBytes = max(hc.MemUsedBytes, sn.memUsed)
		for _, p := range sn.pids {
			if !traced[p] && p != self {
				others[p] = true
			}
		}
	}
	hc.ThrottleReasons = ThrottleReasonNames(throttle)
	for p := range others {
		hc.OtherProcesses = append(hc.OtherProcesses, p)
	}
	slices.Sort(hc.OtherProcesses)
	for _, x := range d.xids {
		if x.t >= start && x.t < end {
			hc.XidErrors = append(hc.XidErrors, x.code)
		}
	}

	// GPM: overlap-weighted means; windows are sorted and contiguous.
	type acc struct{ sum, w float64 }
	var a [8]acc
	i, _ := slices.BinarySearchFunc(d.gpmWins, start, func(w gpmWindow, t int64) int {
		switch {
		case w.end <= t:
			return -1
		case w.start > t:
			return 1
		}
		return 0
	})
	for ; i < len(d.gpmWins) && d.gpmWins[i].start < end; i++ {
		w := d.gpmWins[i]
		ov := float64(min(w.end, end) - max(w.start, start))
		if ov <= 0 {
			continue
		}
		for k, v := range [8]float64{w.sm, w.occupancy, w.tensor, w.dram, w.pcieTx, w.pcieRx, w.nvlTx, w.nvlRx} {
			if v >= 0 {
				a[k].sum += v * ov
				a[k].w += ov
			}
		}
	}
	out := [8]*float64{&hc.SMActivity, &hc.SMOccupancy, &hc.TensorActivity, &hc.DRAMBandwidth,
		&hc.PCIeTxBytesPerSec, &hc.PCIeRxBytesPerSec, &hc.NVLinkTxBytesPerSec, &hc.NVLinkRxBytesPerSec}
	for k := range a {
		if a[k].w > 0 {
			*out[k] = a[k].sum / a[k].w
		}
	}
	return hc
}
