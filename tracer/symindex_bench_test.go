package tracer

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// largeELFs are the largest symbol tables at hand, stand-ins for
// libtorch_cpu.so: GAPTRACE_BENCH_ELF (paths separated by ':') or the
// LLVM and clang libraries a distribution installs.
func largeELFs(tb testing.TB) []string {
	var files []string
	if env := os.Getenv("GAPTRACE_BENCH_ELF"); env != "" {
		files = strings.Split(env, ":")
	} else {
		for _, pat := range []string{"/usr/lib/x86_64-linux-gnu/libLLVM*.so.1", "/usr/lib/llvm-*/lib/libclang-cpp.so.*",
			"/usr/lib/x86_64-linux-gnu/libstdc++.so.6"} {
			m, _ := filepath.Glob(pat)
			files = append(files, m...)
		}
	}
	if len(files) == 0 {
		tb.Skip("no large ELF file to read")
	}
	return files
}

// BenchmarkLoadELF is the first-use cost of a file's symbols: read the
// tables and build the index. heap-B is what the index keeps.
func BenchmarkLoadELF(b *testing.B) {
	for _, path := range largeELFs(b) {
		b.Run(filepath.Base(path), func(b *testing.B) {
			b.ReportAllocs()
			var kept uint64
			for i := 0; i < b.N; i++ {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				b.StartTimer()
				ef := loadELF(path)
				b.StopTimer()
				if ef.err != nil {
					b.Fatal(ef.err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				kept = after.HeapInuse - min(after.HeapInuse, before.HeapInuse)
				runtime.KeepAlive(ef)
				_ = ef.f.Close()
			}
			b.ReportMetric(float64(kept), "heap-B")
		})
	}
}

// BenchmarkDynDefined is the marker check on a library that does not
// define the marker (every library but one in a PyTorch process).
func BenchmarkDynDefined(b *testing.B) {
	for _, path := range largeELFs(b) {
		b.Run(filepath.Base(path), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if dynDefined(path, markerSymbol) != 0 {
					b.Fatal("marker defined")
				}
			}
		})
	}
}
