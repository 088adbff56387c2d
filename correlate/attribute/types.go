package attribute

import "github.com/gaptrace/gaptrace/event"

// Cause is a stable cause ID (attribute gpu.gap.cause, metric label cause).
type Cause string

const (
	CauseIORead        Cause = "io.read"
	CauseLoaderWait    Cause = "loader.wait"
	CauseIOWrite       Cause = "io.write"
	CauseNet           Cause = "net"
	CauseComm          Cause = "comm"
	CauseCUDAMemcpy    Cause = "cuda.memcpy"
	CauseCUDAAlloc     Cause = "cuda.alloc"
	CauseCPU           Cause = "cpu"
	CauseCPUContention Cause = "cpu.contention"
	CauseSleep         Cause = "sleep"
	// CauseLock: the feeder waited on a lock (a mutex, the CPython GIL)
	// that another thread of its process held while computing.
	CauseLock Cause = "lock"
	// CauseSubprocess: the feeder waited for a child process to end
	// (subprocess.run, os.system: wait4, waitid); evidence: the child's
	// command.
	CauseSubprocess Cause = "subprocess"
	CauseOther      Cause = "other"
)

// Causes lists every cause in display order.
var Causes = []Cause{CauseIORead, CauseLoaderWait, CauseIOWrite, CauseNet, CauseComm, CauseCUDAMemcpy,
	CauseCUDAAlloc, CauseCPU, CauseCPUContention, CauseSleep, CauseLock, CauseSubprocess, CauseOther}

// FileEvidence is one file a blocked thread read or wrote during a gap.
type FileEvidence struct {
	Path  string `json:"path"`
	Op    string `json:"op"` // read, write, fsync
	Bytes uint64 `json:"bytes"`
	Calls int    `json:"calls"`
	NS    int64  `json:"ns"`
}

// PeerEvidence is one socket peer a blocked thread talked to.
type PeerEvidence struct {
	Address string `json:"address"`
	PID     uint32 `json:"pid,omitempty"` // loopback: the process owning the other end
	Comm    string `json:"comm,omitempty"`
	Bytes   uint64 `json:"bytes"`
	Calls   int    `json:"calls"`
	NS      int64  `json:"ns"`
}

// WorkerEvidence says what a data-loader worker did while a feeder waited.
type WorkerEvidence struct {
	PID      uint32   `json:"pid"`
	Activity string   `json:"activity"` // "io" or "cpu"
	Files    []string `json:"files,omitempty"`
	IONS     int64    `json:"io_ns"`
}

// CollectiveEvidence describes the collective a thread waited on.
type CollectiveEvidence struct {
	Op       string `json:"op"`
	Bytes    uint64 `json:"bytes"`
	Comm     string `json:"comm"` // communicator, hex
	PeerRank int32  `json:"peer_rank,omitempty"`
	// Ranks and Rank describe the communicator (from its creation; Ranks
	// is 0 when it was created before tracing began, and Rank is then the
	// process's RANK where its environment says it, or the one rank its
	// linked group leaves). WaitingOn lists the other ranks (up to 8):
	// with two ranks, the peer a stall waited on.
	Ranks     int32   `json:"ranks,omitempty"`
	Rank      *int32  `json:"rank,omitempty"`
	WaitingOn []int32 `json:"waiting_on_ranks,omitempty"`
	Stream    string  `json:"stream,omitempty"`
	// LateRank, LatePID and LateByNS name the rank that issued the
	// collective last and how much later than this rank it did, when the
	// engine saw every rank of the communicator (one gaptrace for the
	// job's processes, or sidecars exchanging their ranks' timelines with
	// --peers): the wait is comm for that long. LateRank is nil
	// where that process's rank is unknown (a communicator linked by its
	// collectives, no RANK in the environment): LatePID still names it.
	LateRank *int32 `json:"late_rank,omitempty"`
	LatePID  uint32 `json:"late_pid,omitempty"`
	LateByNS int64  `json:"late_by_ns,omitempty"`
	// LateSidecar names the sidecar that traced the late rank when it was
	// not this one (--peers): LatePID is that rank's pid there.
	LateSidecar string `json:"late_sidecar,omitempty"`
}

