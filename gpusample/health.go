package gpusample

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/internal/wake"
)

// Level grades a Finding.
type Level int

const (
	OK Level = iota
	WARN
	FAIL
)

func (l Level) String() string {
	switch l {
	case OK:
		return "ok"
	case WARN:
		return "warn"
	case FAIL:
		return "fail"
	}
	return "unknown"
}

// Finding is one hardware check of one device, with the fix when it is not
// OK. Device is -1 for findings about NVML itself.
type Finding struct {
	Device int
	Check  string // "pcie_link", "throttle", "temperature", "ecc", "persistence", "processes", "xid", "gpm", "nvml"
	Level  Level
	Detail string
	Fix    string
	// state is what a change is judged on: Detail without values that
	// wander without meaning anything (a temperature degree up or down).
	state string
}

// Check names.
const (
	CheckNVML        = "nvml"
	CheckPCIe        = "pcie_link"
	CheckThrottle    = "throttle"
	CheckTemperature = "temperature"
	CheckECC         = "ecc"
	CheckPersistence = "persistence"
	CheckProcesses   = "processes"
	CheckXid         = "xid"
	CheckGPM         = "gpm"
)

var checkOrder = []string{CheckNVML, CheckPCIe, CheckThrottle, CheckTemperature, CheckECC,
	CheckPersistence, CheckProcesses, CheckXid, CheckGPM}

// Unavailable is the finding `gaptrace check` reports, and the sidecar logs
// once, when Open failed: tracing goes on with host evidence alone.
func Unavailable(err error) Finding {
	f := Finding{Device: -1, Check: CheckNVML, Level: WARN,
		Detail: "GPU's own view unavailable, gaps are bounded by host evidence only: " + err.Error()}
	switch {
	case errors.Is(err, ErrPermission):
		f.Fix = "run with access to /dev/nvidia* (root, or the container's NVIDIA runtime with NVIDIA_VISIBLE_DEVICES set)"
	case errors.Is(err, ErrNoDevice):
		f.Fix = "check that the NVIDIA driver is loaded (nvidia-smi) and the GPUs are visible to this container"
	default:
		f.Fix = "install the NVIDIA driver's libnvidia-ml.so.1 (in containers: the NVIDIA container runtime mounts it) or point --nvml-lib / GAPTRACE_NVML_LIB at it"
	}
	return f
}

// snapshot reads the current hardware state of d.
func (s *Source) snapshot(d *device) hwSnapshot {
	sn := hwSnapshot{t: time.Now().UnixNano()}
	h := d.h
	if s.have.clocks {
		if v, ret := h.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			sn.smClock = v
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			s.countErr(d, "nvmlDeviceGetClockInfo", ret)
		}
	}
	var ret nvml.Return
	switch {
	case s.have.eventReasons:
		sn.throttle, ret = h.GetCurrentClocksEventReasons()
	case s.have.throttleReasons:
		sn.throttle, ret = h.GetCurrentClocksThrottleReasons()
	default:
		ret = nvml.ERROR_NOT_SUPPORTED
	}
	sn.throttleKnown = ret == nvml.SUCCESS
	if s.have.temp {
		if v, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			sn.tempC = v
		}
	}
	if s.have.pcie {
		if v, ret := h.GetCurrPcieLinkGeneration(); ret == nvml.SUCCESS {
			sn.pcieGen = uint32(v)
		}
		if v, ret := h.GetCurrPcieLinkWidth(); ret == nvml.SUCCESS {
			sn.pcieWidth = uint32(v)
		}
	}
	if s.have.mem {
		if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			sn.memUsed = m.Used
		}
	}
	if s.have.ecc {
		if cur, _, ret := h.GetEccMode(); ret == nvml.SUCCESS {
			sn.eccKnown, sn.eccOn = true, cur == nvml.FEATURE_ENABLED
		}
	}
	if s.have.eccErrors && sn.eccOn {
		c, r1 := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
		u, r2 := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS {
			sn.eccErrKnown, sn.eccCorrected, sn.eccUncorrect = true, c, u
		}
	}
	if s.have.persistence {
		if m, ret := h.GetPersistenceMode(); ret == nvml.SUCCESS {
			sn.persistKnown, sn.persistenceOn = true, m == nvml.FEATURE_ENABLED
		}
	}
	if s.have.procs {
		if ps, ret := h.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
			sn.pidsKnown = true
			for _, p := range ps {
				sn.pids = append(sn.pids, p.Pid)
			}
			slices.Sort(sn.pids)
			sn.pids = slices.Compact(sn.pids)
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			s.countErr(d, "nvmlDeviceGetComputeRunningProcesses", ret)
		}
	}
	return sn
}

