package tracer

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/prometheus/procfs"
)

// Python stacks. A traced process that is a CPython (its executable is
// python3.X or it maps libpython3.X) gets an entry in the py_procs map: the
// address of _PyRuntime and the offsets the BPF walk needs (bpf/python.h).
// At each capture point the programs then emit the thread's frames as (code
// object, instruction) pairs; pycode.go turns those into
// {qualname, file, line} by reading the code objects from the process.

// pyLayout is what gaptrace needs to know of one CPython minor version:
// the walk's offsets (see struct py_offsets in bpf/python.h) and those of
// the objects user space reads.
type pyLayout struct {
	minor int

	interpHead, tstateHead, tstateNext, tstateThreadID, tstateFrame uint32
	cframeFrame                                                     int32 // -1: none
	framePrev, frameCode, frameInstr                                uint32
	frameOwner                                                      int32 // -1: none
	instrIsPtr                                                      bool  // 3.11+: a pointer into co_code_adaptive

	obType        uint32
	codeFilename  uint32
	codeName      uint32
	codeQualname  int32 // -1 before 3.11
	codeFirstLine uint32
	codeLinetable uint32 // co_lnotab (3.9), co_linetable (3.10+)
	codeAdaptive  uint32 // 3.11+: offset of the bytecode in the code object
	codeSize      uint32 // 3.11+: ob_size, the bytecode length in code units
	bytesSize     uint32 // PyBytesObject.ob_size
	bytesData     uint32 // PyBytesObject.ob_sval
	strState      uint32 // PyASCIIObject.state
	strLength     uint32 // PyASCIIObject.length
	strASCII      uint32 // sizeof(PyASCIIObject): where ASCII data starts
	strCompact    uint32 // sizeof(PyCompactUnicodeObject)
}

// pyLayouts holds the layouts of 3.9–3.12, read off CPython's headers at
// the v3.X.0 tags (Include/internal/pycore_runtime.h, pycore_interp.h,
// cpython/pystate.h, pycore_frame.h, cpython/code.h, cpython/frameobject.h;
// x86-64, default build). The layouts are stable within a minor version.
// 3.13+ describe themselves (_Py_DebugOffsets, pyLayoutFromDebugOffsets).
var pyLayouts = map[int]pyLayout{
	9: {
		minor: 9,
		// _PyRuntimeState: 4 ints, _finalizing, interpreters{mutex, head}
		interpHead: 32, tstateHead: 8, tstateNext: 8, tstateThreadID: 176, tstateFrame: 24, cframeFrame: -1,
		// PyFrameObject: f_back, f_code; f_lasti (int, bytes)
		framePrev: 24, frameCode: 32, frameInstr: 104, frameOwner: -1,
		obType: 8, codeFilename: 104, codeName: 112, codeQualname: -1, codeFirstLine: 40, codeLinetable: 120,
		bytesSize: 16, bytesData: 32, strState: 32, strLength: 16, strASCII: 48, strCompact: 72,
	},
	10: {
		minor:      10,
		interpHead: 32, tstateHead: 8, tstateNext: 8, tstateThreadID: 176, tstateFrame: 24, cframeFrame: -1,
		// f_lasti (int) counts code units from 3.10 on
		framePrev: 24, frameCode: 32, frameInstr: 96, frameOwner: -1,
		obType: 8, codeFilename: 104, codeName: 112, codeQualname: -1, codeFirstLine: 40, codeLinetable: 120,
		bytesSize: 16, bytesData: 32, strState: 32, strLength: 16, strASCII: 48, strCompact: 72,
	},
	11: {
		minor: 11,
		// _PyRuntimeState: 5 ints, _finalizing, interpreters{mutex, head};
		// PyInterpreterState.threads.head; PyThreadState.cframe →
		// _PyCFrame.current_frame
		interpHead: 40, tstateHead: 16, tstateNext: 8, tstateThreadID: 152, tstateFrame: 56, cframeFrame: 8,
		// _PyInterpreterFrame: f_code 32, previous 48, prev_instr 56, owner 69
		framePrev: 48, frameCode: 32, frameInstr: 56, frameOwner: 69, instrIsPtr: true,
		obType: 8, codeFilename: 112, codeName: 120, codeQualname: 128, codeFirstLine: 72, codeLinetable: 136,
		codeAdaptive: 184, codeSize: 16,
		bytesSize: 16, bytesData: 32, strState: 32, strLength: 16, strASCII: 48, strCompact: 72,
	},
	12: {
		minor: 12,
		// _PyRuntimeState gained _finalizing_id; PyInterpreterState.threads
		// moved behind id, id_refcount, ..., last_restart_version
		interpHead: 48, tstateHead: 72, tstateNext: 8, tstateThreadID: 136, tstateFrame: 56, cframeFrame: 0,
		// _PyInterpreterFrame: f_code 0, previous 8, prev_instr 56, owner 70
		framePrev: 8, frameCode: 0, frameInstr: 56, frameOwner: 70, instrIsPtr: true,
		obType: 8, codeFilename: 112, codeName: 120, codeQualname: 128, codeFirstLine: 68, codeLinetable: 136,
		codeAdaptive: 192, codeSize: 16,
		bytesSize: 16, bytesData: 32, strState: 32, strLength: 16, strASCII: 40, strCompact: 56,
	},
}