// Evidence is what a user can check to believe a gap's cause.
type Evidence struct {
	Files []FileEvidence `json:"files,omitempty"`
	Peers []PeerEvidence `json:"peers,omitempty"`
	// Children are the child processes waited for (cause subprocess).
	Children   []ChildEvidence     `json:"children,omitempty"`
	Workers    []WorkerEvidence    `json:"workers,omitempty"`
	Collective *CollectiveEvidence `json:"collective,omitempty"`
	CUDACall   string              `json:"cuda_call,omitempty"`
	Syscalls   map[string]int      `json:"syscalls,omitempty"` // name -> calls
	Threads    []uint32            `json:"threads,omitempty"`  // feeder threads considered
	// LockHolders are the threads that held the lock a feeder waited on
	// (cause lock), with how long the feeder waited on each.
	LockHolders []LockHolderEvidence `json:"lock_holders,omitempty"`
	// SMActivity is the mean GPM SM activity (0..1) over a comm stall,
	// present only when GPM windows covered it: low activity while the
	// sync waited confirms the GPU was spinning on a peer, not computing.
	SMActivity *float64 `json:"sm_activity,omitempty"`
	// BaselineNS is, for a comm stall, the wait this sync showed in steps
	// without the stall (the compute the host legitimately waited for).
	BaselineNS int64 `json:"baseline_ns,omitempty"`
	// Stack is the code location behind the gap, innermost frame first:
	// the stack of the blocking call that took most of the dominant
	// cause's time or, when none was captured (the feeder computed), of
	// the sync that opened the gap. StackTruncated: its outer callers are
	// missing (the walk met unreadable memory).
	Stack          []event.Frame `json:"stack,omitempty"`
	StackTruncated bool          `json:"stack_truncated,omitempty"`
	// Copy is the async copy that kept the host in the call longest during
	// the gap (the driver staged pageable host memory), whatever cause won.
	Copy *CopyEvidence `json:"copy,omitempty"`
	// Episode is set when the gap held a host operation that moved device
	// data itself (torch.save of a CUDA state_dict: per tensor a copy to
	// the host, a sync, serialization, a write): its copies and syncs did
	// not end the gap, and its parts are here.
	Episode *EpisodeEvidence `json:"episode,omitempty"`
	// Source says how the boundaries were found: "host" (a sync that
	// waited and the next enqueue), "host+gpu" (host bounds, GPU-window
	// duration), "gpu" (window idle the host could not bound).
	Source string `json:"source"`
}

// CopyEvidence is an async copy that blocked its thread while the driver
// staged host memory that was not pinned.
type CopyEvidence struct {
	Call      string  `json:"call"`      // cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyAsync
	Direction string  `json:"direction"` // htod, dtoh, unknown
	Bytes     uint64  `json:"bytes"`
	NS        int64   `json:"ns"` // the host in the call
	GBps      float64 `json:"gb_per_s"`
	Pageable  bool    `json:"pageable"`
	Fix       string  `json:"fix,omitempty"`
}

// EpisodeEvidence splits a host operation that moved device data inside one
// gap: Kind "checkpoint" when writing File dominated (serialization between
// its writes counted as writing), else "device-copies".
type EpisodeEvidence struct {
	Kind        string `json:"kind"`
	File        string `json:"file,omitempty"`
	Copies      int    `json:"copies"`
	CopyBytes   uint64 `json:"copy_bytes"`
	CopyNS      int64  `json:"copy_ns"` // staged copies and the syncs that waited for them
	SerializeNS int64  `json:"serialize_ns"`
	Writes      int    `json:"writes"`
	WriteBytes  uint64 `json:"write_bytes"`
	WriteNS     int64  `json:"write_ns"`
	FsyncNS     int64  `json:"fsync_ns"`
}

// LockHolderEvidence is a thread that held a lock the feeder waited on.
type LockHolderEvidence struct {
	TID  uint32 `json:"tid"`
	Comm string `json:"comm,omitempty"` // its thread name when known
	NS   int64  `json:"ns"`             // waited on it
	// Doing is what it mostly did meanwhile, as its own cause: cpu
	// (computing while it held the lock), sleep, net, io.write...; File
	// and Peer the file and peer it spent longest on, when it did I/O.
	Doing Cause  `json:"doing,omitempty"`
	File  string `json:"file,omitempty"`
	Peer  string `json:"peer,omitempty"`
	// RunnableNS is how long it waited for a CPU while waited on (holding
	// the lock all the same).
	RunnableNS int64 `json:"runnable_ns,omitempty"`
	// Code is where CPU samples found it while the waiter waited.
	Code []CodeSample `json:"code,omitempty"`
	// Stack is the stack of the call it blocked in longest while waited
	// on, holding the lock (a sleep, a read: no CPU sample finds a thread
	// asleep), innermost first, at most maxHolderFrames frames
	// (StackTruncated: cut there or by the tracer).
	Stack          []event.Frame `json:"stack,omitempty"`
	StackTruncated bool          `json:"stack_truncated,omitempty"`
}

// HostOp is a host operation that explains a gap; otel/ turns each into a
// child span of the gpu.idle span.
type HostOp struct {
	Name  string            `json:"name"` // "read", "write", "fsync", "sendto", "ncclAllReduce", "cuStreamSynchronize", ...
	TID   uint32            `json:"tid"`
	Start int64             `json:"start_unix_nano"`
	End   int64             `json:"end_unix_nano"`
	Attrs map[string]string `json:"attrs,omitempty"` // file.path, network.peer.address, ...
}

// ChildEvidence is a child process a thread waited for to end.
type ChildEvidence struct {
	PID     uint32 `json:"pid,omitempty"` // 0 when the wait did not say (waitid)
	Command string `json:"command,omitempty"`
	Calls   int    `json:"calls"`
	NS      int64  `json:"ns"`
}
