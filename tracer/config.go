package tracer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ProbeSet selects how much of the CUDA driver API is probed.
type ProbeSet string

const (
	// ProbesFull probes every launch entry point as well: exact gap ends,
	// at the cost of one uprobe hit per kernel launch.
	ProbesFull ProbeSet = "full"
	// ProbesLite leaves out the per-launch probes (cuLaunch*, cuGraphLaunch);
	// enqueues are seen through copies, memsets, collectives and syncs.
	ProbesLite ProbeSet = "lite"
	// ProbesNull attaches exactly what ProbesFull attaches, to programs
	// that return at once. It records nothing: it measures the raw cost of
	// the probes themselves (the traps), the floor under ProbesFull's cost.
	ProbesNull ProbeSet = "null"
	// ProbesAuto attaches lite's probes for good and the per-launch probes
	// only while SetLaunchProbes(true) holds: full's detail in sampled
	// windows at about lite's cost.
	ProbesAuto ProbeSet = "auto"
)

// Config configures a Tracer. The zero value is valid: every field has a
// default (see withDefaults).
type Config struct {
	Probes           ProbeSet      // default full
	SyscallThreshold time.Duration // default 50µs; also the runqueue/off-CPU threshold
	LibCUDA, LibNCCL string        // explicit library paths; default: found in each traced process's /proc/PID/maps
	RingBufferBytes  int           // default 4 MiB; rounded up to a power of two of at least one page
	RescanInterval   time.Duration // /proc/PID/maps rescan fallback, default 1s (mmap events trigger rescans sooner)
	// RingPoll is how often the reader looks at the ring buffer on its own
	// (the programs wake it only when a quarter of it is pending), default
	// 20ms: each look is a wake-up of the sidecar; events wait up to this
	// long.
	RingPoll time.Duration
	// CPUSampleHz is how often each CPU's timer samples the traced thread
	// running on it (its native and Python stack), default
	// DefaultCPUSampleHz; negative turns the sampler off.
	CPUSampleHz int
	Logger      *slog.Logger
}

// Defaults for a zero Config field; the sidecar's options show them.
const (
	DefaultSyscallThreshold = 50 * time.Microsecond
	DefaultRingPoll         = 20 * time.Millisecond
	DefaultCPUSampleHz      = 199
)

const (
	// The ring's data pages are mapped twice into the sidecar (so a
	// record that wraps reads as one), and both count in its RSS once
	// the ring has wrapped: 8 MiB cost 16 MiB. The reader looks every
	// RingPoll and is woken at a quarter full; 4 MiB is seconds of the
	// busiest jobs measured (8 ranks: ~0.6 MB/s of records).
	defaultRingBufferSize = 4 << 20
	defaultRescanInterval = time.Second
)

func (c Config) withDefaults() Config {
	if c.Probes == "" {
		c.Probes = ProbesFull
	}
	if c.SyscallThreshold == 0 {
		c.SyscallThreshold = DefaultSyscallThreshold
	}
	if c.RingBufferBytes == 0 {
		c.RingBufferBytes = defaultRingBufferSize
	}
	if c.RescanInterval == 0 {
		c.RescanInterval = defaultRescanInterval
	}
	if c.RingPoll <= 0 {
		c.RingPoll = DefaultRingPoll
	}
	if c.CPUSampleHz == 0 {
		c.CPUSampleHz = DefaultCPUSampleHz
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With("component", "tracer")
	return c
}

// Validate returns every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	switch c.Probes {
	case "", ProbesFull, ProbesLite, ProbesNull, ProbesAuto:
	default:
		errs = append(errs, fmt.Errorf("probes: unknown probe set %q (want %q, %q, %q or %q)", c.Probes, ProbesAuto, ProbesFull, ProbesLite, ProbesNull))
	}
	if c.SyscallThreshold < 0 {
		errs = append(errs, fmt.Errorf("syscall threshold: %v is negative", c.SyscallThreshold))
	}
	if c.RingBufferBytes < 0 || c.RingBufferBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("ring buffer: %d bytes out of range (0..1GiB)", c.RingBufferBytes))
	}
	if c.CPUSampleHz > 10000 {
		errs = append(errs, fmt.Errorf("cpu sample rate: %d Hz out of range (at most 10000; negative turns sampling off)", c.CPUSampleHz))
	}
	if c.RescanInterval < 0 {
		errs = append(errs, fmt.Errorf("rescan interval: %v is negative", c.RescanInterval))
	}
	return errors.Join(errs...)
}

// ringSize rounds n up to a power of two no smaller than a page, as the
// kernel requires for BPF_MAP_TYPE_RINGBUF.
func ringSize(n int) uint32 {
	size := uint32(4096)
	for int(size) < n {
		size <<= 1
	}
	return size
}
