// Package event holds the plain data types that flow between gaptrace's
// stages: host events produced by tracer/, GPU windows produced by
// gpusample, and nothing else. It has no dependencies so that correlate/
// and its tests never pull in eBPF or NVML.
//
// All times are Unix nanoseconds (CLOCK_REALTIME). The tracer converts from
// CLOCK_MONOTONIC in exactly one place before an event leaves it.
package event

// Kind says what a host Event records.
type Kind uint8

const (
	KindInvalid Kind = iota
	// KindEnqueue: the first GPU work enqueued by a thread after a sync or a
	// blocking event (kernel launch, graph launch). Start == End. Count is the
	// number of launches the thread made since its previous flushed event.
	KindEnqueue
	// KindMemcpyAsync / KindMemset: asynchronous copy or memset enqueued
	// (point events, Bytes set, Stream set).
	KindMemcpyAsync
	KindMemset
	// KindMemcpy: a synchronous host<->device copy, Start..End.
	KindMemcpy
	// KindSync: stream/context/event synchronize, Start..End. Count is the
	// number of launches since the previous flushed event of the thread.
	KindSync
	// KindAlloc / KindFree: device memory allocation / free, Start..End.
	KindAlloc
	KindFree
	// KindCollective: an NCCL collective or p2p op issued (point event;
	// Op, Count, Bytes, Comm, Stream, PeerRank set).
	KindCollective
	// KindGroupEnd: ncclGroupEnd, Start..End.
	KindGroupEnd
	// KindSyscall: a traced syscall that lasted at least the threshold,
	// Start..End. Syscall, FD, Ret, Path/PeerAddr, Waker* set. A poll or
	// select (SysPoll) that waited only on sockets carries one of them in
	// FD, FDKind (FDSocket), Path and Peer*; other waits have FD -1.
	KindSyscall
	// KindRunqueue: the thread was runnable but not running, Start..End.
	KindRunqueue
	// KindOffCPU: the thread was blocked outside any traced syscall
	// (page fault on a mapped file, ...), Start..End.
	KindOffCPU
	// KindFork: PID/TID forked ChildPID (a process or a thread).
	KindFork
	// KindExec: PID exec'd TaskComm (Path holds the filename).
	KindExec
	// KindExit: thread TID of PID exited (PID == TID: the process); Ret
	// is its exit code as wait(2) encodes it (status << 8 | signal).
	KindExit
	// KindOpen / KindClose: fd lifecycle (Path holds the opened file).
	KindOpen
	KindClose
	// KindCommInit: an NCCL communicator was created (ncclCommInitRank*).
	// Comm is the new ncclComm_t, Count the number of ranks, PeerRank this
	// process's rank in it.
	KindCommInit
	// KindMemcpyStaged: an async copy that kept the host in the call at
	// least the tracer's copy threshold (200 µs), Start..End: the driver
	// staged pageable host memory through its own pinned buffer. It follows
	// the copy's KindMemcpyAsync (same TID, same Start). CUDA is the
	// direction: CUMemcpyHtoD, CUMemcpyDtoH or CUMemcpyOther (not decoded);
	// Bytes and Stream as on the async copy.
	KindMemcpyStaged
	// KindCPUSample: a CPU-clock timer found the thread running (Start ==
	// End): Stack is where it was, Python frames included, innermost
	// first (a sample inside CPython's garbage collector has the frame
	// "gc.collect" innermost). The tracer takes them at a fixed rate per
	// CPU (tracer.Config.CPUSampleHz), for every thread of the traced
	// processes; they say which code burned a gap charged to the CPU.
	KindCPUSample
	// KindFaultRead: the thread's page faults on one mapped regular file,
	// one after another with the thread on the CPU throughout (no CPU
	// sample of it between): from the start of the first (Start) to the
	// start of the last, or until the thread left the CPU or was sampled
	// when still inside that fault (End). Reads of the file through its
	// pages (a memory-mapped dataset touched cold); the code the thread
	// ran between two of the faults is inside the span. Count faults,
	// Path the file, Stack the first fault's code. The thread's blocks
	// inside faults are KindOffCPU events with the file's Path. Faults on
	// anonymous memory are not reported.
	KindFaultRead
)

// KindMarker: a framework step marker entered (point event): Name is the
// marker's name as the framework passed it, at most its first 64 bytes
// ("Optimizer.step#SGD.step", "ProfilerStep#12"). Its number stands apart
// from the sequence above.
const KindMarker Kind = 40

// Marker name prefixes the tracer keeps (bpf/marker.c): PyTorch's
// optimizer step region and the profiler's per-iteration region.
const (
	MarkerOptimizerStep = "Optimizer.step#"
	MarkerProfilerStep  = "ProfilerStep#"
)

var kindNames = [...]string{"invalid", "enqueue", "memcpy_async", "memset", "memcpy", "sync", "alloc", "free",
	"collective", "group_end", "syscall", "runqueue", "offcpu", "fork", "exec", "exit", "open", "close", "comm_init",
	"memcpy_staged", "cpu_sample", "fault_read"}

