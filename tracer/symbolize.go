package tracer

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// Native stack symbolization. The BPF programs hand over return addresses
// (a frame-pointer walk, bpf/common.h user_stacks); here each one becomes a
// {function, ELF path} through the process's /proc/PID/maps and the file's
// ELF symbol tables. Symbols are cached per file version (device, inode,
// size, mtime), a process's mappings per pid until an address misses them.

// maxStackFrames bounds the frames kept per stack: the innermost are the
// ones a user acts on, and evidence stays small.
const maxStackFrames = 32

// elfSym is one function symbol, [addr, addr+size) in link-time addresses.
// Its name stays in the file until a frame needs it: a PyTorch process maps
// libraries with a million C++ symbols whose names alone would take a few
// hundred MB (read with debug/elf's Symbols, 49 MB live and 400 MB at peak
// in one H200 run), of which a stack ever shows a few hundred.
type elfSym struct {
	addr uint64
	size uint32 // 0: unknown (or above 4 GiB: the next symbol bounds it)
	name uint32 // offset in the string table strtabs[tab]
	tab  uint8
	seq  uint32 // order read (in the struct's padding): the first wins an address
}

// elfFile is what symbolization needs of one ELF file.
type elfFile struct {
	path    string
	syms    []elfSym // sorted by addr
	strtabs []strtab
	names   map[elfSym]string // names read so far
	loads   []elf.ProgHeader
	// lines is the DWARF line table, sorted by address, read in the
	// background from the first lookup on (line) when the file has one;
	// linesDone is closed once it is. waited: a lookup already waited
	// lineWait for it. noLines: the table is never read (gaptrace's own
	// executable, which a job started by gaptrace runs until its exec).
	lines     []lineEntry
	linesDone chan struct{}
	waited    bool
	noLines   bool
	elf       *elf.File
	f         *os.File // for the call-instruction check; nil when unreadable
	err       error
	// calls caches afterCall by file offset: the same return addresses
	// come back with every syscall of a loop.
	calls map[uint64]bool
}

type fileID struct {
	dev, ino  uint64
	size, mod int64
}

// mapping is one executable file mapping of a process.
type mapping struct {
	start, end, off uint64
	dev, ino        uint64
	path            string
	ef              *elfFile // once looked up
}

type symbolizer struct {
	procRoot string
	mu       sync.Mutex
	files    map[fileID]*elfFile
	procs    map[uint32][]*mapping
	// raw caches the addresses behind a stack id per process: ids are
	// stable (the map is never told to reuse a bucket), so one lookup per
	// call site.
	raw map[pidStack][]uint64
	// done caches symbolized stacks per process, stack id and the caller
	// recovered from the stack words: a loop blocks at a handful of call
	// sites, so after the first time a stack costs one map lookup.
	done map[stackKey]symbolized
	// readAt is when a process's maps were last read: an address in no
	// file mapping (a heap word, JIT code) rereads them at most once per
	// mapsRereadEvery, not once per address.
	readAt map[uint32]time.Time
	// changed: the process mapped executable code since its maps were
	// last read (a library loaded), so an address they miss may be in it.
	changed map[uint32]bool
	// self is gaptrace's own executable (device as in maps, inode).
	self struct{ dev, ino uint64 }
}

// mapsRereadEvery bounds how often a process's maps are reread for
// addresses they do not cover. A PyTorch process maps thousands of regions;
// rereading them for every stack word that is not code stalled the event
// consumer for seconds while the job imported its libraries.
const mapsRereadEvery = time.Second

// mapsRereadChanged is the bound instead once the process mapped code
// since: ld.so maps libc a few ms after exec, and a stack taken before
// (the loader's own reads) read maps without it; for a second after,
// every libc frame was an address. A PyTorch import maps hundreds of
// libraries: at most 20 rereads a second.
const mapsRereadChanged = 50 * time.Millisecond

type stackKey struct {
	pid    uint32
	id     int32 // user_stacks id: one stack's addresses, never reused
	caller uint64
}

type symbolized struct {
	frames    []event.Frame
	truncated bool
}

