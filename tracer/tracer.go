// Package tracer attaches gaptrace's BPF programs to a training process and
// its descendants and delivers a stream of event.Event.
//
// Lifecycle: New loads every BPF object (the five objects built from
// bpf/{cuda,nccl,syscalls,sched,profile,marker}.c share their maps: traced processes,
// per-thread state, the ring buffer, the drop and short-syscall counters) and
// attaches the tracepoints, which cost nothing until a process is traced,
// and the CPU sampler (one CPU-clock perf event per CPU, Config.CPUSampleHz),
// which keeps samples of traced processes only. Page faults that read a
// mapped regular file come as bursts per thread and file (bpf/fault.h,
// faultread.go: the filemap tracepoints, or bpf_find_vma before Linux
// 6.10), named by the file mapped at the first fault's address.
// Trace adds a process: its tgid goes into traced_tgids (every program checks
// that map first), and uprobes are attached, filtered to that process, on
// the libcuda/libnccl it maps and on any library whose dynamic symbols
// define PyTorch's record_function entry (marker.go: framework step
// markers). From then on the kernel adds forked children
// to traced_tgids itself, so no child runs untraced while user space catches
// up; user space then attaches the children's uprobes. Libraries mapped later
// (dlopen) are noticed through executable-mapping events and a periodic
// /proc/PID/maps rescan. Run reads the ring buffer, decodes, resolves fds and
// converts clocks. InFlightCalls reads, from user space, the calls every
// traced thread is inside now (the per-thread pairing state), and
// ThreadStacks every thread's native and Python stacks, without stopping
// the process: the hang watch's inputs, at no cost per event. Close
// detaches everything in reverse order; nothing is
// pinned, so a killed tracer leaves no probe behind either (every uprobe and
// link lives as long as the process's file descriptors).
//
// Invariants: no cilium/ebpf type leaves this package; all times leaving it
// are Unix ns (MonotonicToUnix is the one conversion); a record is only cast
// after its size matched its type.
package tracer

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/gaptrace/gaptrace/event"
)

// ProbeInfo describes one attached probe.
type ProbeInfo struct {
	Library string // library path for uprobes, "syscalls"/"sched" for tracepoints
	Symbol  string // function or tracepoint name
	Kind    string // "uprobe", "uretprobe", "tracepoint" or "tp_btf"
	PID     int    // process the uprobe is filtered to; 0 for tracepoints
}

// Stats is a snapshot of what the tracer attached and saw.
type Stats struct {
	Attached   []ProbeInfo
	Missing    []string // warnings: library or symbol not found, tracepoint absent
	RingDrops  uint64   // records lost because the ring buffer was full
	EventsRead uint64   // records read from the ring buffer
	// EventsByKind: the records read, by kind (RecordKind's names); they
	// add up to EventsRead.
	EventsByKind map[string]uint64
	DecodeErrors uint64 // records that did not decode (never expected)
	// ShortSyscalls: syscalls counted, not emitted, by class: shorter
	// than the threshold, or waits (futex, poll, sleep) of a process
	// that makes no GPU call (a data-loader worker).
	ShortSyscalls map[event.SyscallClass]uint64
	Processes     int // processes currently traced
}

// Tracer traces processes. Create it with New; it is safe for concurrent use.
type Tracer struct {
	cfg Config
	log *slog.Logger

	shared map[string]*ebpf.Map
	cuda   cudaObjects
	nccl   ncclObjects
	marker markerObjects
	sys    syscallsObjects
	sched  schedObjects
	prof   profileObjects
	tps    []link.Link // tracepoints, in attach order
	reader recordReader

	fds   *fdResolver
	comms *taskComms
	syms  *symbolizer
	// stacks reads user_stacks ids and deletes the idle ones
	// (userstacks.go); nil for a tracer fed recorded records.
	stacks *stackTable
	py     *pyStacks
	fmaps  *fileMaps // page faults: address → mapped file
	// filemapTPs: the kernel has the filemap fault tracepoints
	// (faultread.go prepareFaults).
	filemapTPs bool
	pipes      *pipeReaders
	// children: what each traced process exec'd, for waits on it.
	children *childCommands
	// multi: uprobes are attached as one uprobe_multi link per program and
	// process instead of one perf-event link per function. Decided once at
	// load; it matters because every single uprobe costs an RCU grace
	// period to detach (~0.3s each measured here), multi links one each.
	multi bool
	// pidns is the inode of the PID namespace whose pids /proc shows; the
	// BPF programs number every process in it (see bpf/common.h).
	pidns uint32

	scanMu      sync.Mutex // serializes scanProcess
	mu          sync.Mutex
	procs       map[uint32]*procState
	tpInfo      []ProbeInfo
	missing     []string
	missingSeen map[string]bool
	roots       map[uint32]bool   // pids passed to Trace
	launchOn    bool              // ProbesAuto: per-launch probes wanted now
	unmapped    map[uint32]string // root pid → warning while it maps no libcuda
	closed      bool

	eventsRead   atomic.Uint64
	eventsByKind [recKinds]atomic.Uint64
	caughtUp     atomic.Int64 // see Delivered
	decodeErrors atomic.Uint64

	rescan chan uint32
	// pyReq: processes whose mappings pyLoop reads for Python stacks,
	// apart from the scans (pyInspect).
	pyReq     chan pyRequest
	done      chan struct{}
	free      chan []event.Event // batches handed back by Recycle
	wg        sync.WaitGroup
	detaching sync.WaitGroup // uprobes of exited processes being closed
	closeOnce sync.Once
	closeErr  error
}