// pyDebugOffsetsLen is sizeof(_Py_DebugOffsets) in 3.13 (the fields read
// below end before it).
const pyDebugOffsetsLen = 584

// pyLayoutFromDebugOffsets reads the _Py_DebugOffsets table at the start of
// _PyRuntime (3.13+): cookie "xdebugpy", PY_VERSION_HEX, free_threaded, then
// groups of u64 offsets, each group led by the struct's size.
func pyLayoutFromDebugOffsets(b []byte) (pyLayout, error) {
	if len(b) < pyDebugOffsetsLen || !bytes.Equal(b[:8], []byte("xdebugpy")) {
		return pyLayout{}, errors.New("no _Py_DebugOffsets at the start of _PyRuntime")
	}
	w := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	ver := w(8)
	major, minor := int(ver>>24&0xff), int(ver>>16&0xff)
	if major != 3 || minor != 13 {
		// 3.14 inserted fields into the groups; reading it as 3.13
		// would walk the wrong fields.
		return pyLayout{}, fmt.Errorf("python %d.%d: _Py_DebugOffsets layout not supported (3.13 only)", major, minor)
	}
	if w(16) != 0 {
		return pyLayout{}, errors.New("free-threaded python 3.13 not supported")
	}
	l := pyLayout{
		minor:          minor,
		interpHead:     uint32(w(40)),  // runtime_state.interpreters_head
		tstateHead:     uint32(w(72)),  // interpreter_state.threads_head
		tstateNext:     uint32(w(168)), // thread_state.next
		tstateThreadID: uint32(w(192)), // thread_state.thread_id
		tstateFrame:    uint32(w(184)), // thread_state.current_frame
		cframeFrame:    -1,
		framePrev:      uint32(w(232)), // interpreter_frame.previous
		frameCode:      uint32(w(240)), // interpreter_frame.executable
		frameInstr:     uint32(w(248)), // interpreter_frame.instr_ptr
		frameOwner:     int32(w(264)),  // interpreter_frame.owner
		instrIsPtr:     true,
		codeFilename:   uint32(w(280)),
		codeName:       uint32(w(288)),
		codeQualname:   int32(w(296)),
		codeLinetable:  uint32(w(304)),
		codeFirstLine:  uint32(w(312)),
		codeAdaptive:   uint32(w(344)),
		codeSize:       16,
		obType:         uint32(w(360)), // pyobject.ob_type
		bytesSize:      uint32(w(520)),
		bytesData:      uint32(w(528)),
		strState:       uint32(w(544)),
		strLength:      uint32(w(552)),
		strASCII:       uint32(w(560)),
	}
	l.strCompact = l.strASCII + 16 // utf8_length, utf8 follow the ASCII header
	frameSize, codeSize := w(224), w(272)
	for _, f := range []uint32{l.framePrev, l.frameCode, l.frameInstr, uint32(l.frameOwner)} {
		if uint64(f) >= frameSize || f >= pyFrameRead-8 {
			return pyLayout{}, fmt.Errorf("_Py_DebugOffsets: frame field at %d outside the %d-byte frame", f, frameSize)
		}
	}
	for _, f := range []uint32{l.codeFilename, l.codeName, uint32(l.codeQualname), l.codeLinetable, l.codeFirstLine} {
		if uint64(f) >= codeSize {
			return pyLayout{}, fmt.Errorf("_Py_DebugOffsets: code field at %d outside the %d-byte code object", f, codeSize)
		}
	}
	return l, nil
}