// maxSymbolized bounds the symbolized-stack cache.
const maxSymbolized = 1 << 14

type pidStack struct {
	pid uint32
	id  int32
}

func newSymbolizer() *symbolizer {
	s := &symbolizer{procRoot: procRoot, files: map[fileID]*elfFile{}, procs: map[uint32][]*mapping{},
		raw: map[pidStack][]uint64{}, readAt: map[uint32]time.Time{}, changed: map[uint32]bool{}, done: map[stackKey]symbolized{}}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err == nil {
		s.self.dev = uint64(unix.Major(st.Dev))<<32 | uint64(unix.Minor(st.Dev))
		s.self.ino = st.Ino
	}
	return s
}

// forget drops what is known of pid (exec, exit).
func (s *symbolizer) forget(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, pid)
	delete(s.readAt, pid)
	delete(s.changed, pid)
	for k := range s.done {
		if k.pid == pid {
			delete(s.done, k)
		}
	}
	for k := range s.raw {
		if k.pid == pid {
			delete(s.raw, k)
		}
	}
}

// mapped notes that pid mapped executable code: its maps may be reread
// sooner for an address they miss.
func (s *symbolizer) mapped(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.procs[pid]; ok {
		s.changed[pid] = true
	}
}

// close releases the open ELF files.
func (s *symbolizer) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		if f.f != nil {
			_ = f.f.Close() // read-only file: nothing to lose
		}
	}
	s.files = map[fileID]*elfFile{}
}

// frames symbolizes the return addresses ips of user_stacks id of pid
// (id < 0: a stack of no id, not remembered), innermost
// first; truncated says outer frames were cut (the walk filled its depth,
// or the stack has more than maxStackFrames). spWords (may be nil) are the words at the stack pointer when the
// stack was taken inside a syscall: the wrapper that made the call keeps no
// frame pointer, so the frame-pointer walk goes from it straight to its
// caller's caller; the first word among them that is a return address
// (it follows a call instruction in an executable mapping) is that caller.
func (s *symbolizer) frames(pid uint32, id int32, ips []uint64, spWords []uint64) (frames []event.Frame, truncated bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ips) == 0 {
		return nil, false
	}
	truncated = len(ips) >= stackDepth
	var caller uint64
	if len(spWords) > 0 {
		if c, ok := s.callerOf(pid, ips, spWords); ok {
			caller = c
		}
	}
	key := stackKey{pid: pid, id: id, caller: caller}
	if d, ok := s.done[key]; ok && id >= 0 {
		return d.frames, d.truncated
	}
	pending := false
	if id >= 0 {
		defer func() {
			if pending {
				return // a line table still being read: the next time knows more
			}
			if len(s.done) >= maxSymbolized {
				clear(s.done)
			}
			s.done[key] = symbolized{frames, truncated}
		}()
	}
	if caller != 0 {
		ips = append([]uint64{ips[0], caller}, ips[1:]...)
	}
	if len(ips) > maxStackFrames {
		ips, truncated = ips[:maxStackFrames], true
	}
	frames = make([]event.Frame, 0, len(ips))
	for _, ip := range ips {
		fr, p := s.frame(pid, ip)
		frames = append(frames, fr)
		pending = pending || p
	}
	return frames, truncated
}

func (s *symbolizer) callerOf(pid uint32, ips, spWords []uint64) (uint64, bool) {
	for _, w := range spWords {
		if w < 4096 {
			continue
		}
		if contains(ips, w) {
			return 0, false // the walk already has it
		}
		m, ok := s.mappingOf(pid, w)
		if !ok {
			continue
		}
		ef := s.file(pid, m)
		if ef.f == nil {
			continue
		}
		if ef.afterCall(w - m.start + m.off) {
			return w, true
		}
	}
	return 0, false
}

// afterCall is afterCall on the file, remembered per offset (bounded).
func (ef *elfFile) afterCall(off uint64) bool {
	if v, ok := ef.calls[off]; ok {
		return v
	}
	v := afterCall(ef.f, off)
	if ef.calls == nil || len(ef.calls) >= maxCallChecks {
		ef.calls = map[uint64]bool{}
	}
	ef.calls[off] = v
	return v
}