// evaluate grades a snapshot. busy is the device's latest busy fraction
// (-1 unknown): a PCIe link trains down to a lower generation when idle to
// save power, so a low generation only counts while the GPU works.
func (s *Source) evaluate(d *device, sn hwSnapshot, busy float64) []Finding {
	f := &findings{dev: d.info.Index}
	checkPCIe(f, d, sn, busy)
	checkThrottle(f, d, sn)
	checkTemperature(f, d, sn)
	checkECC(f, sn)
	checkPersistence(f, sn)
	s.checkProcesses(f, sn)
	s.checkXid(f, d, sn)
	checkGPM(f, d)
	return f.out
}

// findings collects one device's findings in the order the checks run.
type findings struct {
	dev int
	out []Finding
}

func (f *findings) add(check string, lvl Level, state, detail, fix string) {
	f.out = append(f.out, Finding{Device: f.dev, Check: check, Level: lvl, Detail: detail, Fix: fix, state: state})
}

// checkPCIe grades the link against its capability; a lower generation
// counts only under load (an idle link trains down to save power).
func checkPCIe(f *findings, d *device, sn hwSnapshot, busy float64) {
	if sn.pcieGen > 0 && sn.pcieWidth > 0 && d.info.PCIeMaxGen > 0 && d.info.PCIeMaxWidth > 0 {
		cur := fmt.Sprintf("Gen%d x%d", sn.pcieGen, sn.pcieWidth)
		maxs := fmt.Sprintf("Gen%d x%d", d.info.PCIeMaxGen, d.info.PCIeMaxWidth)
		fix := "reseat the card or move it to a full x16 slot of the right generation; check BIOS PCIe settings, risers and `lspci -vv` LnkSta vs LnkCap"
		switch {
		case sn.pcieWidth < d.info.PCIeMaxWidth:
			f.add(CheckPCIe, WARN, "width:"+cur, fmt.Sprintf("PCIe link %s, capable of %s: host<->device bandwidth cut to %d/%d",
				cur, maxs, sn.pcieWidth, d.info.PCIeMaxWidth), fix)
		case sn.pcieGen < d.info.PCIeMaxGen && busy > 0.05:
			f.add(CheckPCIe, WARN, "gen:"+cur, fmt.Sprintf("PCIe link %s under load, capable of %s: host<->device bandwidth about halved per generation lost",
				cur, maxs), fix)
		case sn.pcieGen < d.info.PCIeMaxGen:
			f.add(CheckPCIe, OK, "ok", fmt.Sprintf("PCIe link %s while idle (power saving), capable of %s; graded under load", cur, maxs), "")
		default:
			f.add(CheckPCIe, OK, "ok", "PCIe link "+cur+" (maximum)", "")
		}
	}
}