// pyFrameRead is PY_FRAME_READ of bpf/python.h.
const pyFrameRead = 128

// offsets renders the layout for the BPF walk of one process.
func (l *pyLayout) offsets(runtime uint64) cudaPyOffsets {
	o := cudaPyOffsets{
		Runtime: runtime, InterpHead: l.interpHead, TstateHead: l.tstateHead, TstateNext: l.tstateNext,
		TstateThreadId: l.tstateThreadID, TstateFrame: l.tstateFrame, CframeFrame: l.cframeFrame,
		FramePrev: l.framePrev, FrameCode: l.frameCode, FrameInstr: l.frameInstr, FrameOwner: l.frameOwner,
	}
	end := max(l.framePrev, l.frameCode, l.frameInstr) + 8
	if l.frameOwner >= 0 {
		end = max(end, uint32(l.frameOwner)+1)
	}
	// Only as far as the last field: a frame at the end of its chunk
	// would fail a longer read.
	o.FrameRead = end
	o.CodeFirstlineno = l.codeFirstLine
	if l.instrIsPtr {
		o.InstrIsPtr = 1
	}
	return o
}

// errNoRuntime: the ELF taken for the interpreter does not define it.
var errNoRuntime = errors.New("no _PyRuntime/PyCode_Type symbol")

var (
	pyExecRe = regexp.MustCompile(`^python3\.(\d+)$`)
	pyLibRe  = regexp.MustCompile(`^libpython3\.(\d+)\.so`)
)

// pyBinary is the ELF that holds a process's interpreter: libpython when it
// maps one, else the executable.
type pyBinary struct {
	path  string // as the process maps it
	minor int    // from the file name
	maps  []*procfs.ProcMap
}

// findPython picks the interpreter ELF among a process's mappings, and
// which minor version its name says.
func findPython(maps []*procfs.ProcMap) (pyBinary, bool) {
	var exe, lib pyBinary
	for _, m := range maps {
		if !strings.HasPrefix(m.Pathname, "/") {
			continue
		}
		base := filepath.Base(m.Pathname)
		for _, c := range []struct {
			re  *regexp.Regexp
			dst *pyBinary
		}{{pyLibRe, &lib}, {pyExecRe, &exe}} {
			sm := c.re.FindStringSubmatch(base)
			if sm == nil || c.dst.path != "" && c.dst.path != m.Pathname {
				continue
			}
			c.dst.path = m.Pathname
			c.dst.minor, _ = strconv.Atoi(sm[1])
			c.dst.maps = append(c.dst.maps, m)
		}
	}
	if lib.path != "" {
		return lib, true
	}
	return exe, exe.path != ""
}

// pyProc is what is known of one CPython process.
type pyProc struct {
	pid      uint32
	binary   string // the interpreter ELF as the process maps it
	layout   pyLayout
	runtime  uint64 // address of _PyRuntime
	codeType uint64 // address of PyCode_Type
	codes    map[uint64]*pyCode
	mem      memReader
	// reused by resolve (calls are serialized by pyStacks.mu)
	scratch []byte
	addrs   []uint64
	bufs    [][]byte
}

// pyStacks tracks the CPython processes among the traced ones.
type pyStacks struct {
	procRoot string
	mu       sync.Mutex
	procs    map[uint32]*pyProc
	// tried: processes looked at and found not CPython (or unsupported),
	// with the binary path that decided it, so rescans cost nothing.
	tried map[uint32]string
	// pending holds each thread's Python stack records until the event
	// each belongs to (same thread, same timestamp) is decoded.
	pending map[uint64]*pyPendingSet
}

type pyPending struct {
	ktime uint64
	rec   rawPyStack
}