type procState struct {
	libs map[string]*libAttach // by library path as mapped by the process
}

type libAttach struct {
	lib   library
	path  string
	links []link.Link
	info  []ProbeInfo
	// ProbesAuto: the per-launch probes while a full window is open, and
	// the file they attach to (through the process's root).
	file       string
	launch     []link.Link
	launchInfo []ProbeInfo
}

// allLinks is every link of the library, the per-launch ones included.
func (la *libAttach) allLinks() []link.Link {
	return append(append([]link.Link(nil), la.links...), la.launch...)
}

const procRoot = "/proc"

// New loads the BPF objects and attaches the tracepoints. It fails with a
// clear error when not privileged, when the kernel has no BTF or when tracefs
// is unavailable.
func New(cfg Config) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tracer config: %w", err)
	}
	cfg = cfg.withDefaults()
	if err := checkEnvironment(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit (needs root or CAP_SYS_RESOURCE): %w", err)
	}
	t := &Tracer{
		cfg:         cfg,
		log:         cfg.Logger,
		fds:         newFDResolver(),
		comms:       &taskComms{procRoot: procRoot},
		syms:        newSymbolizer(),
		py:          newPyStacks(),
		fmaps:       newFileMaps(),
		pipes:       newPipeReaders(),
		children:    newChildCommands(),
		procs:       make(map[uint32]*procState),
		missingSeen: make(map[string]bool),
		roots:       make(map[uint32]bool),
		unmapped:    make(map[uint32]string),
		rescan:      make(chan uint32, 1024),
		pyReq:       make(chan pyRequest, 64),
		done:        make(chan struct{}),
		free:        make(chan []event.Event, 16),
	}
	// On failure, what was set up is released; the failure itself is
	// what the caller needs to see, so release errors are joined to it.
	if err := t.load(); err != nil {
		return nil, errors.Join(err, t.closeObjects())
	}
	if err := t.attachTracepoints(); err != nil {
		return nil, errors.Join(err, closeLinksParallel(t.tps), t.closeObjects())
	}
	if err := t.attachSampler(); err != nil {
		return nil, errors.Join(err, closeLinksParallel(t.tps), t.closeObjects())
	}
	rd, err := ringbuf.NewReader(t.shared[cudaMapEvents])
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open ring buffer reader: %w", err), closeLinksParallel(t.tps), t.closeObjects())
	}
	rr := newRingReader(t.shared[cudaMapEvents], rd, t.cfg.RingPoll, t.log)
	rr.caughtUp = &t.caughtUp
	t.reader = rr
	t.wg.Add(2)
	go t.rescanLoop()
	go t.pyLoop()
	if cfg.Probes == ProbesFull {
		t.wg.Add(1)
		go t.markLoop()
	}
	uprobeMode := "uprobe_multi links"
	if !t.multi {
		uprobeMode = "one perf-event uprobe per function (no uprobe_multi)"
	}
	t.log.Info("tracer loaded", "probes", string(cfg.Probes), "syscall_threshold", cfg.SyscallThreshold,
		"ring_buffer_bytes", ringSize(cfg.RingBufferBytes), "tracepoints", len(t.tpInfo), "uprobes", uprobeMode,
		"pid_namespace", pidnsName(t.pidns), "cpu_sample_hz", max(cfg.CPUSampleHz, 0))
	return t, nil
}