// checkThrottle names the active clock event reasons and their fixes.
func checkThrottle(f *findings, d *device, sn hwSnapshot) {
	if sn.throttleKnown {
		names := ThrottleReasonNames(sn.throttle)
		lvl := OK
		var fixes []string
		if sn.throttle&(nvml.ClocksEventReasonSwPowerCap) != 0 {
			lvl = max(lvl, WARN)
			fixes = append(fixes, "power cap: compare the enforced limit with the default in `nvidia-smi -q -d POWER` and restore it if lowered (`nvidia-smi -pl`); at the default limit this is the card's ceiling for this workload")
		}
		if sn.throttle&nvml.ClocksEventReasonSwThermalSlowdown != 0 {
			lvl = max(lvl, WARN)
			fixes = append(fixes, "thermal: improve cooling/airflow, check fans and inlet temperature")
		}
		if sn.throttle&(0x8|0x40|0x80) != 0 {
			lvl = FAIL
			fixes = append(fixes, "hardware slowdown (thermal or power brake): check cooling, power cables and PSU; see `nvidia-smi -q -d PERFORMANCE`")
		}
		detail := "no clock slowdown"
		if len(names) > 0 {
			detail = "clock event reasons active: " + strings.Join(names, ", ")
			if sn.smClock > 0 && d.info.MaxSMClockMHz > 0 {
				detail += fmt.Sprintf(" (SM clock %d of %d MHz)", sn.smClock, d.info.MaxSMClockMHz)
			}
		}
		f.add(CheckThrottle, lvl, fmt.Sprintf("%#x", sn.throttle&^uint64(nvml.ClocksEventReasonGpuIdle)), detail, strings.Join(fixes, "; "))
	}
}

// checkTemperature compares the GPU temperature with its slowdown threshold.
func checkTemperature(f *findings, d *device, sn hwSnapshot) {
	if sn.tempC > 0 && d.info.SlowdownTempC > 0 {
		detail := fmt.Sprintf("%d C, slowdown at %d C", sn.tempC, d.info.SlowdownTempC)
		switch {
		case sn.tempC >= d.info.SlowdownTempC:
			f.add(CheckTemperature, FAIL, "fail", detail+": clocks are being reduced", "improve cooling/airflow; check fans, inlet temperature and rack placement")
		case sn.tempC+5 >= d.info.SlowdownTempC:
			f.add(CheckTemperature, WARN, "warn", detail+": within 5 C of slowdown", "improve cooling/airflow before clocks drop")
		default:
			f.add(CheckTemperature, OK, "ok", detail, "")
		}
	}
}

// checkECC reports ECC mode and the error counts since the driver loaded.
func checkECC(f *findings, sn hwSnapshot) {
	if sn.eccKnown {
		switch {
		case !sn.eccOn:
			f.add(CheckECC, WARN, "off", "ECC disabled: memory errors go undetected",
				"enable ECC (`nvidia-smi -e 1`, then reset the GPU or reboot) unless the loss of capacity was a deliberate choice")
		case sn.eccErrKnown && sn.eccUncorrect > 0:
			f.add(CheckECC, FAIL, fmt.Sprintf("uncorrected:%d", sn.eccUncorrect),
				fmt.Sprintf("%d uncorrected ECC errors since the driver loaded (%d corrected)", sn.eccUncorrect, sn.eccCorrected),
				"drain the node and reset the GPU; if errors recur, check row remapping (`nvidia-smi -q -d ROW_REMAPPER`) and replace the GPU")
		case sn.eccErrKnown && sn.eccCorrected > 0:
			f.add(CheckECC, WARN, fmt.Sprintf("corrected:%d", sn.eccCorrected),
				fmt.Sprintf("ECC on; %d corrected errors since the driver loaded", sn.eccCorrected),
				"watch the count: a rising rate precedes uncorrectable errors (`nvidia-smi -q -d ECC`)")
		default:
			f.add(CheckECC, OK, "ok", "ECC on, no errors", "")
		}
	}
}

// checkPersistence reports whether persistence mode keeps the GPU up.
func checkPersistence(f *findings, sn hwSnapshot) {
	if sn.persistKnown {
		if sn.persistenceOn {
			f.add(CheckPersistence, OK, "ok", "persistence mode on", "")
		} else {
			f.add(CheckPersistence, WARN, "off", "persistence mode off: the driver tears the GPU down between jobs, adding seconds to every CUDA init",
				"run nvidia-persistenced (or `nvidia-smi -pm 1`)")
		}
	}
}

