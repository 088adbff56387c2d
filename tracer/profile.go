package tracer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// perfLink is a program attached to a perf event: the link and the event's
// own fd, closed together.
type perfLink struct {
	link.Link
	fd int
}

func (p *perfLink) Close() error {
	return errors.Join(p.Link.Close(), unix.Close(p.fd))
}

// attachSampler opens one CPU-clock perf event per CPU at cfg.CPUSampleHz,
// for every task on it, and attaches on_cpu_sample to each; the program
// keeps the samples of traced processes only. A CPU that cannot be opened
// (offline) is skipped; none at all is an error.
func (t *Tracer) attachSampler() error {
	if t.cfg.CPUSampleHz <= 0 {
		return nil
	}
	n := runtime.NumCPU()
	if c, err := possibleCPUs(); err == nil {
		n = c
	}
	opened := 0
	var firstErr error
	for cpu := 0; cpu < n; cpu++ {
		attr := unix.PerfEventAttr{
			Type:   unix.PERF_TYPE_SOFTWARE,
			Config: unix.PERF_COUNT_SW_CPU_CLOCK,
			Sample: uint64(t.cfg.CPUSampleHz),
			Bits:   unix.PerfBitFreq,
		}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("perf_event_open cpu-clock on CPU %d: %w", cpu, err)
			}
			continue
		}
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: t.prof.OnCpuSample, Attach: ebpf.AttachPerfEvent})
		if err != nil {
			_ = unix.Close(fd) // never attached
			return fmt.Errorf("attach CPU sampler on CPU %d: %w", cpu, err)
		}
		t.tps = append(t.tps, &perfLink{Link: l, fd: fd})
		opened++
	}
	if opened == 0 {
		return fmt.Errorf("CPU sampler: %w", firstErr)
	}
	t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "perf", Symbol: fmt.Sprintf("cpu-clock %d Hz x %d CPUs", t.cfg.CPUSampleHz, opened), Kind: "perf_event"})
	return nil
}

// possibleCPUs is the number of CPU ids the kernel may use
// (/sys/devices/system/cpu/possible, "0-N").
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	last := s
	if i := strings.LastIndexAny(s, "-,"); i >= 0 {
		last = s[i+1:]
	}
	v, err := strconv.Atoi(last)
	if err != nil || v < 0 || v > 1<<16 {
		return 0, fmt.Errorf("parse %q: bad CPU list", s)
	}
	return v + 1, nil
}

// gcFunctions are CPython's collector entry points and passes as its
// symbol table names them (3.9 to 3.13): a sample inside one was taken in a
// garbage collection, whichever Python line triggered it.
var gcFunctions = map[string]bool{
	"gc_collect_main": true, "gc_collect_impl": true, "gc_collect": true, "_PyGC_Collect": true,
	"PyGC_Collect": true, "gc_collect_with_callback": true, "gc_collect_region": true,
	"gc_collect_full": true, "gc_collect_young": true, "gc_collect_increment": true,
	"_PyGC_CollectNoFail": true, "collect": true, "collect_with_callback": true,
	"collect_generations": true, "_Py_RunGC": true, "deduce_unreachable": true,
	"move_unreachable": true, "subtract_refs": true, "update_refs": true,
	"visit_decref": true, "visit_reachable": true, "move_legacy_finalizers": true,
	"handle_legacy_finalizers": true, "delete_garbage": true, "finalize_garbage": true,
}

// GCFrame is the frame put innermost in a sample taken inside CPython's
// garbage collector (its native functions are in the interpreter, whose
// frames the Python ones replace).
var GCFrame = event.Frame{Function: "gc.collect", File: "<gc>"}

// inGC reports whether a native stack, innermost first, is inside the
// collector: a collector function among the frames before the first
// frame that left the interpreter's C code for Python's eval loop.
func inGC(native []event.Frame, interp string) bool {
	for _, f := range native {
		if gcFunctions[f.Function] || (strings.HasSuffix(f.Function, "_traverse") && (f.File == interp || isInterpreterFile(f.File))) {
			// A type's tp_traverse: the collector's own walk.
			return true
		}
		if strings.HasPrefix(f.Function, "_PyEval_EvalFrame") || f.Function == "PyEval_EvalCode" {
			return false
		}
		if interp != "" && f.File != interp && !isInterpreterFile(f.File) {
			return false
		}
	}
	return false
}

// sample completes a CPU sample: its native stack from the IPs the record
// carries, the Python frames the record before it held, and the collector
// named when the native stack was in it.
func (t *Tracer) sample(ev *event.Event, d *decoded) {
	native, trunc := t.syms.frames(ev.PID, 0, d.sampleIPs, nil)
	ev.Stack, ev.StackTruncated = native, trunc
	t.pyMerge(ev, d.ktime)
	var interp string
	if t.py != nil {
		t.py.mu.Lock()
		if p := t.py.procs[ev.PID]; p != nil {
			interp = p.binary
		}
		t.py.mu.Unlock()
	}
	if inGC(native, interp) && (len(ev.Stack) == 0 || ev.Stack[0] != GCFrame) {
		ev.Stack = append([]event.Frame{GCFrame}, ev.Stack...)
	}
}
