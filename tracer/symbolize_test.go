package tracer

import (
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// libcFuncs finds the C library this test process maps and the runtime
// addresses of some of its exported functions (one return address one byte
// into each: symbolization looks up ip-1), with every name each address
// has in .dynsym.
func libcFuncs(t testing.TB, names ...string) (string, []uint64, []map[string]bool) {
	t.Helper()
	ms, err := readExecMappings("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	var m *mapping
	for _, x := range ms {
		if strings.HasPrefix(filepath.Base(x.path), "libc.so") {
			m = x
		}
	}
	if m == nil {
		t.Skip("this test binary maps no libc.so (static build)")
	}
	f, err := elf.Open(m.path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var ips []uint64
	var aliases []map[string]bool
	for _, n := range names {
		var v uint64
		for _, s := range syms {
			if strings.SplitN(s.Name, "@", 2)[0] == n && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				v = s.Value
			}
		}
		if v == 0 {
			t.Fatalf("%s exports no %s", m.path, n)
		}
		al := map[string]bool{}
		for _, s := range syms {
			if s.Value == v {
				al[strings.SplitN(s.Name, "@", 2)[0]] = true
			}
		}
		var addr uint64
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && v >= p.Vaddr && v < p.Vaddr+p.Filesz {
				addr = m.start + (v - p.Vaddr + p.Off - m.off)
			}
		}
		ips = append(ips, addr+1)
		aliases = append(aliases, al)
	}
	return m.path, ips, aliases
}

func TestSymbolizeOwnProcess(t *testing.T) {
	s := newSymbolizer()
	defer s.close()
	libc, ips, aliases := libcFuncs(t, "getpid", "pread64", "clock_nanosleep")
	pid := uint32(os.Getpid())
	frames, trunc := s.frames(pid, 1, append(ips, 0x10), nil)
	if len(frames) != 4 || trunc {
		t.Fatalf("frames %+v truncated %v", frames, trunc)
	}
	for i := range ips {
		if !aliases[i][frames[i].Function] || frames[i].File != libc || frames[i].Line != 0 {
			t.Errorf("frame %d = %+v, want one of %v in %s", i, frames[i], aliases[i], libc)
		}
	}
	// An address no mapping holds stays an address, never a wrong name.
	if frames[3].Function != "0x10" || frames[3].File != "" {
		t.Errorf("unmapped frame = %+v", frames[3])
	}
}

func TestCallerFromStackWords(t *testing.T) {
	s := newSymbolizer()
	defer s.close()
	pid := uint32(os.Getpid())
	_, ips, _ := libcFuncs(t, "getpid", "pread64")
	// A return address into this test follows a call. The scan skips
	// small values and addresses outside executable mappings (a heap
	// pointer) and inserts the first return address after the innermost
	// frame.
	ret := uint64(callerPC(make([]uintptr, 1)))
	heap := new(uint64)
	frames, _ := s.frames(pid, 2, ips, []uint64{7, uint64(uintptr(unsafe.Pointer(heap))), ret})
	if fr, _ := s.frame(pid, ret); len(frames) != 3 || frames[1].File == "" || frames[1].File != fr.File {
		t.Fatalf("caller not recovered: %+v", frames)
	}
	// A walk that already has the caller gets nothing inserted.
	frames, _ = s.frames(pid, 3, []uint64{ips[0], ret}, []uint64{ret})
	if len(frames) != 2 {
		t.Fatalf("caller inserted twice: %+v", frames)
	}
}

// Code built without frame pointers (gcc -O2) stops the walk at the
// syscall's wrapper: the return addresses among the stack words, the
// wrapper's caller and its caller, are inserted in stack order, up to the
// first word the walk already has.
func TestCallersFromStackWords(t *testing.T) {
	s := newSymbolizer()
	defer s.close()
	pid := uint32(os.Getpid())
	_, ips, _ := libcFuncs(t, "getpid", "pread64")
	pcs := make([]uintptr, 1)
	inner := uint64(callerPC(pcs))
	outer := uint64(callerPC(pcs))
	after := uint64(callerPC(pcs))
	heap := new(uint64)
	words := []uint64{7, inner, uint64(uintptr(unsafe.Pointer(heap))), outer, inner, ips[1], after}
	frames, _ := s.frames(pid, 5, ips, words)
	if len(frames) != 4 {
		t.Fatalf("%d frames, want the walk's 2 and 2 callers: %+v", len(frames), frames)
	}
	for i, want := range []uint64{inner, outer} {
		fr, _ := s.frame(pid, want)
		if got := frames[1+i]; got.File == "" || got.Line != fr.Line || got.File != fr.File {
			t.Errorf("frame %d = %+v, want %+v", 1+i, got, fr)
		}
	}
}

func TestDeepStackIsTruncated(t *testing.T) {
	s := newSymbolizer()
	defer s.close()
	_, ips, _ := libcFuncs(t, "getpid")
	deep := make([]uint64, stackDepth)
	for i := range deep {
		deep[i] = ips[0]
	}
	frames, trunc := s.frames(uint32(os.Getpid()), 4, deep, nil)
	if len(frames) != maxStackFrames || !trunc {
		t.Errorf("%d frames, truncated %v; want %d, true", len(frames), trunc, maxStackFrames)
	}
}

func TestAfterCall(t *testing.T) {
	p := filepath.Join(t.TempDir(), "text")
	// 0..6: e8 rel32 ending at 7; 7..9: ff d0 (call *%rax) ending at 9;
	// 9..16: mov-like bytes.
	code := []byte{0x90, 0x90, 0xe8, 1, 2, 3, 4, 0xff, 0xd0, 0x48, 0x89, 0xc7, 0x90, 0x90, 0x90, 0x90}
	if err := os.WriteFile(p, code, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for off, want := range map[uint64]bool{7: true, 9: true, 12: false, 3: false, 16: false} {
		if got := afterCall(f, off); got != want {
			t.Errorf("afterCall(%d) = %v, want %v", off, got, want)
		}
	}
}

func TestParseMapsLine(t *testing.T) {
	m, ok := parseMapsLine("7f1c2a400000-7f1c2a428000 r-xp 00028000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6")
	if !ok || m.start != 0x7f1c2a400000 || m.end != 0x7f1c2a428000 || m.off != 0x28000 || m.ino != 1234 ||
		m.dev != 0xfd<<32|1 || m.path != "/usr/lib/x86_64-linux-gnu/libc.so.6" {
		t.Errorf("parsed %+v %v", m, ok)
	}
	for _, l := range []string{
		"7f1c2a400000-7f1c2a428000 r--p 00000000 fd:01 1234 /usr/lib/libc.so.6", // not executable
		"7ffd1000-7ffd3000 r-xp 00000000 00:00 0 [vdso]",                        // not a file
		"zz-7f r-xp 0 fd:01 1 /x",
		"",
	} {
		if _, ok := parseMapsLine(l); ok {
			t.Errorf("accepted %q", l)
		}
	}
}

// BenchmarkSymbolizeStack is the user-space cost of one captured stack of
// 16 frames once its files are loaded (every gap after the first at a call
// site pays this or less).
func BenchmarkSymbolizeStack(b *testing.B) {
	s := newSymbolizer()
	defer s.close()
	pid := uint32(os.Getpid())
	_, some, _ := libcFuncs(b, "getpid", "pread64", "clock_nanosleep", "read", "write", "fsync", "poll", "nanosleep")
	ips := append(append([]uint64{}, some...), some...)
	s.frames(pid, 0, ips, nil)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if fr, _ := s.frames(pid, 0, ips, nil); len(fr) != 16 {
			b.Fatal(fr)
		}
	}
}

// BenchmarkSymbolizeColdFile includes reading /proc/PID/maps and the
// symbols of the C library: what the first stack into a new file pays.
func BenchmarkSymbolizeColdFile(b *testing.B) {
	pid := uint32(os.Getpid())
	_, ips, _ := libcFuncs(b, "getpid")
	for i := 0; i < b.N; i++ {
		s := newSymbolizer()
		if fr, _ := s.frames(pid, 0, ips, nil); len(fr) != 1 {
			b.Fatal(fr)
		}
		s.close()
	}
}

// callerPC returns the return address into its caller.
//
//go:noinline
func callerPC(pcs []uintptr) uintptr {
	runtime.Callers(2, pcs)
	return pcs[0]
}

// Addresses in no file mapping (heap words among a syscall's stack words,
// JIT code) must not reread a process's maps each time: a PyTorch process
// maps thousands of regions, and rereading them per word stalled the event
// consumer for seconds. A mapping that appears is still found within
// mapsRereadEvery.
func TestMissesRereadMapsAtMostOncePerInterval(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	maps := filepath.Join(dir, "maps")
	write := func(lines ...string) {
		if err := os.WriteFile(maps, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("400000-401000 r-xp 00000000 fd:01 7 /opt/a")
	s := newSymbolizer()
	s.procRoot = root
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.mappingOf(42, 0x400100); !ok {
		t.Fatal("mapped address not found")
	}
	first := s.readAt[42]
	for range 1000 {
		if _, ok := s.mappingOf(42, 0x7fff0000); ok {
			t.Fatal("an unmapped address was found")
		}
	}
	if s.readAt[42] != first {
		t.Error("misses reread the maps within the interval")
	}
	// A library mapped later: found once the interval has passed.
	write("400000-401000 r-xp 00000000 fd:01 7 /opt/a", "500000-501000 r-xp 00000000 fd:01 8 /opt/b")
	s.readAt[42] = time.Now().Add(-2 * mapsRereadEvery)
	if m, ok := s.mappingOf(42, 0x500010); !ok || m.path != "/opt/b" {
		t.Errorf("a new mapping was not found after the interval: %+v %v", m, ok)
	}
}

// A frame in the process's [vdso] (a spin reading the clock) is in no file
// whatever the maps say later: it never rereads them, even past
// mapsRereadEvery, and an exec or exit forgets where the vdso was.
func TestVDSOFramesDoNotRereadMaps(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	maps := "400000-401000 r-xp 00000000 fd:01 7 /opt/a\n" +
		"7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]\n" +
		"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n"
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSymbolizer()
	s.procRoot = root
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.mappingOf(42, 0x400100); !ok {
		t.Fatal("mapped address not found")
	}
	old := time.Now().Add(-2 * mapsRereadEvery)
	for _, addr := range []uint64{0x7ffd1000, 0x7ffd2fff, 0xffffffffff600400} {
		s.readAt[42] = old
		if _, ok := s.mappingOf(42, addr); ok {
			t.Fatalf("%#x found in a file mapping", addr)
		}
		if !s.readAt[42].Equal(old) {
			t.Errorf("%#x in the vdso reread the maps", addr)
		}
	}
	// Outside it, a miss past the interval still rereads.
	if _, ok := s.mappingOf(42, 0x7ffd3000); ok || s.readAt[42].Equal(old) {
		t.Error("a miss outside the vdso did not reread the maps past the interval")
	}
	s.mu.Unlock()
	s.forget(42)
	s.mu.Lock()
	if len(s.vdso[42]) != 0 {
		t.Error("forget kept the vdso's place")
	}
}

// A library the process maps after its maps were read (libc, mapped by
// ld.so right after exec, while a stack of the loader's own reads was
// symbolized) is found within mapsRereadChanged once the mapping is
// reported, not only after mapsRereadEvery: every libc frame of the
// job's first second was an address.
func TestMappedCodeRereadsMapsSooner(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	maps := filepath.Join(dir, "maps")
	write := func(lines ...string) {
		if err := os.WriteFile(maps, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("400000-401000 r-xp 00000000 fd:01 7 /opt/a")
	s := newSymbolizer()
	s.procRoot = root
	if _, ok := s.mappingOf(42, 0x400100); !ok {
		t.Fatal("mapped address not found")
	}
	write("400000-401000 r-xp 00000000 fd:01 7 /opt/a", "500000-501000 r-xp 00000000 fd:01 8 /opt/libc.so.6")
	s.mapped(42)
	s.readAt[42] = time.Now().Add(-2 * mapsRereadChanged)
	if m, ok := s.mappingOf(42, 0x500010); !ok || m.path != "/opt/libc.so.6" {
		t.Errorf("a mapping reported since was not found after %v: %+v %v", mapsRereadChanged, m, ok)
	}
	// The report is used up: further misses are bounded by mapsRereadEvery.
	s.readAt[42] = time.Now().Add(-2 * mapsRereadChanged)
	first := s.readAt[42]
	if _, ok := s.mappingOf(42, 0x7fff0000); ok || s.readAt[42] != first {
		t.Error("a miss with no mapping reported since reread the maps within mapsRereadEvery")
	}
}

// TestLoadELFNamesStayInFile: the function symbols read from a file name
// the same functions debug/elf does, while what stays in memory is a few
// words per symbol, not the names (a PyTorch process maps libraries whose
// names alone are hundreds of MB).
func TestLoadELFNamesStayInFile(t *testing.T) {
	var files []string
	for _, pat := range []string{"/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libLLVM*.so.1",
		"/usr/lib/x86_64-linux-gnu/libpython3*.so.1.0", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Skip("no system library to read")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ef := loadELF(path)
			runtime.GC()
			runtime.ReadMemStats(&after)
			if ef.err != nil {
				t.Fatal(ef.err)
			}
			if len(ef.syms) < 100 {
				t.Fatalf("%d function symbols", len(ef.syms))
			}
			// 12 bytes an elfSym, beside the file's handles and tables (a
			// fixed cost, which dominates a small library's figure: libc's
			// 2,200 symbols kept 10–48 KB, the read buffer included).
			const fixed = 96 << 10
			kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			if per := (kept - fixed) / int64(len(ef.syms)); per > 16 {
				t.Errorf("%d bytes kept for %d symbols (%d per symbol beyond %d): names held in memory?", kept, len(ef.syms), per, fixed)
			}
			// Every function debug/elf names at an address is named the same
			// here (the first table's name where .symtab and .dynsym both
			// have the address).
			e, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			want := map[uint64]string{}
			for _, get := range []func() ([]elf.Symbol, error){e.Symbols, e.DynamicSymbols} {
				syms, _ := get()
				for _, s := range syms {
					if ty := elf.ST_TYPE(s.Info); (ty != elf.STT_FUNC && ty != elf.STT_GNU_IFUNC) || s.Value == 0 || s.Section == elf.SHN_UNDEF {
						continue
					}
					if _, ok := want[s.Value]; !ok {
						name, _, _ := strings.Cut(s.Name, "@")
						want[s.Value] = name
					}
				}
			}
			if len(want) != len(ef.syms) {
				t.Errorf("%d function addresses, debug/elf has %d", len(ef.syms), len(want))
			}
			checked := 0
			for i := 0; i < len(ef.syms); i += 1 + len(ef.syms)/500 {
				addr := ef.base + uint64(ef.syms[i].off)
				got, _, ok := ef.lookupVaddr(addr)
				if !ok || got != want[addr] {
					t.Fatalf("at %#x: %q, debug/elf says %q", addr, got, want[addr])
				}
				checked++
			}
			t.Logf("%d symbols, %d bytes kept, %d names checked", len(ef.syms), kept, checked)
		})
	}
}

func TestElfSymSize(t *testing.T) {
	if n := unsafe.Sizeof(elfSym{}); n != 12 {
		t.Errorf("elfSym is %d bytes, want 12 (a million of them in a PyTorch process)", n)
	}
}

// TestSampleFramesCached: a CPU sample's addresses (no stack id) are
// symbolized once per process; the second sample is answered from the
// cache with the same frames, an unmapped address is never cached, and an
// exec or exit (forget) drops the process's addresses.
func TestSampleFramesCached(t *testing.T) {
	s := newSymbolizer()
	defer s.close()
	_, ips, _ := libcFuncs(t, "getpid", "pread64")
	pid := uint32(os.Getpid())
	first, _ := s.frames(pid, 0, append(ips, 0x10), nil)
	if n := len(s.frameAt[pid]); n != 2 {
		t.Fatalf("%d addresses cached, want the 2 in libc", n)
	}
	// Poison the maps: a second sample must not need them.
	s.procs[pid] = nil
	s.readAt[pid] = time.Now()
	again, _ := s.frames(pid, 0, ips, nil)
	if len(again) != 2 || again[0] != first[0] || again[1] != first[1] {
		t.Fatalf("cached frames %+v, want %+v", again, first[:2])
	}
	s.forget(pid)
	if _, ok := s.frameAt[pid]; ok {
		t.Fatal("forget kept the process's addresses")
	}
}
