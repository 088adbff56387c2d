package tracer

import (
	"cmp"
	"debug/elf"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// refSym is a function symbol as the previous symbolization kept it.
type refSym struct {
	addr, size uint64
	name       string
}

// refIndex is the previous path's index, built with debug/elf: every
// defined function of .symtab, the MiniDebugInfo .symtab and .dynsym in
// that order, stably sorted by address, the first of an address kept.
func refIndex(t *testing.T, path string) []refSym {
	e, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var all []refSym
	add := func(syms []elf.Symbol, _ error) {
		for _, s := range syms {
			if ty := elf.ST_TYPE(s.Info); (ty != elf.STT_FUNC && ty != elf.STT_GNU_IFUNC) || s.Value == 0 || s.Section == elf.SHN_UNDEF {
				continue
			}
			name, _, _ := strings.Cut(s.Name, "@")
			size := s.Size
			if size > 1<<32-1 {
				size = 0
			}
			all = append(all, refSym{s.Value, size, name})
		}
	}
	add(e.Symbols())
	if mini, _, err := miniDebugELF(e); err == nil {
		add(mini.Symbols())
	}
	add(e.DynamicSymbols())
	slices.SortStableFunc(all, func(a, b refSym) int { return cmp.Compare(a.addr, b.addr) })
	return slices.CompactFunc(all, func(a, b refSym) bool { return a.addr == b.addr })
}

func refLookup(idx []refSym, vaddr uint64) (string, bool) {
	i := sort.Search(len(idx), func(i int) bool { return idx[i].addr > vaddr }) - 1
	if i < 0 || (idx[i].size != 0 && vaddr >= idx[i].addr+idx[i].size) {
		return "", false
	}
	return idx[i].name, true
}

// TestSymbolIndexMatchesPrevious: the radix-sorted 12-byte index answers
// every address as the previous index did: at each symbol's first and
// last byte, one past its end, and at random addresses of the file's
// loadable segments, on real files (the C library and the largest
// libraries at hand; GAPTRACE_BENCH_ELF adds more, a Go program's .symtab
// among them).
func TestSymbolIndexMatchesPrevious(t *testing.T) {
	var files []string
	for _, pat := range []string{"/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libLLVM*.so.1",
		"/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libasan.so.*"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	if env := os.Getenv("GAPTRACE_BENCH_ELF"); env != "" {
		files = append(files, strings.Split(env, ":")...)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			ef := loadELF(path)
			if ef.err != nil {
				t.Fatal(ef.err)
			}
			defer ef.f.Close()
			ref := refIndex(t, path)
			if len(ref) != len(ef.syms) {
				t.Fatalf("%d symbols, the previous index had %d", len(ef.syms), len(ref))
			}
			var probes []uint64
			for _, s := range ref {
				probes = append(probes, s.addr, s.addr+max(s.size, 1)-1, s.addr+s.size, s.addr-1)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for _, p := range ef.loads {
				for i := 0; i < 2000 && p.Memsz > 0; i++ {
					probes = append(probes, p.Vaddr+rng.Uint64N(p.Memsz))
				}
			}
			probes = append(probes, 0, 1)
			for _, a := range probes {
				if a >= ef.base+1<<32 {
					continue // no code of a file lies 4 GiB above its first function
				}
				want, wok := refLookup(ref, a)
				want = sourceName(want) // the index names a clone by its function
				got, _, ok := ef.lookupVaddr(a)
				if ok != wok || got != want {
					t.Fatalf("at %#x: %q %v, the previous index says %q %v", a, got, ok, want, wok)
				}
			}
			for _, a := range []uint64{ef.base + 1<<32, 1 << 63, ^uint64(0)} {
				if got, _, ok := ef.lookupVaddr(a); ok {
					t.Errorf("at %#x: %q, want none", a, got)
				}
			}
			t.Logf("%d symbols, %d addresses agree", len(ref), len(probes))
		})
	}
}

// TestSortSyms: the radix sort orders by offset and keeps the input
// order among equal offsets (the first table read wins an address), for
// offsets spanning 1 to 32 bits.
func TestSortSyms(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, bits := range []uint{1, 5, 11, 12, 20, 31, 32} {
		for _, n := range []int{0, 1, 10, 63, 64, 1000, 50000} {
			in := make([]elfSym, n)
			for i := range in {
				in[i] = elfSym{off: uint32(rng.Uint64N(1 << bits)), name: uint32(i)}
			}
			want := slices.Clone(in)
			slices.SortStableFunc(want, func(a, b elfSym) int { return cmp.Compare(a.off, b.off) })
			if got := sortSyms(in); !slices.Equal(got, want) {
				t.Fatalf("%d bits, %d symbols: not the stable order", bits, n)
			}
		}
	}
}
