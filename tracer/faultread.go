package tracer

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/gaptrace/gaptrace/event"
)

// decodeFaultRead decodes a burst of page faults on a mapped file
// (bpf/fault.h).
func decodeFaultRead(rec []byte, h *rawHeader, d *decoded) error {
	ev := &d.ev
	r := (*rawFault)(unsafe.Pointer(&rec[0]))
	if ev.Kind != event.KindFaultRead || r.Count == 0 || r.StartNs == 0 || r.StartNs > h.KtimeNs {
		return fmt.Errorf("decode fault record: kind %d, %d faults, start %d, end %d out of range", h.Kind, r.Count, r.StartNs, h.KtimeNs)
	}
	ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
	ev.Count = r.Count
	d.faultAddr = r.Addr
	d.stackID = r.StackId
	d.ktime = r.StartNs // the Python frames' record has the first fault's time
	d.emit = true
	return nil
}

// filemapTracepoints are where the kernel's filemap code says a fault read
// a file (bpf/fault.h); Linux 6.10 added them.
var filemapTracepoints = []string{"mm_filemap_map_pages", "mm_filemap_fault"}

// prepareFaults readies the sched object's fault programs for this
// kernel: without the filemap tracepoints, page_fault_user looks up what
// each fault's address maps instead (fault_find_vma), and the two
// programs are loaded against page_fault_user, which their argument reads
// tolerate, and never attached.
func (t *Tracer) prepareFaults(spec *ebpf.CollectionSpec) error {
	kern, err := btf.LoadKernelSpec()
	t.filemapTPs = err == nil
	for _, tp := range filemapTracepoints {
		if t.filemapTPs {
			var fn *btf.Typedef
			t.filemapTPs = kern.TypeByName("btf_trace_"+tp, &fn) == nil
		}
	}
	if !t.filemapTPs {
		for _, p := range []string{schedProgOnFilemapMapPages, schedProgOnFilemapFault} {
			if ps := spec.Programs[p]; ps != nil {
				ps.AttachTo = "page_fault_user"
			}
		}
	}
	return setVariable(spec, schedVarFaultFindVma, !t.filemapTPs)
}

// attachFilemap attaches the filemap fault programs where the kernel has
// their tracepoints.
func (t *Tracer) attachFilemap() error {
	if !t.filemapTPs {
		t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "sched", Symbol: "page_fault_user (bpf_find_vma: no filemap tracepoints)", Kind: "tp_btf"})
		return nil
	}
	for i, prog := range []*ebpf.Program{t.sched.OnFilemapMapPages, t.sched.OnFilemapFault} {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			return fmt.Errorf("attach tp_btf/%s: %w", filemapTracepoints[i], err)
		}
		t.tps = append(t.tps, l)
		t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "sched", Symbol: filemapTracepoints[i], Kind: "tp_btf"})
	}
	return nil
}
