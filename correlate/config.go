package correlate

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// Probe sets understood by Config.Probes.
const (
	ProbesFull = "full"
	ProbesLite = "lite"
	// ProbesAuto: lite, but for windows announced with Engine.ProbesLive
	// during which the per-launch probes were attached too.
	ProbesAuto = "auto"
)

// Config tunes the Engine. Zero values take the defaults below.
type Config struct {
	// Probes is "full" or "lite". In lite there are no KindEnqueue events:
	// a gap's end is inferred as the end of the last blocking host activity
	// of the thread that next issued a copy, collective or sync. That misses
	// the on-CPU time between that activity and the first launch (the gap is
	// shorter than the truth by it) and overstates a gap when the blocking
	// activity came after launches resumed (launches are invisible). A gap
	// that no blocking activity explains (preemptions do not count: they
	// land in launch loops as often as in stalls) ends the usual lead before
	// the next seen work, the lead from a drained sync's return to the next
	// seen work in recent steps, capped by the GPU windows. CPU-ahead stalls are found in lite only where a copy or a
	// collective was seen before the blocking activity (launches after the
	// last sync are invisible, so otherwise the queue looks empty) and the
	// next sync returned at once. In "auto" a gap inside a window announced
	// by Engine.ProbesLive is decided as full decides it, every other gap
	// as lite; step patterns ignore launch counts throughout (windows and
	// the time between them count launches differently).
	Probes string
	// MinGap: shorter gaps are micro-gaps, accounted per step, not emitted.
	MinGap time.Duration
	// SyncWaited: a sync longer than this waited for the GPU, so the queue
	// drained exactly at its return.
	SyncWaited time.Duration
	// EmitDelay: how long to wait for late events before deciding.
	EmitDelay time.Duration
	// StepWindow: fixed window length when no step period is found.
	StepWindow time.Duration
	// StepAt: a declared step site, FILE:LINE or a function name
	// (stepclock.ParseSpec); a step ends at each sync or blocking copy
	// with it on the stack. Empty: the site is found (stepsite.go).
	StepAt string
	// MaxBuffered bounds the events held for the watermark (reorder
	// queue). Past it the oldest are processed at once and counted
	// (Losses.ForcedEvents): memory stays bounded however far behind the
	// reader falls or however fast a probe floods.
	MaxBuffered int
	// NoGPUWindows: no GPU windows will come (NVML could not be opened).
	// What waits for GPM's verdict (lite's setup syncs, copies known to
	// cover no compute) is judged at once as computing, instead of after
	// 2 s of event time, by which the loop's first steps went to fixed
	// windows.
	NoGPUWindows bool
	// GPMDevices are the devices whose GPM windows will come (the
	// sampler reads GPM on them). A comm stall on one, before its first
	// GPM window, waits for GPM's verdict (up to holdMax) instead of
	// being judged without it: the sampler's first windows, those of the
	// refreshes its calibration read, arrive a few hundred ms after they
	// end, and a sidecar attached mid-run meets the job's stalls at once.
	GPMDevices []int
	// HW, when set, is called once per finished step.
	HW func(dev int, start, end int64) *event.HWContext
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultMinGap     = time.Millisecond
	DefaultSyncWaited = 50 * time.Microsecond
	DefaultEmitDelay  = 500 * time.Millisecond
	DefaultStepWindow = time.Second
	// DefaultMaxBuffered: about 17 MiB of events (272 bytes each with
	// their key), 19 times the deepest queue of the recorded H200 runs.
	DefaultMaxBuffered = 1 << 16
)

