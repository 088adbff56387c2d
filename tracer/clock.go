package tracer

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// BPF timestamps come from bpf_ktime_get_ns (CLOCK_MONOTONIC); every
// consumer downstream (NVML samples, the PyTorch profiler, OTel) speaks
// CLOCK_REALTIME. This file is the only place where one becomes the other.

var (
	clockOffset     atomic.Int64 // realtime - monotonic, ns
	clockOffsetOnce sync.Once
)

// MonotonicToUnix converts a CLOCK_MONOTONIC timestamp (as written by the
// BPF programs) to Unix nanoseconds, using the most recently measured
// offset between the two clocks.
func MonotonicToUnix(ns int64) int64 {
	clockOffsetOnce.Do(remeasureClockOffset)
	return ns + clockOffset.Load()
}

// remeasureClockOffset measures realtime−monotonic. A realtime read is
// bracketed by two monotonic reads; the tightest of several brackets bounds
// the error by half its width (typically well under a microsecond), even
// when one read is preempted.
func remeasureClockOffset() {
	clockOffset.Store(measureClockOffset(16))
}

func measureClockOffset(rounds int) int64 {
	var best, bestWidth int64 = 0, -1
	var m1, r, m2 unix.Timespec
	for range rounds {
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1)
		_ = unix.ClockGettime(unix.CLOCK_REALTIME, &r)
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2)
		a, b := m1.Nano(), m2.Nano()
		if w := b - a; bestWidth < 0 || w < bestWidth {
			bestWidth = w
			best = r.Nano() - (a + w/2)
		}
	}
	return best
}

// monotonicNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonicNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// clockRemeasure bounds the drift between CLOCK_MONOTONIC and
// CLOCK_REALTIME (NTP slews realtime) that conversions can accumulate.
const clockRemeasure = 10 * time.Second
