package tracer

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

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