// checkProcesses reports processes other than the traced ones holding a
// context on the GPU.
func (s *Source) checkProcesses(f *findings, sn hwSnapshot) {
	if sn.pidsKnown {
		traced := s.tracedSet()
		self := uint32(selfPID())
		var others []uint32
		for _, p := range sn.pids {
			if !traced[p] && p != self {
				others = append(others, p)
			}
		}
		switch {
		case len(traced) == 0:
			f.add(CheckProcesses, OK, fmt.Sprint(sn.pids), fmt.Sprintf("%d processes hold a context: %v", len(sn.pids), sn.pids), "")
		case len(others) > 0:
			f.add(CheckProcesses, WARN, fmt.Sprint(others),
				fmt.Sprintf("%d other processes share the GPU (pids %v): time-slicing takes GPU time from the traced job", len(others), others),
				"give the job exclusive GPUs (no time-slicing in the device plugin, `nvidia-smi -c EXCLUSIVE_PROCESS`) or isolate with MIG")
		default:
			f.add(CheckProcesses, OK, "ok", "only the traced processes use the GPU", "")
		}
	}
}

// checkXid reports the last Xid of the past hour.
func (s *Source) checkXid(f *findings, d *device, sn hwSnapshot) {
	d.mu.Lock()
	var recent []xidEvent
	for _, x := range d.xids {
		if x.t > sn.t-int64(time.Hour) {
			recent = append(recent, x)
		}
	}
	d.mu.Unlock()
	if len(recent) > 0 {
		last := recent[len(recent)-1]
		f.add(CheckXid, FAIL, fmt.Sprintf("%d@%d", last.code, last.t),
			fmt.Sprintf("Xid %d (%s) at %s; %d Xids in the last hour", last.code, xidMeaning(last.code),
				time.Unix(0, last.t).UTC().Format(time.RFC3339), len(recent)),
			"see `dmesg | grep -i xid` and NVIDIA's Xid catalogue; drain the node if it recurs")
	} else if s.have.events {
		f.add(CheckXid, OK, "ok", "no Xid seen", "")
	}
}

// checkGPM says whether SM activity is measured (GPM) or unknown.
func checkGPM(f *findings, d *device) {
	if !d.info.GPMSupported {
		f.add(CheckGPM, OK, "unsupported", "GPM not supported (pre-Hopper GPU or old driver): idle per window from utilization samples only; SM activity unknown", "")
	} else {
		f.add(CheckGPM, OK, "ok", "GPM supported: SM activity per ~100 ms", "")
	}
}

// xidMeaning names the Xids a training job meets most often.
func xidMeaning(code uint64) string {
	switch code {
	case 13:
		return "graphics engine exception"
	case 31:
		return "GPU memory page fault"
	case 43:
		return "GPU stopped processing"
	case 45:
		return "preemptive cleanup after a previous fault"
	case 48:
		return "double-bit ECC error"
	case 61, 62:
		return "internal micro-controller error"
	case 63, 64:
		return "ECC page retirement / row remapping event"
	case 74:
		return "NVLink error"
	case 79:
		return "GPU has fallen off the bus"
	case 92:
		return "high single-bit ECC error rate"
	case 94:
		return "contained ECC error"
	case 95:
		return "uncontained ECC error"
	case 119, 120:
		return "GSP error"
	case 999:
		return "unknown Xid"
	}
	return "see NVIDIA Xid catalogue"
}

// hwLoop reads the hardware state every HWInterval and reports changes.
func (s *Source) hwLoop(ctx context.Context, d *device) {
	tick := wake.NewTicker(s.cfg.HWInterval)
	defer tick.Stop()
	for {
		s.pollHW(d)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			tick.Next()
		}
	}
}

func (s *Source) pollHW(d *device) []Finding {
	sn := s.snapshot(d)
	d.addSnapshot(sn)
	d.mu.Lock()
	busy := d.lastBusy
	d.mu.Unlock()
	fs := s.evaluate(d, sn, busy)
	s.record(d, fs)
	return fs
}

