package tracer

import (
	"debug/elf"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// hashLibs are libraries with a GNU hash table (and some a System V one).
func hashLibs(t *testing.T) []string {
	var files []string
	seen := map[string]bool{}
	for _, pat := range []string{"/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libLLVM-1*.so.1"} {
		m, _ := filepath.Glob(pat)
		for _, p := range m {
			if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
				seen[r] = true
				files = append(files, p)
			}
		}
	}
	if len(files) == 0 {
		t.Skip("no shared library to read")
	}
	return files
}

// definedFuncs maps each defined dynamic function's name to its values
// (a versioned name may be defined at several).
func definedFuncs(t *testing.T, e *elf.File) map[string]map[uint64]bool {
	syms, err := e.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[uint64]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && s.Value != 0 && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			if out[s.Name] == nil {
				out[s.Name] = map[uint64]bool{}
			}
			out[s.Name][s.Value] = true
		}
	}
	return out
}

// TestHashLookupMatchesFullRead: through the GNU hash table and through
// the System V one (where the file has it), every defined function of
// .dynsym is found at a value the full read has for its name, and names
// the file does not define (the marker, undefined imports, near misses)
// are absent.
func TestHashLookupMatchesFullRead(t *testing.T) {
	for _, path := range hashLibs(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			e, err := elf.NewFile(f)
			if err != nil {
				t.Fatal(err)
			}
			tabs, ok := dynTablesOf(e, f, uint64(st.Size()))
			if !ok {
				t.Fatal("no .dynsym")
			}
			funcs := definedFuncs(t, e)
			absent := []string{markerSymbol, "", "no_such_function_anywhere"}
			for name := range funcs {
				absent = append(absent, name+"_", name[:len(name)-1]+"\x01")
				if len(absent) > 200 {
					break
				}
			}
			checked := 0
			for _, typ := range []elf.SectionType{elf.SHT_GNU_HASH, elf.SHT_HASH} {
				h := sectionOfType(e, typ)
				if h == nil {
					continue
				}
				look := tabs.gnuLookup
				if typ == elf.SHT_HASH {
					look = tabs.sysvLookup
				}
				k := 0
				for name, values := range funcs { // in random order
					if k++; k > 4000 {
						break // enough for a table, on a loaded machine
					}
					res, v := look(h, name)
					if res != hashFound || !values[v] {
						t.Fatalf("%v %q: %v at %#x, the table has %v", typ, name, res, v, values)
					}
					checked++
				}
				for _, name := range absent {
					if funcs[name] != nil {
						continue
					}
					if res, v := look(h, name); res != hashAbsent {
						t.Fatalf("%v %q: %v at %#x, want absent", typ, name, res, v)
					}
				}
			}
			if checked == 0 {
				t.Fatal("no hash table")
			}
			// dynDefined answers as the full read does.
			n := 0
			for name, values := range funcs {
				if len(values) != 1 {
					continue
				}
				if got, want := dynDefined(path, name), dynDefinedFull(e, name); got != want || got == 0 {
					t.Fatalf("dynDefined %q = %#x, the full read %#x", name, got, want)
				}
				if n++; n == 20 {
					break
				}
			}
			if dynDefined(path, markerSymbol) != 0 {
				t.Fatal("marker said to be defined")
			}
			t.Logf("%d lookups", checked)
		})
	}
}

// TestHashLookupMalformed: a truncated file, a .dynsym that runs past the
// file's end and a hash header that does not hold give 0; random bytes
// in the hash table give 0 or the true answer, never a panic or another
// symbol's offset.
func TestHashLookupMalformed(t *testing.T) {
	path := hashLibs(t)[0]
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e, err := elf.NewFile(bytesReaderAt(orig))
	if err != nil {
		t.Fatal(err)
	}
	const name = "getpid"
	want := dynDefinedFull(e, name)
	if want == 0 {
		t.Skipf("%s defines no %s", path, name)
	}
	dir := t.TempDir()
	write := func(b []byte) string {
		p := filepath.Join(dir, "lib.so")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got := dynDefined(write(orig), name); got != want {
		t.Fatalf("intact copy: %#x, want %#x", got, want)
	}
	for _, n := range []int{0, 10, 64, 1000, len(orig) / 2, len(orig) - 1} {
		if got := dynDefined(write(orig[:n]), name); got != 0 {
			t.Errorf("truncated to %d bytes: %#x, want 0", n, got)
		}
	}
	// .dynsym's size past the end of the file (sh_size of its header).
	dynsym := -1
	for i, s := range e.Sections {
		if s.Type == elf.SHT_DYNSYM {
			dynsym = i
		}
	}
	shoff := binary.LittleEndian.Uint64(orig[0x28:])
	shentsize := uint64(binary.LittleEndian.Uint16(orig[0x3a:]))
	bad := append([]byte(nil), orig...)
	binary.LittleEndian.PutUint64(bad[shoff+uint64(dynsym)*shentsize+32:], uint64(len(orig))*4)
	if got := dynDefined(write(bad), name); got != 0 {
		t.Errorf(".dynsym past the end of the file: %#x, want 0", got)
	}
	h := sectionOfType(e, elf.SHT_GNU_HASH)
	if h == nil {
		t.Fatal("no GNU hash table")
	}
	// A hash table whose header does not hold (no buckets; Bloom words
	// past the section's end) finds nothing, as for the dynamic linker,
	// without a read of the whole .dynsym.
	for _, hdr := range [][2]uint32{{0, 1}, {1, 0xffffffff}} {
		bad := append([]byte(nil), orig...)
		binary.LittleEndian.PutUint32(bad[h.Offset:], hdr[0])
		binary.LittleEndian.PutUint32(bad[h.Offset+8:], hdr[1])
		// With a System V table as well, that one finds the name; with
		// both tables broken, nothing does.
		if sv := sectionOfType(e, elf.SHT_HASH); sv != nil {
			if got := dynDefined(write(bad), name); got != want {
				t.Errorf("GNU hash header %v: %#x, want %#x through DT_HASH", hdr, got, want)
			}
			binary.LittleEndian.PutUint32(bad[sv.Offset:], 0) // nbucket
		}
		if got := dynDefined(write(bad), name); got != 0 {
			t.Errorf("GNU hash header %v: %#x, want 0", hdr, got)
		}
		tabs, _ := dynTablesOf(e, bytesReaderAt(bad), uint64(len(bad)))
		if res, _ := tabs.gnuLookup(h, name); res != hashUnusable {
			t.Errorf("GNU hash header %v: %v, want unusable", hdr, res)
		}
	}
	// Random bytes over the GNU hash table: the lookup may fail or find
	// the name, never name another symbol.
	rng := rand.New(rand.NewPCG(5, 6))
	for round := 0; round < 300; round++ {
		b := append([]byte(nil), orig...)
		for k := 0; k < 1+round%8; k++ {
			at := h.Offset + rng.Uint64N(min(h.Size, 64+uint64(round)*16))
			b[at] = byte(rng.Uint32())
		}
		r := bytesReaderAt(b)
		tabs, ok := dynTablesOf(e, r, uint64(len(b)))
		if !ok {
			t.Fatal("no .dynsym")
		}
		res, v := tabs.gnuLookup(h, name)
		if res == hashFound && fileOffset(e, v) != want {
			t.Fatalf("round %d: found at %#x, want %#x", round, fileOffset(e, v), want)
		}
	}
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(b)) {
		return 0, os.ErrInvalid
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, os.ErrInvalid
	}
	return n, nil
}