func (k Kind) String() string {
	if k == KindMarker {
		return "marker"
	}
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// CUDA names the driver-API function behind a CUDA event.
type CUDA uint8

const (
	CUDANone CUDA = iota
	CULaunchKernel
	CULaunchKernelEx
	CULaunchCooperativeKernel
	CUGraphLaunch
	CUMemcpyAsync // any cuMemcpy*Async
	CUMemsetAsync // any cuMemsetD*Async
	CUMemcpyHtoD  // synchronous
	CUMemcpyDtoH  // synchronous
	CUMemcpyOther // other synchronous copies (DtoD, generic cuMemcpy)
	CUStreamSynchronize
	CUCtxSynchronize
	CUEventSynchronize
	CUMemAlloc
	CUMemFree
	CUDALast
)

var cudaNames = [...]string{"", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
	"cuMemcpyAsync", "cuMemsetAsync", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpy", "cuStreamSynchronize",
	"cuCtxSynchronize", "cuEventSynchronize", "cuMemAlloc", "cuMemFree"}

func (c CUDA) String() string {
	if int(c) < len(cudaNames) {
		return cudaNames[c]
	}
	return "cuUnknown"
}

// NCCLOp names a collective or point-to-point operation.
type NCCLOp uint8

const (
	NCCLNone NCCLOp = iota
	NCCLAllReduce
	NCCLAllGather
	NCCLReduceScatter
	NCCLBroadcast
	NCCLReduce
	NCCLSend
	NCCLRecv
	NCCLLast
)

var ncclNames = [...]string{"", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send", "Recv"}

func (o NCCLOp) String() string {
	if int(o) < len(ncclNames) {
		return ncclNames[o]
	}
	return "Unknown"
}

// SyscallClass groups traced syscalls by what a blocked thread was doing.
type SyscallClass uint8

const (
	SysOther SyscallClass = iota
	SysRead               // read, pread64, readv, preadv
	SysWrite              // write, pwrite64, writev
	SysFsync              // fsync, fdatasync
	SysNet                // sendto, sendmsg, recvfrom, recvmsg, connect
	SysFutex              // futex
	SysPoll               // poll, ppoll, epoll_wait, epoll_pwait, select, pselect6
	SysSleep              // nanosleep, clock_nanosleep
	SysOpen               // openat
	SysClose              // close
	SysLast
)

var classNames = [...]string{"other", "read", "write", "fsync", "net", "futex", "poll", "sleep", "open", "close"}

func (c SyscallClass) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "other"
}

// FDKind says what an fd referred to when it was resolved.
type FDKind uint8

const (
	FDUnknown FDKind = iota
	FDFile
	FDSocket // PeerAddr set (tcp/udp "ip:port", unix path); no Path: closed before it was resolved
	FDPipe
	FDOther // eventfd, anon inode, device, ...
)

// Event is one host-side fact about a traced thread. Fields that do not
// apply to the Kind are zero.
type Event struct {
	Kind Kind
	PID  uint32 // thread group id (process)
	TID  uint32
	// Start and End are Unix ns. Point events have Start == End.
	Start int64
	End   int64

	// CUDA / NCCL
	CUDA     CUDA
	Stream   uint64 // CUstream / cudaStream_t value; 0 is the legacy default stream
	Bytes    uint64 // copy/memset/alloc size, collective payload (count*dtype size), syscall bytes
	Count    uint64 // launches aggregated (Enqueue, Sync), elements (Collective), reads in a run (Syscall, bpf/readrun.h)
	Op       NCCLOp
	Comm     uint64 // ncclComm_t value
	PeerRank int32  // send/recv peer or reduce/broadcast root; -1 when n/a
	// LastLaunch (CUDA events, full probes) is when the thread last launched
	// a kernel before this event, Unix ns; 0 when none was seen (lite sees
	// no launch). Pending (copies, memsets, blocking calls other than
	// syncs) is how many launches the thread made since its last flushed
	// event (an enqueue or a sync) and no event has counted yet: the two
	// say when the thread stopped feeding the GPU and how much it fed.
	LastLaunch int64  `json:",omitempty"`
	Pending    uint64 `json:",omitempty"`
	// Mark (KindEnqueue) is the launched function's handle (CUfunction,
	// or the CUgraphExec of a graph launch) when the tracer marked it as
	// one that clocks steps: such a launch is emitted wherever it comes.
	// Amid a burst it flushes nothing: Count is 0 and Pending the thread's
	// launches since its last flush, itself included. 0 for other
	// enqueues.
	Mark uint64 `json:",omitempty"`
	// CopyDir (KindMemcpyAsync, KindMemcpyStaged) is the copy's direction
	// where the entry point says it: CUMemcpyHtoD, CUMemcpyDtoH, or
	// CUMemcpyOther for the copies that may touch host memory without
	// saying how; CUDANone otherwise.
	CopyDir CUDA

	// Syscalls
	Syscall   SyscallClass
	SyscallNr int32
	Name      string // syscall name ("pread64"), exec'd comm, ...
	FD        int32
	Ret       int64
	// OpenFlags (SysOpen): the flags the file was opened with (O_WRONLY,
	// O_RDWR, O_CREAT, O_TRUNC, O_APPEND, ...).
	OpenFlags uint32 `json:",omitempty"`
	FDKind    FDKind
	Path      string // file path, "pipe:[ino]", or unix socket path
	PeerAddr  string // socket peer "ip:port" (tcp/udp) when FDKind == FDSocket
	PeerPID   uint32 // loopback: pid that owns the other end, when known
	WakerPID  uint32 // for blocking events: the last thread that woke this one
	WakerTID  uint32
	ChildPID  uint32 // KindFork; a wait4 that reaped a child: the child (Path: its command line)
	IsThread  bool   // KindFork: the child is a thread of PID
	// Woken (KindRunqueue): the thread was blocked inside a probed CUDA/NCCL
	// call and Start is when it was woken; it then waited for a CPU until
	// End. For a sync that slept until the GPU was done, the wait for the
	// GPU ended at Start, not at the call's return.
	Woken    bool
	TaskComm string // task comm of TID when known

	// Stack is where the thread was in its own code, innermost frame first:
	// the native stack of a blocking event (long syscall, sync) and, for a
	// Python process, its Python frames. Nil when not captured.
	Stack []Frame
	// StackTruncated: the walk stopped early (an unreadable or changing
	// frame), so the outermost callers are missing.
	StackTruncated bool
}

// Frame is one call site of a stack.
type Frame struct {
	Function string `json:"function"`
	File     string `json:"file,omitempty"` // source file (Python) or the ELF path (native)
	Line     int    `json:"line,omitempty"` // 0 when unknown
	// Source is a native frame's source file, from the ELF's DWARF line
	// table; Line is then the line in it. Empty for Python frames (File is
	// their source) and for native code built without -g.
	Source string `json:"source,omitempty"`
}

// Where is the file a person opens for this frame: the source file when
// known, else File.
func (f Frame) Where() string {
	if f.Source != "" {
		return f.Source
	}
	return f.File
}

// Duration returns End-Start in ns.
func (e *Event) Duration() int64 { return e.End - e.Start }

// WindowSource says where a GPU idle window came from.
type WindowSource uint8

const (
	SourceNVML WindowSource = iota + 1 // nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES)
	SourceGPM                          // GPM SM activity
)

func (s WindowSource) String() string {
	switch s {
	case SourceNVML:
		return "nvml"
	case SourceGPM:
		return "gpm"
	}
	return "unknown"
}

// GPUWindow is the GPU's own account of one sampling window.
type GPUWindow struct {
	Device int
	UUID   string
	Start  int64 // Unix ns
	End    int64 // Unix ns
	// IdleFraction is the fraction of [Start,End) during which no kernel ran
	// (1 - utilization.gpu for NVML; 1 - SM-busy for GPM).
	IdleFraction float64
	Source       WindowSource
	// SMActivity is GPM SM activity (0..1) when Source == SourceGPM; -1
	// when unknown. A collective spinning on a late peer keeps utilization
	// high while SM activity falls: correlate uses it to confirm comm stalls.
	SMActivity     float64
	TensorActivity float64 // 0..1, -1 when unknown
	// Skew bounds how much earlier than [Start,End) the GPM counters of
	// the window may have been taken (ns): up to one refresh period while
	// the sampler is not aligned to the counter refresh (a GPU idle when
	// sampling began shows none), 0 once it is. A window that read no SM
	// activity proves the GPU idle only up to End-Skew.
	Skew int64
}

// HWContext is the hardware state of one device over a step.
type HWContext struct {
	Device          int
	Name            string
	UUID            string
	SMClockMHz      uint32
	MaxSMClockMHz   uint32
	ThrottleReasons []string // "sw_power_cap", "hw_thermal_slowdown", ...
	TemperatureC    uint32
	SlowdownTempC   uint32
	PCIeGen         uint32
	PCIeMaxGen      uint32
	PCIeWidth       uint32
	PCIeMaxWidth    uint32
	MemUsedBytes    uint64
	MemTotalBytes   uint64
	SMActivity      float64  // mean over the step, -1 unknown
	OtherProcesses  []uint32 // PIDs on the device other than the traced ones
	XidErrors       []uint64 // Xid codes seen during the step

	// GPM means over the step (Hopper and later); -1 when unknown.
	SMOccupancy         float64 // 0..1, active warps vs the theoretical maximum
	TensorActivity      float64 // 0..1
	DRAMBandwidth       float64 // 0..1 of the peak DRAM bandwidth
	PCIeTxBytesPerSec   float64
	PCIeRxBytesPerSec   float64
	NVLinkTxBytesPerSec float64
	NVLinkRxBytesPerSec float64
}