// record stores the device's findings and sends those whose state changed
// since the previous evaluation (not the first evaluation: that is the
// baseline `gaptrace check` and the startup log report).
func (s *Source) record(d *device, fs []Finding) {
	d.mu.Lock()
	first := len(d.findings) == 0
	var changed []Finding
	for _, f := range fs {
		old, seen := d.findings[f.Check]
		if !first && (!seen || old.Level != f.Level || old.state != f.state) && (seen || f.Level != OK) {
			changed = append(changed, f)
		}
		d.findings[f.Check] = f
	}
	d.mu.Unlock()
	for _, f := range changed {
		if f.Level != OK {
			s.log.Warn("gpu hardware changed", "device", f.Device, "check", f.Check, "level", f.Level.String(), "detail", f.Detail, "fix", f.Fix)
		} else {
			s.log.Info("gpu hardware recovered", "device", f.Device, "check", f.Check, "detail", f.Detail)
		}
		s.sendChange(f)
	}
}

func (s *Source) sendChange(f Finding) {
	select {
	case s.changes <- f:
	default:
		s.st.changesDropped.Add(1)
	}
}

// Health returns the hardware layer of every device: the findings of the
// latest state read while Run runs, or of a fresh read otherwise.
func (s *Source) Health() []Finding {
	var out []Finding
	for _, d := range s.devs {
		d.mu.Lock()
		fresh := s.running.Load() && len(d.snaps) > 0 &&
			time.Since(time.Unix(0, d.snaps[len(d.snaps)-1].t)) < 2*s.cfg.HWInterval
		var fs []Finding
		for _, f := range d.findings {
			fs = append(fs, f)
		}
		d.mu.Unlock()
		if !fresh || len(fs) == 0 {
			fs = s.pollHW(d)
		}
		out = append(out, fs...)
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		if a.Device != b.Device {
			return a.Device - b.Device
		}
		return slices.Index(checkOrder, a.Check) - slices.Index(checkOrder, b.Check)
	})
	return out
}

// Changes delivers findings whose state changed during Run (throttling
// started or stopped, the link trained down, an Xid, a process joined the
// GPU). The channel is buffered; when nobody reads it, changes are dropped
// and counted in Stats. It is never closed.
func (s *Source) Changes() <-chan Finding { return s.changes }

// eventLoop waits for Xid (critical error) events on every device.
func (s *Source) eventLoop(ctx context.Context) {
	set, ret := s.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		s.log.Warn("nvml event set unavailable; Xids are not watched", "err", retString(ret))
		return
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			s.log.Debug("free the nvml event set", "err", retString(ret))
		}
	}()
	registered := 0
	for _, d := range s.devs {
		types, ret := d.h.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || types&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		if ret := d.h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			s.log.Warn("cannot watch Xids", "device", d.info.Index, "err", retString(ret))
			continue
		}
		registered++
	}
	if registered == 0 {
		return
	}
	for ctx.Err() == nil {
		// A bounded wait so cancellation is noticed within half a second.
		data, ret := set.Wait(500)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		default:
			if s.devs[0].firstErr("nvmlEventSetWait") {
				s.log.Warn("nvml event wait failed; Xids are no longer watched", "err", retString(ret))
			}
			s.st.errors.Add(1)
			return
		}
		if data.EventType&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		d := s.devs[0]
		for _, c := range s.devs {
			if c.h == data.Device {
				d = c
			}
		}
		s.st.xids.Add(1)
		d.addXid(xidEvent{t: time.Now().UnixNano(), code: data.EventData})
		s.log.Warn("gpu Xid", "device", d.info.Index, "xid", data.EventData, "meaning", xidMeaning(data.EventData))
		// Re-evaluate at once so the Xid reaches Changes without waiting for
		// the next hardware poll.
		s.pollHW(d)
	}
}
