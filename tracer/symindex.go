package tracer

import (
	"debug/elf"
	"io"
	"math"
	"slices"
)

// A file's symbol index: its function symbols, sorted by address, one per
// address, twelve bytes each (elfSym), names left in the file. It is
// built once per file version on the first address that falls in the file
// and shared by every process that maps it (symbolizer.files).
//
// Building it costs a read of the symbol tables and a sort. The sort was
// most of it (pdqsort over 24-byte records compared by address and read
// order: 120 ms for a 260k-symbol table here, libtorch_cpu.so has
// several times that) and appending to a growing slice most of the rest:
// the index is now allocated once at the size the tables declare
// (checked against the file), and sorted by a stable radix sort on
// the 32-bit address offset, which keeps the first-read symbol of an
// address first without a sequence number in the record.

// strtab is a string table left in its file, read at r from off; start is
// where its offsets begin among the file's tables put one after the
// other (elfSym.name).
type strtab struct {
	r         io.ReaderAt
	off, size uint64
	start     uint32
}

// maxSymName bounds a symbol name read from a file (mangled C++ names run
// to a few KiB; a longer one is cut).
const maxSymName = 4096

// symTable is one symbol table to read: its entries and string table.
type symTable struct {
	e       *elf.File
	sec     *elf.Section
	str     strtab
	entSize int
}

// symBuilder gathers the symbol tables of a file, then reads them into an
// index (build). Addresses are kept as offsets from base, the lowest
// loadable segment's address.
type symBuilder struct {
	base     uint64
	tabs     []symTable
	entries  uint64 // entries of the tables so far
	strBytes uint64 // string table bytes so far: the next table's start
}

// maxSymEntries bounds the symbol table entries read from one file
// (libtorch_cpu.so has about a million).
const maxSymEntries = 1 << 24

// add takes e's first section of type typ, when it and its string table
// are well formed and lie within the size bytes r holds; r reads e's file.
func (b *symBuilder) add(e *elf.File, r io.ReaderAt, size uint64, typ elf.SectionType) {
	var sec *elf.Section
	for _, s := range e.Sections {
		if s.Type == typ {
			sec = s
			break
		}
	}
	if sec == nil || sec.Link == 0 || int(sec.Link) >= len(e.Sections) {
		return
	}
	str := e.Sections[sec.Link]
	entSize := uint64(24)
	if e.Class == elf.ELFCLASS32 {
		entSize = 16
	}
	n := sec.Size / entSize
	inFile := func(s *elf.Section) bool {
		return s.Type != elf.SHT_NOBITS && s.Offset <= size && s.Size <= size-s.Offset
	}
	// Name offsets of every table share one 32-bit space.
	if !inFile(sec) || !inFile(str) || b.strBytes+str.Size > math.MaxUint32 || b.entries+n > maxSymEntries {
		return
	}
	b.tabs = append(b.tabs, symTable{e: e, sec: sec, entSize: int(entSize),
		str: strtab{r: r, off: str.Offset, size: str.Size, start: uint32(b.strBytes)}})
	b.strBytes += str.Size
	b.entries += n
}

// rawSym is a function symbol as read: its address, size and name offset
// in its table's strings.
type rawSym struct {
	addr, size uint64
	name       uint32
}

