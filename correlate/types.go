package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// The causes and the evidence of a gap are attribute's: the names below
// keep them where the engine's results are, for callers of Gap and Step.

// Cause is a stable cause ID (attribute gpu.gap.cause, metric label cause).
type Cause = attribute.Cause

const (
	CauseIORead        = attribute.CauseIORead
	CauseLoaderWait    = attribute.CauseLoaderWait
	CauseIOWrite       = attribute.CauseIOWrite
	CauseNet           = attribute.CauseNet
	CauseComm          = attribute.CauseComm
	CauseCUDAMemcpy    = attribute.CauseCUDAMemcpy
	CauseCUDAAlloc     = attribute.CauseCUDAAlloc
	CauseCPU           = attribute.CauseCPU
	CauseCPUContention = attribute.CauseCPUContention
	CauseSleep         = attribute.CauseSleep
	CauseLock          = attribute.CauseLock
	CauseSubprocess    = attribute.CauseSubprocess
	CauseOther         = attribute.CauseOther
)

// Causes lists every cause in display order.
var Causes = attribute.Causes

// The evidence a gap carries (attribute's types).
type (
	Evidence           = attribute.Evidence
	FileEvidence       = attribute.FileEvidence
	PeerEvidence       = attribute.PeerEvidence
	WorkerEvidence     = attribute.WorkerEvidence
	CollectiveEvidence = attribute.CollectiveEvidence
	CopyEvidence       = attribute.CopyEvidence
	EpisodeEvidence    = attribute.EpisodeEvidence
	LockHolderEvidence = attribute.LockHolderEvidence
	HostOp             = attribute.HostOp
)

// GapKind distinguishes a GPU that did nothing from one that was busy but
// not useful (a collective spinning on a late peer).
type GapKind string

const (
	GapIdle  GapKind = "idle"
	GapStall GapKind = "stall"
)

// Workload says where a traced process runs. The engine leaves it nil; the
// sidecar fills it from /proc before gaps and steps reach their sinks.
type Workload struct {
	// NSPID is the pid in the process's own PID namespace, when it differs
	// from the pid gaptrace reports (the job runs in a container whose
	// namespace gaptrace does not share).
	NSPID uint32 `json:"ns_pid,omitempty"`
	// Rank is the distributed rank from the process's RANK variable.
	Rank          *int   `json:"rank,omitempty"`
	ContainerID   string `json:"container_id,omitempty"`
	PodUID        string `json:"k8s_pod_uid,omitempty"`
	PodName       string `json:"k8s_pod_name,omitempty"`
	PodNamespace  string `json:"k8s_namespace_name,omitempty"`
	ContainerName string `json:"k8s_container_name,omitempty"`
}

// Gap is one attributed GPU idle (or stalled) interval. The JSON form is
// the --gaps-out contract.
type Gap struct {
	PID       uint32          `json:"pid"`
	TID       uint32          `json:"tid"`
	Device    int             `json:"device"`
	Step      int64           `json:"step"`
	Kind      GapKind         `json:"kind"`
	Start     int64           `json:"start_unix_nano"`
	End       int64           `json:"end_unix_nano"`
	Duration  int64           `json:"duration_ns"`
	Cause     Cause           `json:"cause"`
	Breakdown map[Cause]int64 `json:"breakdown"`
	Evidence  Evidence        `json:"evidence"`
	Ops       []HostOp        `json:"ops,omitempty"`
	Workload  *Workload       `json:"workload,omitempty"`
	// Code is the code CPU samples found running during the gap, for a
	// gap charged (in part) to cpu, cpu.contention, lock or loader.wait,
	// or without a blocking call's stack: its own thread's, each lock
	// holder's and each data-loader worker's, most sampled first within
	// each.
	Code []CodeSample `json:"code,omitempty"`
	// Probes, under the auto probe set, is the set that decided the gap:
	// "full" inside a window of per-launch probes, else "lite". Empty under
	// a fixed set (Summary.Probes names it).
	Probes string `json:"probes,omitempty"`
	// Late is true for a gap that no StepResult will carry: the step that
	// held it was already emitted, or no step holds it (it came before
	// the first). It counts in the totals and the gaps file; consumers
	// that join gaps to steps place it themselves (Losses.GapsAfterStep
	// counts the first kind). Not part of the JSON contract.
	Late bool `json:"-"`
}

// Step is one training step (or a fixed window when no period is found).
type Step struct {
	PID    uint32 `json:"pid"`
	Device int    `json:"device"`
	Number int64  `json:"step"`
	// Window is true when no step period was found and this is a fixed
	// time window.
	Window bool  `json:"window,omitempty"`
	Start  int64 `json:"start_unix_nano"`
	End    int64 `json:"end_unix_nano"`
	// IdleNS = BoundedIdleNS + MicroIdleNS; StallNS is busy-but-waiting
	// time (comm).
	IdleNS        int64            `json:"idle_ns"`
	BoundedIdleNS int64            `json:"bounded_idle_ns"`
	MicroIdleNS   int64            `json:"micro_idle_ns"`
	StallNS       int64            `json:"stall_ns"`
	IdleRatio     float64          `json:"idle_ratio"`
	ByCause       map[Cause]int64  `json:"by_cause"`
	Gaps          int              `json:"gaps"`
	Launches      uint64           `json:"launches"`
	HW            *event.HWContext `json:"hw,omitempty"`
	Workload      *Workload        `json:"workload,omitempty"`
	// ClockSource and ClockSite: the step clock that ended the step
	// (stepclock.Source*) and where (the site, or what the work pattern
	// counted); on the train.step span and in the summary's step_clock.
	ClockSource string `json:"-"`
	ClockSite   string `json:"-"`
	// ClockSettling: the work pattern ended the step while the process's
	// sited calls had not had their site checks yet (auto's first window
	// lasts until they have, so they see the launches).
	ClockSettling bool `json:"-"`
}

