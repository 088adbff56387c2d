package tracer

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// attachFaultEvents opens the software page-fault events (minor and
// major) on every CPU, for every task, a sample per event, and attaches
// on_fault_done to each: the kernel raises them once a user fault
// completed, which ends the fault page_fault_user began (bpf/fault.h).
// The program returns at once for a thread outside the traced processes or
// one whose fault was not on a regular file's mapping. A CPU that cannot
// be opened (offline) is skipped; none at all is an error.
func (t *Tracer) attachFaultEvents() error {
	n := runtime.NumCPU()
	if c, err := possibleCPUs(); err == nil {
		n = c
	}
	opened := 0
	var firstErr error
	for _, config := range []uint64{unix.PERF_COUNT_SW_PAGE_FAULTS_MIN, unix.PERF_COUNT_SW_PAGE_FAULTS_MAJ} {
		for cpu := 0; cpu < n; cpu++ {
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: config, Sample: 1}
			attr.Size = uint32(unsafe.Sizeof(attr))
			fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("perf_event_open page faults on CPU %d: %w", cpu, err)
				}
				continue
			}
			l, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: t.prof.OnFaultDone, Attach: ebpf.AttachPerfEvent})
			if err != nil {
				_ = unix.Close(fd) // never attached
				return fmt.Errorf("attach page-fault event on CPU %d: %w", cpu, err)
			}
			t.tps = append(t.tps, &perfLink{Link: l, fd: fd})
			opened++
		}
	}
	if opened == 0 {
		return fmt.Errorf("page-fault events: %w", firstErr)
	}
	t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "perf", Symbol: fmt.Sprintf("page-faults (minor, major) x %d CPUs", opened/2), Kind: "perf_event"})
	return nil
}

// decodeFaultRead decodes a burst of page faults on a mapped file.
func decodeFaultRead(rec []byte, h *rawHeader, d *decoded) error {
	ev := &d.ev
	r := (*rawFault)(unsafe.Pointer(&rec[0]))
	if ev.Kind != event.KindFaultRead || r.Count == 0 || r.StartNs == 0 || r.StartNs > h.KtimeNs ||
		r.OnNs > h.KtimeNs-r.StartNs || r.OffNs > h.KtimeNs-r.StartNs-r.OnNs {
		return fmt.Errorf("decode fault record: kind %d, %d faults, start %d, %d ns on CPU and %d off, end %d out of range",
			h.Kind, r.Count, r.StartNs, r.OnNs, r.OffNs, h.KtimeNs)
	}
	ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
	ev.OnCPU = int64(r.OnNs)
	ev.OffCPU = int64(r.OffNs)
	ev.Count = r.Count
	d.faultAddr = r.Addr
	d.stackID = r.StackId
	d.ktime = r.StartNs // the Python frames' record has the first fault's time
	d.emit = true
	return nil
}