// each calls fn for each defined function symbol of t, in table order.
// The entries come 64 KiB at a time: the table is never held.
func (t *symTable) each(fn func(rawSym)) {
	r := t.sec.Open()
	buf := make([]byte, (64<<10)/t.entSize*t.entSize)
	bo := t.e.ByteOrder
	first := true
	for {
		n, err := io.ReadFull(r, buf)
		n -= n % t.entSize
		for i := 0; i < n; i += t.entSize {
			if first { // entry 0 is the null symbol
				first = false
				continue
			}
			ent := buf[i : i+t.entSize]
			var name uint32
			var info byte
			var shndx uint16
			var value, size uint64
			if t.entSize == 24 {
				name, info, shndx = bo.Uint32(ent[0:]), ent[4], bo.Uint16(ent[6:])
				value, size = bo.Uint64(ent[8:]), bo.Uint64(ent[16:])
			} else {
				name, value, size = bo.Uint32(ent[0:]), uint64(bo.Uint32(ent[4:])), uint64(bo.Uint32(ent[8:]))
				info, shndx = ent[12], bo.Uint16(ent[14:])
			}
			ty := elf.ST_TYPE(info)
			if (ty != elf.STT_FUNC && ty != elf.STT_GNU_IFUNC) || value == 0 || elf.SectionIndex(shndx) == elf.SHN_UNDEF ||
				uint64(name) >= t.str.size {
				continue
			}
			fn(rawSym{addr: value, size: size, name: name})
		}
		if err != nil {
			return
		}
	}
}

// build reads every table added, in order, into the index: the symbols
// sorted by offset from base (the first read wins an address) and the
// string tables their names are in. A symbol below base or 4 GiB above it
// is left out: no shared object's code lies there.
func (b *symBuilder) build() (syms []elfSym, strtabs []strtab) {
	// One allocation at the size the tables declare (checked against the
	// file), not a slice grown by appending: the growth's copies were a
	// third of the time, its garbage twice the index.
	syms = make([]elfSym, 0, b.entries)
	for i := range b.tabs {
		start := b.tabs[i].str.start
		b.tabs[i].each(func(s rawSym) {
			if s.addr < b.base || s.addr-b.base > math.MaxUint32 || len(syms) == cap(syms) {
				return
			}
			if s.size > math.MaxUint32 {
				s.size = 0
			}
			syms = append(syms, elfSym{off: uint32(s.addr - b.base), size: uint32(s.size), name: start + s.name})
		})
		strtabs = append(strtabs, b.tabs[i].str)
	}
	syms = sortSyms(syms)
	syms = slices.CompactFunc(syms, func(a, b elfSym) bool { return a.off == b.off })
	if len(syms) < cap(syms)*3/4 {
		// .symtab's other entries, .dynsym repeating .symtab: no room kept.
		syms = slices.Clone(syms)
	}
	return slices.Clip(syms), strtabs
}

// radixBits is the digit of sortSyms: 2048 counters a pass.
const radixBits = 11

// sortSyms sorts syms by offset, stably, and returns the sorted slice
// (syms itself or a new one). An LSD radix sort over the offset's bits in
// use, in one or three passes, so that the result always lands in a
// buffer of exactly len(syms); already sorted input (a linker's .symtab
// often is) is returned as it is.
func sortSyms(syms []elfSym) []elfSym {
	var top uint32
	sorted := true
	for i, s := range syms {
		top = max(top, s.off)
		if i > 0 && s.off < syms[i-1].off {
			sorted = false
		}
	}
	if sorted {
		return syms
	}
	if len(syms) < 64 {
		slices.SortStableFunc(syms, func(a, b elfSym) int { return int(int64(a.off) - int64(b.off)) })
		return syms
	}
	used := 32
	for used > 0 && top>>(used-1) == 0 {
		used--
	}
	passes, digit := 1, used
	if used > radixBits {
		passes, digit = 3, (used+2)/3
	}
	src, dst := syms, make([]elfSym, len(syms))
	var count [1 << radixBits]int
	mask := uint32(1)<<digit - 1
	for p := 0; p < passes; p++ {
		shift := uint(p * digit)
		clear(count[:])
		for _, s := range src {
			count[(s.off>>shift)&mask]++
		}
		pos := 0
		for d := range count[:mask+1] {
			count[d], pos = pos, pos+count[d]
		}
		for _, s := range src {
			d := (s.off >> shift) & mask
			dst[count[d]] = s
			count[d]++
		}
		src, dst = dst, src[:len(dst)]
	}
	return src
}