// Summary is the --summary-json contract, written at exit.
type Summary struct {
	WallNS     int64           `json:"wall_ns"`
	GPUIdleNS  int64           `json:"gpu_idle_ns"`
	GPUStallNS int64           `json:"gpu_stall_ns"`
	ByCause    map[Cause]int64 `json:"by_cause"`
	// Steps are the iterations found; Windows the fixed time windows that
	// stood in for steps where no step period was known (a model's setup,
	// a first iteration that compiled for seconds, a loop with no
	// pattern), counted apart: they are no iterations.
	Steps         int64  `json:"steps"`
	Windows       int64  `json:"windows,omitempty"`
	Gaps          int64  `json:"gaps"`
	DroppedEvents uint64 `json:"dropped_events"`
	// Losses are what the engine got but could not use in full. They stay
	// out of Summary's own encoding (the golden replay outputs pin it); the
	// summary file writes them beside it, zeros included.
	Losses Losses `json:"-"`
	// Probes is the probe set ("auto" from the engine, a fixed set from the
	// command); under auto, ProbesFullNS is the part of WallNS during which
	// the per-launch probes were attached.
	Probes       string `json:"probes,omitempty"`
	ProbesFullNS int64  `json:"probes_full_ns,omitempty"`
	// Sidecar is gaptrace's own cost, filled by the command at exit.
	Sidecar *SidecarCost `json:"sidecar,omitempty"`
	// Processes are the traced processes that had steps or gaps, with
	// where they run; filled by the command at exit.
	Processes []ProcessSummary `json:"processes,omitempty"`
	// CallSites are the code locations with the most idle time behind
	// their gaps; filled by the command at exit.
	CallSites []CallSiteSummary `json:"call_sites,omitempty"`
	// StepClocks: what each process's steps were counted by, most steps
	// first. Like Losses, outside Summary's own encoding; the summary
	// file writes them (step_clock).
	StepClocks []StepClock `json:"-"`
	// CPUCode is the code that burned the most of the gaps' CPU time
	// ("top code in cpu gaps"): the sites of their samples, by samples;
	// filled by the command at exit.
	CPUCode []CodeSummary `json:"cpu_code,omitempty"`
}

// CodeSummary is one code location over every gap its samples fell in.
type CodeSummary struct {
	Site     string `json:"site"`
	Function string `json:"function"`
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Samples  int64  `json:"samples"`
	Gaps     int64  `json:"gaps"`
	// Role: "feeder", "holder" or "worker", as in the gaps (the first
	// seen when a site ran in several).
	Role string `json:"role"`
	GC   bool   `json:"gc,omitempty"`
}

// Losses count what the engine received but could not use as it should,
// so that an engine that falls behind loses nothing without a count.
// Events lost before the engine are Summary.DroppedEvents.
type Losses struct {
	// LateEvents arrived after the watermark had passed their end: the
	// gaps they would have moved were decided; they served as evidence
	// only. Many mean a reader far behind the ring buffer.
	LateEvents uint64 `json:"late_events"`
	// ForcedEvents were processed before the watermark reached them: the
	// reorder queue held Config.MaxBuffered events. An event that ends
	// before them and arrives later is late.
	ForcedEvents uint64 `json:"forced_events"`
	// DroppedIntervals are a thread's oldest activity intervals dropped
	// past attribute.MaxIntervals per thread: gaps over that time see it as on-CPU.
	DroppedIntervals uint64 `json:"dropped_intervals"`
	// IncompleteSteps were emitted before every input was final (more
	// than maxPendingSteps waited): a gap or GPU window still to come
	// is missing from them.
	IncompleteSteps uint64 `json:"incomplete_steps"`
	// GapsAfterStep were delivered after the step that held them was
	// emitted: they count in the totals and the gaps file, in no step.
	GapsAfterStep uint64 `json:"gaps_after_step"`
}

// Any says whether anything was lost.
func (l Losses) Any() bool { return l != Losses{} }

// ProcessSummary names one traced process in the summary.
type ProcessSummary struct {
	PID      uint32    `json:"pid"`
	Steps    int64     `json:"steps"`
	Windows  int64     `json:"windows,omitempty"` // fixed windows, not in Steps
	Gaps     int64     `json:"gaps"`
	Workload *Workload `json:"workload,omitempty"`
}

// SidecarCost is what tracing cost the machine: gaptrace's own CPU time
// and peak resident memory (the kernel-side probe cost is paid by the
// traced threads and shows in their step rate instead).
type SidecarCost struct {
	CPUNS       int64 `json:"cpu_ns"`
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// Events: the records read from the kernel, and by kind (cuda.launch,
	// syscall.futex, sched.offcpu, ...: tracer.RecordKind).
	Events       uint64            `json:"events,omitempty"`
	EventsByKind map[string]uint64 `json:"events_by_kind,omitempty"`
}

// StepResult is a finished step together with the gaps it holds: the one
// value a consumer needs to put gaps under their step (a trace, a what-if
// estimate), so that none of them rebuilds the join.
type StepResult struct {
	Step
	// GapList holds the gaps counted in the step (Step.Gaps of them, in
	// the order they were decided), each as Sink.Gap received it.
	GapList []Gap
}

// Sink receives results as soon as they are final. Calls come from the
// goroutine that feeds the Engine. Gap comes for every gap as soon as it
// is decided, before the StepResult that carries it; a gap no step will
// carry has Late set.
type Sink interface {
	Gap(Gap)
	Step(StepResult)
}
