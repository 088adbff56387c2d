package tracer

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"
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
	d.faultFile = true
	d.stackID = r.StackId
	d.ktime = r.StartNs // the Python frames' record has the first fault's time
	d.emit = true
	return nil
}

// filemapTracepoints are where the kernel's filemap code says a fault read
// a file (bpf/fault.h); Linux 6.10 added them.
var filemapTracepoints = []string{"mm_filemap_map_pages", "mm_filemap_fault"}

// prepareFaults readies the sched object's fault programs for this
// kernel (haveFilemapTracepoints).
func (t *Tracer) prepareFaults(spec *ebpf.CollectionSpec) error {
	t.filemapTPs = haveFilemapTracepoints()
	return prepareFaultSpec(spec, t.filemapTPs)
}

// haveFilemapTracepoints reports whether the running kernel's BTF has the
// filemap fault tracepoints.
func haveFilemapTracepoints() bool {
	kern, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	for _, tp := range filemapTracepoints {
		var fn *btf.Typedef
		if kern.TypeByName("btf_trace_"+tp, &fn) != nil {
			return false
		}
	}
	return true
}

// prepareFaultSpec: without the filemap tracepoints (filemap false),
// page_fault_user looks up what each fault's address maps instead
// (fault_find_vma), and the two programs are loaded against
// page_fault_user, which their argument reads tolerate, and never
// attached.
func prepareFaultSpec(spec *ebpf.CollectionSpec, filemap bool) error {
	if !filemap {
		for _, p := range []string{schedProgOnFilemapMapPages, schedProgOnFilemapFault} {
			if ps := spec.Programs[p]; ps != nil {
				ps.AttachTo = "page_fault_user"
			}
		}
	}
	return setVariable(spec, schedVarFaultFindVma, !filemap)
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

// fileMaps caches, per process, the file mappings of /proc/PID/maps (all
// of them, not only the executable ones): a page fault's address is
// resolved to the file it read.
type fileMaps struct {
	root   string // procRoot
	mu     sync.Mutex
	procs  map[uint32][]*mapping
	readAt map[uint32]time.Time
}

func newFileMaps() *fileMaps {
	return &fileMaps{root: procRoot, procs: make(map[uint32][]*mapping), readAt: make(map[uint32]time.Time)}
}

// file is the path of the file pid maps at addr; "" when none (anonymous
// memory, a process gone). When addr is in none of the cached mappings the
// maps are read again: if the copy was read before at, the time by which
// the kernel saw a regular file mapped at addr (a fault it timed there; the
// file was mapped after the copy was read), else, when at is 0 (the
// address may be anonymous memory), if the copy is older than 100 ms.
func (f *fileMaps) file(pid uint32, addr uint64, at int64) string {
	if f == nil {
		return "" // a tracer fed recorded records
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		ms, ok := f.procs[pid]
		if !ok || attempt == 1 {
			if attempt == 1 && (at != 0 && !f.readAt[pid].Before(time.Unix(0, at)) ||
				at == 0 && time.Since(f.readAt[pid]) < 100*time.Millisecond) {
				return ""
			}
			var err error
			ms, err = readFileMappings(filepath.Join(f.root, strconv.Itoa(int(pid)), "maps"))
			if err != nil {
				return ""
			}
			if len(f.procs) > 1024 {
				clear(f.procs)
				clear(f.readAt)
			}
			f.procs[pid], f.readAt[pid] = ms, time.Now()
		}
		i := sort.Search(len(ms), func(i int) bool { return ms[i].end > addr })
		if i < len(ms) && ms[i].start <= addr {
			return ms[i].path
		}
	}
	return ""
}

func (f *fileMaps) forget(pid uint32) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.procs, pid)
	delete(f.readAt, pid)
}

// readFileMappings parses every file mapping of a maps file, sorted by
// address.
func readFileMappings(path string) ([]*mapping, error) {
	return readMappings(path, parseFileMapping)
}

// parseFileMapping is parseMapsLine for any file mapping, executable or
// not ("(deleted)" files included: the pages still come from them).
func parseFileMapping(line string) (mapping, bool) { return parseMapping(line, false) }