// maxCallChecks bounds the afterCall cache of one file.
const maxCallChecks = 1 << 16

func contains(a []uint64, v uint64) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

// afterCall says whether the bytes before file offset off end in an x86-64
// call instruction: e8 rel32, or ff /2 in its register and memory forms.
func afterCall(f *os.File, off uint64) bool {
	if off < 7 {
		return false
	}
	var b [7]byte
	if _, err := f.ReadAt(b[:], int64(off-7)); err != nil {
		return false
	}
	if b[2] == 0xe8 {
		return true
	}
	// ff /2 with a modrm byte (and optional sib/disp) ending at off.
	for _, n := range []int{2, 3, 4, 6, 7} {
		i := 7 - n
		if b[i] == 0xff && (b[i+1]>>3)&7 == 2 {
			return true
		}
	}
	return false
}

// frame symbolizes one return address. The address after a call belongs
// to the caller's next instruction, which may start another function or
// line: lookups use ip-1, inside the call.
func (s *symbolizer) frame(pid uint32, ip uint64) (fr event.Frame, pending bool) {
	m, ok := s.mappingOf(pid, ip)
	if !ok {
		return event.Frame{Function: fmt.Sprintf("0x%x", ip)}, false
	}
	ef := s.file(pid, m)
	fr = event.Frame{File: m.path}
	off := ip - m.start + m.off
	if ef.err == nil {
		if name, vaddr, ok := ef.lookup(off - 1); ok {
			fr.Function = name
			src, line, pending := ef.line(vaddr)
			if line > 0 {
				fr.Source, fr.Line = src, line
			}
			return fr, pending
		}
	}
	fr.Function = fmt.Sprintf("%s+0x%x", filepath.Base(m.path), off)
	return fr, false
}

// lookup finds the function containing file offset off, and its virtual
// address.
func (ef *elfFile) lookup(off uint64) (string, uint64, bool) {
	vaddr, ok := uint64(0), false
	for _, p := range ef.loads {
		if off >= p.Off && off < p.Off+p.Filesz {
			vaddr, ok = off-p.Off+p.Vaddr, true
			break
		}
	}
	if !ok {
		return "", 0, false
	}
	return ef.lookupVaddr(vaddr)
}

// lookupVaddr finds the function containing virtual address vaddr.
func (ef *elfFile) lookupVaddr(vaddr uint64) (string, uint64, bool) {
	i := sort.Search(len(ef.syms), func(i int) bool { return ef.syms[i].addr > vaddr }) - 1
	if i < 0 {
		return "", 0, false
	}
	sym := ef.syms[i]
	if sym.size != 0 && vaddr >= sym.addr+uint64(sym.size) {
		return "", 0, false
	}
	return ef.symName(sym), vaddr, true
}

// mappingOf finds the executable mapping of pid holding addr, reading
// /proc/PID/maps again once when it is not there (a library loaded since).
func (s *symbolizer) mappingOf(pid uint32, addr uint64) (*mapping, bool) {
	for attempt := 0; attempt < 2; attempt++ {
		ms, ok := s.procs[pid]
		if since := time.Since(s.readAt[pid]); attempt == 1 && since < mapsRereadEvery &&
			(!s.changed[pid] || since < mapsRereadChanged) {
			return nil, false
		}
		if !ok || attempt == 1 {
			var err error
			ms, err = readExecMappings(filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "maps"))
			if err != nil {
				return nil, false
			}
			s.procs[pid] = ms
			s.readAt[pid] = time.Now()
			delete(s.changed, pid)
		}
		i := sort.Search(len(ms), func(i int) bool { return ms[i].end > addr })
		if i < len(ms) && ms[i].start <= addr {
			return ms[i], true
		}
	}
	return nil, false
}