// pyPendingSlots is how many of a thread's Python stack records wait for
// their events at once. Most events follow their record at once (a CPU
// sample, a syscall's return), but a page-fault burst's record is written
// when the burst begins and its event when the burst ends, with the
// samples' own records in between: one slot per thread lost the burst's
// frames to the next sample.
const pyPendingSlots = 4

// pyPendingSet is a thread's waiting records, oldest first.
type pyPendingSet struct {
	n    int
	recs [pyPendingSlots]pyPending
}

// put keeps p, dropping the oldest record when every slot is taken (its
// event was lost, or never comes).
func (ps *pyPendingSet) put(p pyPending) {
	if ps.n == pyPendingSlots {
		copy(ps.recs[:], ps.recs[1:])
		ps.n--
	}
	ps.recs[ps.n] = p
	ps.n++
}

// take removes and returns the record of ktime.
func (ps *pyPendingSet) take(ktime uint64) (pyPending, bool) {
	for i := 0; i < ps.n; i++ {
		if ps.recs[i].ktime == ktime {
			p := ps.recs[i]
			copy(ps.recs[i:], ps.recs[i+1:ps.n])
			ps.n--
			return p, true
		}
	}
	return pyPending{}, false
}

func newPyStacks() *pyStacks {
	return &pyStacks{procRoot: procRoot, procs: map[uint32]*pyProc{}, tried: map[uint32]string{}, pending: map[uint64]*pyPendingSet{}}
}

// forget drops what is known of pid (exec, exit).
func (s *pyStacks) forget(pid uint32) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, pid)
	delete(s.tried, pid)
	for k := range s.pending {
		if uint32(k>>32) == pid {
			delete(s.pending, k)
		}
	}
}

// inspect looks at a traced process's mappings and, the first time they
// show a supported CPython, returns the offsets for its py_procs entry.
func (s *pyStacks) inspect(pid uint32, maps []*procfs.ProcMap) (*pyProc, error) {
	bin, ok := findPython(maps)
	if !ok {
		return nil, nil
	}
	s.mu.Lock()
	_, known := s.procs[pid]
	tried := s.tried[pid] == bin.path
	s.mu.Unlock()
	if known || tried {
		return nil, nil
	}
	p, err := s.load(pid, bin)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.tried[pid] = bin.path
		return nil, err
	}
	s.procs[pid] = p
	return p, nil
}

// load finds _PyRuntime and PyCode_Type in the interpreter ELF, where the
// process loaded it, and the layout of its version.
func (s *pyStacks) load(pid uint32, bin pyBinary) (*pyProc, error) {
	path := filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "root", bin.path)
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("python stacks: open %s: %w", bin.path, err)
	}
	defer func() { _ = f.Close() }() // read-only
	want := map[string]uint64{"_PyRuntime": 0, "PyCode_Type": 0, "Py_Version": 0}
	for _, syms := range [][]elf.Symbol{dynSyms(f), staticSyms(f)} {
		for _, sy := range syms {
			if v, ok := want[sy.Name]; ok && v == 0 && sy.Value != 0 && sy.Section != elf.SHN_UNDEF {
				want[sy.Name] = sy.Value
			}
		}
	}
	if want["_PyRuntime"] == 0 || want["PyCode_Type"] == 0 {
		return nil, fmt.Errorf("python stacks: %s: %w", bin.path, errNoRuntime)
	}
	bias, err := loadBias(f, bin.maps)
	if err != nil {
		return nil, fmt.Errorf("python stacks: %s: %w", bin.path, err)
	}
	p := &pyProc{pid: pid, binary: bin.path, runtime: want["_PyRuntime"] + bias, codeType: want["PyCode_Type"] + bias,
		codes: map[uint64]*pyCode{}, mem: procMem{pid: int(pid)}}
	minor := bin.minor
	if a := want["Py_Version"]; a != 0 { // 3.11+: PY_VERSION_HEX
		var b [4]byte
		if err := p.mem.read(a+bias, b[:]); err == nil {
			v := binary.LittleEndian.Uint32(b[:])
			if v>>24 != 3 {
				return nil, fmt.Errorf("python stacks: %s: Py_Version %#x is not 3.x", bin.path, v)
			}
			minor = int(v >> 16 & 0xff)
		}
	}
	if minor >= 13 {
		b := make([]byte, pyDebugOffsetsLen)
		if err := p.mem.read(p.runtime, b); err != nil {
			return nil, fmt.Errorf("python stacks: read _Py_DebugOffsets of pid %d: %w", pid, err)
		}
		l, err := pyLayoutFromDebugOffsets(b)
		if err != nil {
			return nil, fmt.Errorf("python stacks: %s: %w", bin.path, err)
		}
		p.layout = l
		return p, nil
	}
	l, ok := pyLayouts[minor]
	if !ok {
		return nil, fmt.Errorf("python stacks: %s: python 3.%d not supported (3.9–3.13)", bin.path, minor)
	}
	p.layout = l
	return p, nil
}

