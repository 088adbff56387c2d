package tracer

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io"
	"os"
	"strings"
)

// Looking one name up among a library's dynamic symbols as the dynamic
// linker does: through the DT_GNU_HASH table (or the older DT_HASH), which
// leads to the few .dynsym entries whose names hash alike, instead of
// reading the whole table (libtorch_cpu.so: hundreds of thousands of
// entries and tens of MB of names, read for every library a process maps
// to see whether it defines one function). The file is outside input:
// every count and offset read from it is checked against the sections it
// must lie in, and a table that does not hold (a chain that leaves them)
// finds nothing.

// dynTables are a file's dynamic symbol table and its strings, checked to
// lie within the file.
type dynTables struct {
	r        io.ReaderAt
	bo       binary.ByteOrder
	class64  bool
	sym, str *elf.Section
	nsyms    uint64
	size     uint64 // the file's
}

// hashResult is what a hash lookup found out.
type hashResult int

const (
	hashUnusable hashResult = iota // malformed: try the other table, else not found
	hashAbsent                     // the table says the name is not defined
	hashFound
)

// dynDefined is the file offset of symbol among file's defined dynamic
// function symbols (a versioned "name@VER" too), 0 when absent. It looks
// the name up through the file's hash table and reads the whole table only
// when the file has none.
func dynDefined(file, symbol string) uint64 {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }() // read-only
	st, err := f.Stat()
	if err != nil {
		return 0
	}
	e, err := elf.NewFile(f)
	if err != nil {
		return 0
	}
	gnu, sysv := sectionOfType(e, elf.SHT_GNU_HASH), sectionOfType(e, elf.SHT_HASH)
	if gnu == nil && sysv == nil {
		return dynDefinedFull(e, symbol)
	}
	// A table the file has but that does not hold (malformed, or a
	// .dynsym outside the file) finds nothing, as it would for ld.so.
	t, ok := dynTablesOf(e, f, uint64(st.Size()))
	if !ok {
		return 0
	}
	res, value := hashResult(hashUnusable), uint64(0)
	if gnu != nil {
		res, value = t.gnuLookup(gnu, symbol)
	}
	if res == hashUnusable && sysv != nil {
		res, value = t.sysvLookup(sysv, symbol)
	}
	if res != hashFound {
		return 0
	}
	return fileOffset(e, value)
}

// dynDefinedFull is dynDefined by a read of every dynamic symbol.
func dynDefinedFull(f *elf.File, symbol string) uint64 {
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0
	}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && s.Value != 0 && elf.ST_TYPE(s.Info) == elf.STT_FUNC &&
			strings.HasPrefix(s.Name, symbol) && (len(s.Name) == len(symbol) || s.Name[len(symbol)] == '@') {
			return fileOffset(f, s.Value)
		}
	}
	return 0
}

func sectionOfType(e *elf.File, typ elf.SectionType) *elf.Section {
	for _, s := range e.Sections {
		if s.Type == typ {
			return s
		}
	}
	return nil
}

// inFile: s's bytes lie within the size bytes of its file.
func inFile(s *elf.Section, size uint64) bool {
	return s.Type != elf.SHT_NOBITS && s.Offset <= size && s.Size <= size-s.Offset
}

// dynTablesOf finds .dynsym and its string table in e, read through r
// (size bytes).
func dynTablesOf(e *elf.File, r io.ReaderAt, size uint64) (dynTables, bool) {
	sym := sectionOfType(e, elf.SHT_DYNSYM)
	if sym == nil || sym.Link == 0 || int(sym.Link) >= len(e.Sections) {
		return dynTables{}, false
	}
	str := e.Sections[sym.Link]
	if !inFile(sym, size) || !inFile(str, size) || sym.Flags&elf.SHF_COMPRESSED != 0 || str.Flags&elf.SHF_COMPRESSED != 0 {
		return dynTables{}, false
	}
	t := dynTables{r: r, bo: e.ByteOrder, class64: e.Class == elf.ELFCLASS64, sym: sym, str: str, size: size}
	t.nsyms = sym.Size / t.entSize()
	return t, true
}

func (t *dynTables) entSize() uint64 {
	if t.class64 {
		return 24
	}
	return 16
}

// u32 reads the i-th 32-bit word of s's contents at byte offset at; false
// past the section's end or on a read error.
func (t *dynTables) u32(s *elf.Section, at, i uint64) (uint32, bool) {
	off := at + 4*i
	if i >= 1<<40 || off+4 > s.Size || off+4 < off {
		return 0, false
	}
	var b [4]byte
	if _, err := t.r.ReadAt(b[:], int64(s.Offset+off)); err != nil {
		return 0, false
	}
	return t.bo.Uint32(b[:]), true
}