// Internal tunables; see the package comment for why each exists.
const (
	// maxEmitDelay keeps EmitDelay + an Advance period + holdMax within
	// the promise that a gap leaves the engine within about 1 s.
	maxEmitDelay = 900 * time.Millisecond
	// holdMax bounds how long a finished gap may wait for a decision that
	// needs GPU windows or a step period: EmitDelay + Advance period +
	// holdMax must stay under the 1 s emission promise, so it is measured
	// from the gap's end and stays well below 1 s.
	holdMax = int64(850 * time.Millisecond)
	// warmupMax: no period after this long → fixed windows.
	warmupMax = int64(3 * time.Second)
	// periodLost: a step open this long (and 10× the usual step) means the
	// loop stopped syncing (evaluation, a hang): back to fixed windows. Long
	// enough that a checkpoint stall stays inside its step.
	periodLost = int64(30 * time.Second)
	// windowWait: how long a step waits for GPU windows covering its end.
	windowWait = int64(1500 * time.Millisecond)
	// retain: how long timelines of non-feeder threads are kept.
	retain = int64(3 * time.Second)
	// maxPendingSteps caps steps waiting for a decision per process.
	maxPendingSteps = 1024
	// sweepEvery / forgetAfter: how often silent processes and threads
	// are looked for, and how long silence makes them forgotten.
	sweepEvery  = int64(10 * time.Second)
	forgetAfter = int64(10 * time.Minute)
	sweepProcs  = 256
	// smStallMax: GPM SM activity above this during a suspected comm stall
	// means the GPU was computing, not spinning on a peer.
	smStallMax = 0.5
	// smComputeRef: the SM activity taken for pure compute when a wait's
	// compute share must be estimated from GPM alone.
	smComputeRef = 0.8
	// spinMin: the share of a window that must be busy without SM activity
	// before a wait with no baseline is called a comm stall: most of the
	// time, so that neighbouring stalls and idle cannot add up to one.
	spinMin = 0.5
)

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	switch c.Probes {
	case "", ProbesFull, ProbesLite, ProbesAuto:
	default:
		errs = append(errs, fmt.Errorf("probes %q: want %q, %q or %q", c.Probes, ProbesFull, ProbesLite, ProbesAuto))
	}
	if c.MinGap < 0 {
		errs = append(errs, fmt.Errorf("min gap %v is negative", c.MinGap))
	}
	if c.SyncWaited < 0 {
		errs = append(errs, fmt.Errorf("sync waited %v is negative", c.SyncWaited))
	}
	if c.EmitDelay < 0 {
		errs = append(errs, fmt.Errorf("emit delay %v is negative", c.EmitDelay))
	}
	if c.EmitDelay > maxEmitDelay {
		errs = append(errs, fmt.Errorf("emit delay %v would break the 1s emission bound", c.EmitDelay))
	}
	if c.StepWindow < 0 {
		errs = append(errs, fmt.Errorf("step window %v is negative", c.StepWindow))
	}
	if c.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("max buffered %d is negative", c.MaxBuffered))
	}
	if c.StepAt != "" {
		if _, err := stepclock.ParseSpec(c.StepAt); err != nil {
			errs = append(errs, fmt.Errorf("step site: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Probes == "" {
		c.Probes = ProbesFull
	}
	if c.MinGap <= 0 {
		c.MinGap = DefaultMinGap
	}
	if c.SyncWaited <= 0 {
		c.SyncWaited = DefaultSyncWaited
	}
	if c.EmitDelay <= 0 {
		c.EmitDelay = DefaultEmitDelay
	}
	if c.StepWindow <= 0 {
		c.StepWindow = DefaultStepWindow
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// settings is the Config an Engine runs with, resolved once (defaults in,
// durations as ns). It is passed down by value: no model can change it.
type settings struct {
	lite       bool
	modes      *probeModes // ProbesAuto: the full windows; nil otherwise
	minGap     int64
	syncWaited int64
	emitDelay  int64
	stepWindow int64
	stepAt     *stepclock.Spec // declared step site, nil when none
	maxBuf     int
	hw         func(dev int, start, end int64) *event.HWContext
	log        *slog.Logger
}

func newSettings(c Config) settings {
	return settings{
		lite:       c.Probes == ProbesLite || c.Probes == ProbesAuto,
		modes:      autoModes(c.Probes),
		minGap:     int64(c.MinGap),
		syncWaited: int64(c.SyncWaited),
		emitDelay:  int64(c.EmitDelay),
		stepWindow: int64(c.StepWindow),
		stepAt:     stepSpec(c.StepAt),
		maxBuf:     c.MaxBuffered,
		hw:         c.HW,
		log:        c.Logger.With("component", "correlate"),
	}
}

// stepSpec is the declared step site, nil when none (or invalid: Validate
// reports that).
func stepSpec(v string) *stepclock.Spec {
	if v == "" {
		return nil
	}
	sp, err := stepclock.ParseSpec(v)
	if err != nil {
		return nil
	}
	return &sp
}

func autoModes(probes string) *probeModes {
	if probes == ProbesAuto {
		return &probeModes{}
	}
	return nil
}
