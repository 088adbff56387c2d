package tracer

import (
	"bytes"
	"debug/elf"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// elfSym is one function symbol, [base+off, base+off+size) in link-time
// addresses (symindex.go). Its name stays in the file until a frame needs
// it: a PyTorch process maps libraries with a million C++ symbols whose
// names alone would take a few hundred MB (read with debug/elf's Symbols,
// 49 MB live and 400 MB at peak in one H200 run), of which a stack ever
// shows a few hundred. Twelve bytes a symbol: the index of libtorch_cpu.so
// is held once for every process that maps it.
type elfSym struct {
	off  uint32 // address less the file's base
	size uint32 // 0: unknown (or above 4 GiB: the next symbol bounds it)
	name uint32 // offset in the file's string tables, one after the other
}

// elfFile is what symbolization needs of one ELF file.
type elfFile struct {
	path    string
	base    uint64   // the lowest loadable address: elfSym.off counts from it
	syms    []elfSym // sorted by address, one per address
	strtabs []strtab
	names   map[uint32]string // names read so far, by elfSym.name
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
	if vaddr < ef.base || vaddr-ef.base > math.MaxUint32 {
		return "", 0, false
	}
	off := uint32(vaddr - ef.base)
	i := sort.Search(len(ef.syms), func(i int) bool { return ef.syms[i].off > off }) - 1
	if i < 0 {
		return "", 0, false
	}
	sym := ef.syms[i]
	if sym.size != 0 && uint64(off) >= uint64(sym.off)+uint64(sym.size) {
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
	var size uint64
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		size = uint64(st.Size())
	}
	b := symBuilder{base: math.MaxUint64}
	for _, p := range ef.loads {
		b.base = min(b.base, p.Vaddr)
	}
	if len(ef.loads) == 0 {
		b.base = 0
	}
	b.add(e, f, size, elf.SHT_SYMTAB)
	if mini, data, err := miniDebugELF(e); err == nil {
		b.add(mini, bytes.NewReader(data), uint64(len(data)), elf.SHT_SYMTAB)
	}
	ef.elf = e
	b.add(e, f, size, elf.SHT_DYNSYM)
	ef.base = b.base
	ef.syms, ef.strtabs = b.build()
	return ef
}

// symName reads sym's name from its string table, once.
func (ef *elfFile) symName(sym elfSym) string {
	if n, ok := ef.names[sym.name]; ok {
		return n
	}
	var st strtab
	for _, t := range ef.strtabs {
		if sym.name >= t.start && uint64(sym.name-t.start) < t.size {
			st = t
			break
		}
	}
	if st.r == nil {
		return ""
	}
	var name []byte
	buf := make([]byte, 256)
	for off := st.off + uint64(sym.name-st.start); len(name) < maxSymName && off < st.off+st.size; {
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
	s = sourceName(s)
	if ef.names == nil {
		ef.names = make(map[uint32]string)
	}
	ef.names[sym.name] = s
	return s
}

// cloneSuffixes are the parts a compiler appends to a function's name
// when it emits a specialised or split copy of it: GCC's constant
// propagation, scalar replacement, partial inlining and cold split
// (augment_batch.constprop.0, step.part.0.cold), LTO's private copies,
// LLVM's internalised ones.
var cloneSuffixes = []string{"constprop", "isra", "part", "cold", "lto_priv", "localalias", "clone", "llvm"}

// sourceName is the function's name as its source spells it: a compiler
// clone's suffixes (cloneSuffixes, each with its optional number) are
// cut, so a stack names the function the user wrote.
func sourceName(s string) string {
	for {
		i := strings.LastIndexByte(s, '.')
		if i <= 0 {
			return s
		}
		tail := s[i+1:]
		if _, err := strconv.ParseUint(tail, 10, 64); err == nil {
			// A clone's number: its word comes before it.
			j := strings.LastIndexByte(s[:i], '.')
			if j <= 0 || !slices.Contains(cloneSuffixes, s[j+1:i]) {
				return s
			}
			s = s[:j]
			continue
		}
		if !slices.Contains(cloneSuffixes, tail) {
			return s
		}
		s = s[:i]
	}
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