func dynSyms(f *elf.File) []elf.Symbol {
	s, _ := f.DynamicSymbols() // none: try .symtab
	return s
}

func staticSyms(f *elf.File) []elf.Symbol {
	s, _ := f.Symbols() // stripped: .dynsym had to do
	return s
}

// loadBias is where the process loaded the ELF relative to its link-time
// addresses, from one file-backed mapping of it and the segment holding
// that mapping's file offset.
func loadBias(f *elf.File, maps []*procfs.ProcMap) (uint64, error) {
	for _, m := range maps {
		off := uint64(m.Offset)
		for _, p := range f.Progs {
			if p.Type != elf.PT_LOAD || off < p.Off || off >= p.Off+p.Filesz {
				continue
			}
			return uint64(m.StartAddr) - off - (p.Vaddr - p.Off), nil
		}
	}
	return 0, errors.New("no mapping matches a loadable segment")
}

// pyRequest asks pyLoop to look at a process's mappings.
type pyRequest struct {
	pid  uint32
	maps []*procfs.ProcMap
}

// pyLoop inspects the processes scanProcess saw, one at a time, apart
// from the scans that attach probes.
func (t *Tracer) pyLoop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.done:
			return
		case r := <-t.pyReq:
			t.pyInspect(r.pid, r.maps)
		}
	}
}

// pyInspect is called by pyLoop with a process's mappings: a new CPython
// gets its py_procs entry.
func (t *Tracer) pyInspect(pid uint32, maps []*procfs.ProcMap) {
	m := t.shared[cudaMapPyProcs]
	if m == nil || t.py == nil {
		return
	}
	p, err := t.py.inspect(pid, maps)
	if errors.Is(err, errNoRuntime) {
		// A launcher that links libpython, seen before the loader mapped
		// it: the mapping's rescan tries again with the library.
		t.log.Debug("no python stacks for this process (yet)", "pid", pid, "error", err)
		return
	}
	if err != nil {
		t.log.Warn("no python stacks for this process", "pid", pid, "error", err)
		return
	}
	if p == nil {
		return
	}
	o := p.layout.offsets(p.runtime)
	if err := m.Update(pid, &o, ebpf.UpdateAny); err != nil {
		t.log.Warn("no python stacks for this process", "pid", pid, "error", fmt.Errorf("update py_procs: %w", err))
		return
	}
	t.log.Info("python stacks", "pid", pid, "python", fmt.Sprintf("3.%d", p.layout.minor), "runtime", fmt.Sprintf("%#x", p.runtime))
}

// pyForget drops a process's py_procs entry and what user space knows.
func (t *Tracer) pyForget(pid uint32) {
	t.py.forget(pid)
	if m := t.shared[cudaMapPyProcs]; m != nil {
		_ = m.Delete(pid) // absent for a process that is not CPython
	}
}

// objectOptions are the load options of one object: the shared maps it
// declares (py_procs exists only in the objects with a capture point).
func (t *Tracer) objectOptions(spec *ebpf.CollectionSpec) *ebpf.CollectionOptions {
	out := make(map[string]*ebpf.Map, len(t.shared))
	for name, m := range t.shared {
		if _, ok := spec.Maps[name]; ok {
			out[name] = m
		}
	}
	return &ebpf.CollectionOptions{MapReplacements: out}
}
