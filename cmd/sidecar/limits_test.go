package main

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestRuntimeLimits(t *testing.T) {
	procs, mem, gc := runtime.GOMAXPROCS(0), debug.SetMemoryLimit(-1), debug.SetGCPercent(100)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		debug.SetMemoryLimit(mem)
		debug.SetGCPercent(gc)
	})
	runtime.GOMAXPROCS(8)
	debug.SetMemoryLimit(math.MaxInt64)
	runtimeLimits(func(string) string { return "" })
	if got := runtime.GOMAXPROCS(0); got != maxProcs {
		t.Errorf("GOMAXPROCS %d on 8 without the variable, want %d", got, maxProcs)
	}
	if got := debug.SetMemoryLimit(-1); got != memoryLimit {
		t.Errorf("memory limit %d, want %d", got, memoryLimit)
	}
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("GOGC %d without the variable, want %d", got, gcPercent)
	}
	// The user's settings win.
	runtime.GOMAXPROCS(8)
	debug.SetMemoryLimit(math.MaxInt64)
	runtimeLimits(func(k string) string {
		return map[string]string{"GOMAXPROCS": "8", "GOMEMLIMIT": "1GiB", "GOGC": "100"}[k]
	})
	if got := runtime.GOMAXPROCS(0); got != 8 {
		t.Errorf("GOMAXPROCS %d with GOMAXPROCS=8 set, want 8", got)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("memory limit %d with GOMEMLIMIT set, want it untouched", got)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC %d with GOGC set, want it untouched", got)
	}
}
