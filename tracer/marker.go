package tracer

import (
	"debug/elf"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/gaptrace/gaptrace/event"
)

// markerSymbol is torch::autograd::profiler::record_function_enter_new(
// std::string const&, std::optional<std::string> const&): every
// record_function region enters it, PyTorch's optimizer step among them
// even with the profiler off (bpf/marker.c keeps the step markers).
const markerSymbol = "_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKSt8optionalIS7_E"

// Marker kinds (enum marker_kind), as bpf2go generated them.
const (
	markerOptimizerStep = uint32(markerMarkerKindMARKER_OPTIMIZER_STEP)
	markerProfilerStep  = uint32(markerMarkerKindMARKER_PROFILER_STEP)
)

func progMarkerEnter(t *Tracer) *ebpf.Program { return t.marker.MarkerEnter }

var markerSpec = probeSpec{lib: libMarker, name: "record_function_enter_new", symbols: []string{markerSymbol}, entry: progMarkerEnter}

// decodeMarker decodes a marker record: the name must start with the
// prefix its kind says, as the program checked it.
func decodeMarker(rec []byte, h *rawHeader, d *decoded) error {
	r := (*rawMarker)(unsafe.Pointer(&rec[0]))
	if event.Kind(h.Kind) != event.KindMarker || r.Len > uint32(len(r.Name)) {
		return fmt.Errorf("decode marker record: kind %d length %d out of range", h.Kind, r.Len)
	}
	b := make([]byte, r.Len)
	for i := range b {
		b[i] = byte(r.Name[i])
	}
	name := strings.ToValidUTF8(string(b), string(utf8.RuneError))
	want := map[uint32]string{markerOptimizerStep: event.MarkerOptimizerStep, markerProfilerStep: event.MarkerProfilerStep}[r.Marker]
	if want == "" || !strings.HasPrefix(name, want) {
		return fmt.Errorf("decode marker record: kind %d name %q does not match", r.Marker, name)
	}
	d.ev.Name = name
	d.emit = true
	return nil
}

// markerLibs remembers, per file (path, device, inode, size, mtime),
// where its dynamic symbol table defines markerSymbol (0: it does not): a
// Python process maps a hundred libraries, every rescan sees them all
// again, and DataLoader workers map libtorch_cpu.so too. The answer comes
// from the library's hash table (dynhash.go), not its whole table.
type markerLibs struct {
	mu   sync.Mutex
	seen map[markerKey]uint64
}

type markerKey struct {
	path       string
	dev, ino   uint64
	size, time int64
}

var definesMarker = markerLibs{seen: make(map[markerKey]uint64)}

// addr is the file offset at which the library at file (reached through
// the process's root) defines markerSymbol in its dynamic symbols, the exported one a uprobe
// by name resolves (libtorch_python.so lists it undefined, libtorch_cpu.so
// defines it); 0 when it does not, or file is no regular ELF file.
func (m *markerLibs) addr(file string) uint64 {
	st, err := os.Stat(file)
	if err != nil || !st.Mode().IsRegular() {
		return 0
	}
	k := markerKey{path: file, size: st.Size(), time: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		k.dev, k.ino = sys.Dev, sys.Ino
	}
	m.mu.Lock()
	v, ok := m.seen[k]
	m.mu.Unlock()
	if ok {
		return v
	}
	v = dynDefined(file, markerSymbol)
	m.mu.Lock()
	m.seen[k] = v
	m.mu.Unlock()
	return v
}

// fileOffset is where the loadable segment holding vaddr keeps it in the
// file (what a uprobe takes), 0 when no executable segment holds it. A
// probe attached at this offset spares the attach a read of the library's
// whole symbol table (libtorch_cpu.so: hundreds of thousands of symbols,
// once for each process that maps it).
func fileOffset(f *elf.File, vaddr uint64) uint64 {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Memsz {
			return vaddr - p.Vaddr + p.Off
		}
	}
	return 0
}

// planMarker plans the one marker probe on a library (planProbes for
// libMarker), from the cached lookup rather than a read of every symbol.
func planMarker(path string) ([]plannedProbe, []string, error) {
	addr := definesMarker.addr(path)
	if addr == 0 {
		return nil, nil, fmt.Errorf("%s: no defined %s", path, markerSpec.name)
	}
	return []plannedProbe{{spec: &allProbes[markerProbe], symbol: markerSymbol, addr: addr, off: addr}}, nil, nil
}

// markerProbe is markerSpec's index in allProbes.
var markerProbe = func() int {
	allProbes = append(allProbes, markerSpec)
	return len(allProbes) - 1
}()