// defines checks whether dynamic symbol i is a defined function named
// name ("name@VER" too), and returns its value.
func (t *dynTables) defines(i uint64, name string) (uint64, bool) {
	if i >= t.nsyms {
		return 0, false
	}
	var ent [24]byte
	es := t.entSize()
	if _, err := t.r.ReadAt(ent[:es], int64(t.sym.Offset+i*es)); err != nil {
		return 0, false
	}
	var nameOff uint32
	var info byte
	var shndx uint16
	var value uint64
	if t.class64 {
		nameOff, info, shndx, value = t.bo.Uint32(ent[0:]), ent[4], t.bo.Uint16(ent[6:]), t.bo.Uint64(ent[8:])
	} else {
		nameOff, value, info, shndx = t.bo.Uint32(ent[0:]), uint64(t.bo.Uint32(ent[4:])), ent[12], t.bo.Uint16(ent[14:])
	}
	if elf.SectionIndex(shndx) == elf.SHN_UNDEF || value == 0 || elf.ST_TYPE(info) != elf.STT_FUNC ||
		uint64(nameOff) >= t.str.Size {
		return 0, false
	}
	// The name and the byte after it (NUL, or '@' of a version), within
	// the string table.
	n := min(uint64(len(name))+1, t.str.Size-uint64(nameOff))
	b := make([]byte, n)
	if _, err := t.r.ReadAt(b, int64(t.str.Offset+uint64(nameOff))); err != nil {
		return 0, false
	}
	if uint64(len(b)) != uint64(len(name))+1 || !bytes.Equal(b[:len(name)], []byte(name)) || (b[len(name)] != 0 && b[len(name)] != '@') {
		return 0, false
	}
	return value, true
}

// gnuHash is the DT_GNU_HASH hash of name (Bernstein's, h*33 + c).
func gnuHash(name string) uint32 {
	h := uint32(5381)
	for i := 0; i < len(name); i++ {
		h = h*33 + uint32(name[i])
	}
	return h
}

// gnuLookup looks name up through the DT_GNU_HASH table in section h:
// header {nbuckets, symoffset, bloom words, bloom shift}, the Bloom filter
// (one word per ELF class), the buckets, then one hash per symbol from
// symoffset on, its low bit set on the last of a chain.
func (t *dynTables) gnuLookup(h *elf.Section, name string) (hashResult, uint64) {
	if !inFile(h, t.size) || h.Flags&elf.SHF_COMPRESSED != 0 {
		return hashUnusable, 0
	}
	var hdr [4]uint32
	for i := range hdr {
		v, ok := t.u32(h, 0, uint64(i))
		if !ok {
			return hashUnusable, 0
		}
		hdr[i] = v
	}
	nbuckets, symoffset, bloomWords, shift := uint64(hdr[0]), uint64(hdr[1]), uint64(hdr[2]), hdr[3]
	word := uint64(4)
	if t.class64 {
		word = 8
	}
	buckets := 16 + bloomWords*word
	chains := buckets + 4*nbuckets
	if nbuckets == 0 || bloomWords == 0 || chains > h.Size || symoffset > t.nsyms {
		return hashUnusable, 0
	}
	hash := gnuHash(name)
	// Bloom filter: two bits of the hash's word must both be set.
	bits := uint32(word * 8)
	wi := uint64(hash/bits) % bloomWords
	var b [8]byte
	if _, err := t.r.ReadAt(b[:word], int64(h.Offset+16+wi*word)); err != nil {
		return hashUnusable, 0
	}
	bw := uint64(t.bo.Uint32(b[:]))
	if t.class64 {
		bw = t.bo.Uint64(b[:])
	}
	mask := uint64(1)<<(hash%bits) | uint64(1)<<((hash>>shift)%bits)
	if bw&mask != mask {
		return hashAbsent, 0
	}
	first, ok := t.u32(h, buckets, uint64(hash)%nbuckets)
	if !ok {
		return hashUnusable, 0
	}
	if first == 0 {
		return hashAbsent, 0
	}
	if uint64(first) < symoffset {
		return hashUnusable, 0
	}
	// The chain runs from the bucket's first symbol to an entry with its
	// low bit set; one that runs past .dynsym or the section is malformed.
	for i := uint64(first); ; i++ {
		if i >= t.nsyms {
			return hashUnusable, 0
		}
		ch, ok := t.u32(h, chains, i-symoffset)
		if !ok {
			return hashUnusable, 0
		}
		if ch|1 == hash|1 {
			if v, ok := t.defines(i, name); ok {
				return hashFound, v
			}
		}
		if ch&1 != 0 {
			return hashAbsent, 0
		}
	}
}

// sysvHash is the DT_HASH (System V ABI) hash of name.
func sysvHash(name string) uint32 {
	var h uint32
	for i := 0; i < len(name); i++ {
		h = h<<4 + uint32(name[i])
		g := h & 0xf0000000
		h ^= g >> 24
		h &^= g
	}
	return h
}

// sysvLookup looks name up through the DT_HASH table in section h:
// {nbucket, nchain}, the buckets, then the chain, one word per symbol.
func (t *dynTables) sysvLookup(h *elf.Section, name string) (hashResult, uint64) {
	if !inFile(h, t.size) || h.Flags&elf.SHF_COMPRESSED != 0 {
		return hashUnusable, 0
	}
	nbucket, ok1 := t.u32(h, 0, 0)
	nchain, ok2 := t.u32(h, 0, 1)
	if !ok1 || !ok2 || nbucket == 0 || 8+4*(uint64(nbucket)+uint64(nchain)) > h.Size {
		return hashUnusable, 0
	}
	chains := 8 + 4*uint64(nbucket)
	i, ok := t.u32(h, 8, uint64(sysvHash(name)%nbucket))
	// At most nchain steps: a longer chain loops.
	for steps := uint32(0); ok && i != 0; steps++ {
		if steps >= nchain || i >= nchain {
			return hashUnusable, 0
		}
		if v, found := t.defines(uint64(i), name); found {
			return hashFound, v
		}
		i, ok = t.u32(h, chains, uint64(i))
	}
	if !ok {
		return hashUnusable, 0
	}
	return hashAbsent, 0
}