// readExecMappings parses the executable file mappings of a maps file,
// sorted by address.
func readExecMappings(path string) ([]*mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open maps: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only
	var out []*mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, ok := parseMapsLine(sc.Text())
		if ok {
			out = append(out, &m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out, nil
}

// parseMapsLine reads "start-end perms offset major:minor inode path" and
// keeps executable mappings of files.
func parseMapsLine(line string) (mapping, bool) {
	fs := strings.Fields(line)
	if len(fs) < 6 || len(fs[1]) < 3 || fs[1][2] != 'x' || !strings.HasPrefix(fs[5], "/") {
		return mapping{}, false
	}
	lo, hi, ok := strings.Cut(fs[0], "-")
	if !ok {
		return mapping{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseUint(fs[2], 16, 64)
	ino, err4 := strconv.ParseUint(fs[4], 10, 64)
	maj, min, ok2 := strings.Cut(fs[3], ":")
	ma, err5 := strconv.ParseUint(maj, 16, 32)
	mi, err6 := strconv.ParseUint(min, 16, 32)
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil || !ok2 || end <= start {
		return mapping{}, false
	}
	return mapping{start: start, end: end, off: off, dev: ma<<32 | mi, ino: ino,
		path: strings.Join(fs[5:], " ")}, true
}

// file loads (once per file version) the symbols of the file behind m, as
// the process sees it (/proc/PID/root: its mount namespace).
func (s *symbolizer) file(pid uint32, m *mapping) *elfFile {
	if m.ef != nil {
		return m.ef
	}
	p := filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "root", m.path)
	id := fileID{dev: m.dev, ino: m.ino}
	if st, err := os.Stat(p); err == nil {
		id.size, id.mod = st.Size(), st.ModTime().UnixNano()
	}
	ef, ok := s.files[id]
	if !ok {
		ef = loadELF(p)
		ef.path = m.path
		ef.noLines = m.dev == s.self.dev && m.ino == s.self.ino
		s.files[id] = ef
	}
	m.ef = ef
	return ef
}

// loadELF reads the function symbols of .symtab and .dynsym and the
// loadable segments of an ELF file.
func loadELF(path string) *elfFile {
	ef := &elfFile{}
	f, err := os.Open(path)
	if err != nil {
		ef.err = fmt.Errorf("open %s: %w", path, err)
		return ef
	}
	ef.f = f
	e, err := elf.NewFile(f)
	if err != nil {
		ef.err = fmt.Errorf("read ELF %s: %w", path, err)
		return ef
	}
	for _, p := range e.Progs {
		if p.Type == elf.PT_LOAD {
			ef.loads = append(ef.loads, p.ProgHeader)
		}
	}
	// .symtab first: it names the static functions .dynsym leaves out, and
	// where both name an address the first table's symbol is kept. A
	// stripped binary may carry them in .gnu_debugdata (MiniDebugInfo: an
	// xz-compressed ELF holding only a .symtab), as Fedora's and RHEL's
	// packages do.
	ef.addSymbols(e, f, elf.SHT_SYMTAB)
	if mini, b, err := miniDebugELF(e); err == nil {
		ef.addSymbols(mini, bytes.NewReader(b), elf.SHT_SYMTAB)
	}
	ef.elf = e
	ef.addSymbols(e, f, elf.SHT_DYNSYM)
	// Among symbols at one address the one read first (the earlier
	// table's) comes first; pdqsort with that order, not a stable sort,
	// which took 0.4 s of CPU for a PyTorch process's libraries.
	slices.SortFunc(ef.syms, func(a, b elfSym) int {
		return cmp.Or(cmp.Compare(a.addr, b.addr), cmp.Compare(a.seq, b.seq))
	})
	ef.syms = slices.CompactFunc(ef.syms, func(a, b elfSym) bool { return a.addr == b.addr })
	ef.syms = slices.Clip(ef.syms)
	return ef
}

// stackIPs returns the return addresses stored under a user_stacks id,
// innermost first, looked up once per process and id.
func (t *Tracer) stackIPs(pid uint32, id int32) []uint64 {
	k := pidStack{pid, id}
	t.syms.mu.Lock()
	ips, ok := t.syms.raw[k]
	t.syms.mu.Unlock()
	if ok {
		return ips
	}
	m := t.shared[cudaMapUserStacks]
	if m == nil {
		return nil // not loaded (a tracer fed recorded records)
	}
	var buf [stackDepth]uint64
	if err := m.Lookup(uint32(id), &buf); err != nil {
		t.log.Debug("user stack lookup", "id", id, "error", err)
		return nil
	}
	for _, ip := range buf {
		if ip == 0 {
			break
		}
		ips = append(ips, ip)
	}
	t.syms.mu.Lock()
	t.syms.raw[k] = ips
	t.syms.mu.Unlock()
	return ips
}

// stackDepth is STACK_DEPTH of bpf/common.h: the user_stacks value size in
// addresses (load checks it against the map).
const stackDepth = 64

// strtab is a string table left in its file, read at r from off.
type strtab struct {
	r         io.ReaderAt
	off, size uint64
}

// maxSymName bounds a symbol name read from a file (mangled C++ names run
// to a few KiB; a longer one is cut).
const maxSymName = 4096

// addSymbols appends the function symbols of e's first section of type typ
// to ef.syms, reading the table in one pass without keeping it or its
// names; r reads e's file.
func (ef *elfFile) addSymbols(e *elf.File, r io.ReaderAt, typ elf.SectionType) {
	var sec *elf.Section
	for _, s := range e.Sections {
		if s.Type == typ {
			sec = s
			break
		}
	}
	if sec == nil || sec.Link == 0 || int(sec.Link) >= len(e.Sections) || len(ef.strtabs) == 255 {
		return
	}
	str := e.Sections[sec.Link]
	tab := uint8(len(ef.strtabs))
	ef.strtabs = append(ef.strtabs, strtab{r: r, off: str.Offset, size: str.Size})
	entSize := 24
	if e.Class == elf.ELFCLASS32 {
		entSize = 16
	}
	br := bufio.NewReaderSize(sec.Open(), 64<<10)
	ent := make([]byte, entSize)
	if _, err := io.ReadFull(br, ent); err != nil { // entry 0 is the null symbol
		return
	}
	bo := e.ByteOrder
	for {
		if _, err := io.ReadFull(br, ent); err != nil {
			return
		}
		var name uint32
		var info byte
		var shndx uint16
		var value, size uint64
		if entSize == 24 {
			name, info, shndx = bo.Uint32(ent[0:]), ent[4], bo.Uint16(ent[6:])
			value, size = bo.Uint64(ent[8:]), bo.Uint64(ent[16:])
		} else {
			name, value, size = bo.Uint32(ent[0:]), uint64(bo.Uint32(ent[4:])), uint64(bo.Uint32(ent[8:]))
			info, shndx = ent[12], bo.Uint16(ent[14:])
		}
		t := elf.ST_TYPE(info)
		if (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || value == 0 || elf.SectionIndex(shndx) == elf.SHN_UNDEF ||
			uint64(name) >= str.Size {
			continue
		}
		if size > math.MaxUint32 {
			size = 0
		}
		ef.syms = append(ef.syms, elfSym{addr: value, size: uint32(size), name: name, tab: tab, seq: uint32(len(ef.syms))})
	}
}

// symName reads sym's name from its string table, once.
func (ef *elfFile) symName(sym elfSym) string {
	if n, ok := ef.names[sym]; ok {
		return n
	}
	st := ef.strtabs[sym.tab]
	var name []byte
	buf := make([]byte, 256)
	for off := st.off + uint64(sym.name); len(name) < maxSymName && off < st.off+st.size; {
		n, err := st.r.ReadAt(buf, int64(off))
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			name = append(name, buf[:i]...)
			break
		}
		name = append(name, buf[:n]...)
		off += uint64(n)
		if err != nil {
			break
		}
	}
	s := string(name)
	if i := strings.IndexByte(s, '@'); i > 0 {
		s = s[:i] // "read@@GLIBC_2.2.5"
	}
	if ef.names == nil {
		ef.names = make(map[elfSym]string)
	}
	ef.names[sym] = s
	return s
}
