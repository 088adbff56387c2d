package tracer

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkVDSOMiss is a CPU sample's frame in the [vdso] of a process
// whose maps were last read over mapsRereadEvery ago: what each rank of a
// job spinning on the clock cost once a second.
func BenchmarkVDSOMiss(b *testing.B) {
	root := b.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	own, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		b.Skip(err)
	}
	maps := string(own) + "7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]\n"
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644); err != nil {
		b.Fatal(err)
	}
	s := newSymbolizer()
	s.procRoot = root
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mappingOf(42, 0x7ffd1100)
	old := time.Now().Add(-2 * mapsRereadEvery)
	b.ReportAllocs()
	for b.Loop() {
		s.readAt[42] = old
		s.mappingOf(42, 0x7ffd1100)
	}
}
