package hang

import "fmt"

// CallKind says what a thread is inside.
type CallKind string

const (
	// Sync: cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize.
	Sync CallKind = "sync"
	// CUDA: another blocking CUDA call (a synchronous copy, an
	// allocation, a free that synchronizes).
	CUDA CallKind = "cuda"
	// Syscall: a blocking syscall.
	Syscall CallKind = "syscall"
)

// Call is one call in flight on a traced thread.
type Call struct {
	PID  uint32   `json:"pid"`
	TID  uint32   `json:"tid"`
	Kind CallKind `json:"kind"`
	// Name is the entry point or syscall ("cuStreamSynchronize", "read").
	Name string `json:"call"`
	// Since is when the call began, Unix ns.
	Since int64 `json:"since_unix_nano"`
	// Mono is the call's start as the tracer's clock took it (0: use
	// Since): the same call keeps it from tick to tick, where Since may
	// move by the nanoseconds of a clock offset measured again.
	Mono   int64  `json:"-"`
	Stream uint64 `json:"stream,omitempty"`
	Bytes  uint64 `json:"bytes,omitempty"`
	// FD and File: the syscall's file descriptor (-1: none) and what it
	// refers to (a path, "pipe:[ino]", a socket's peer address).
	FD   int32  `json:"fd,omitempty"`
	File string `json:"file,omitempty"`
	// PeerAddr and PeerPID: for a socket, the address of its other end
	// and the process that holds it, where it is on this host (0: unknown).
	PeerAddr string `json:"peer_addr,omitempty"`
	PeerPID  uint32 `json:"peer_pid,omitempty"`
	// Feeder: the thread has fed the GPU (launched or synchronized); a
	// syscall hang is judged only on such threads, as every job has
	// helper threads that wait forever by design.
	Feeder bool `json:"-"`
	// Collective is the collective the call waits for: the last one its
	// process issued on the synchronized stream. Nil for other calls.
	Collective *Collective `json:"collective,omitempty"`
}

// Collective is one collective as its issuing process saw it.
type Collective struct {
	Op   string `json:"op"`
	Comm uint64 `json:"comm"`
	// Seq counts the collectives issued on Comm before this one (from 0).
	Seq    int64  `json:"seq"`
	Bytes  uint64 `json:"bytes"`
	Stream uint64 `json:"stream"`
	// Rank and Ranks: the issuer's rank in Comm and Comm's size (-1, 0:
	// unknown).
	Rank  int32 `json:"rank"`
	Ranks int32 `json:"ranks"`
	// Issued is when it was issued, Unix ns.
	Issued int64 `json:"issued_unix_nano"`
}

// Process states as Proc.State says them.
const (
	StateRunning  = "running"
	StateSleeping = "sleeping"
	StateStopped  = "stopped"
	StateDisk     = "disk-sleep"
	StateZombie   = "zombie"
	StateExited   = "exited"
	StateUnknown  = "unknown"
)

// Proc is a process that takes part in a job: traced here, or by another
// sidecar (Sidecar set).
type Proc struct {
	PID  uint32 `json:"pid"`
	Host string `json:"host,omitempty"`
	// Sidecar names the sidecar that traces it ("" for this one).
	Sidecar string `json:"sidecar,omitempty"`
	Comm    string `json:"comm,omitempty"`
	// State is one of the State constants; "" where unknown (a remote
	// process that has not gone).
	State string `json:"state,omitempty"`
	// WChan and File: where a process in D sleeps, and the file its
	// blocked thread's syscall names.
	WChan string `json:"wchan,omitempty"`
	File  string `json:"file,omitempty"`
	// Exit: how it exited ("status 1", "signal 9 (killed)"), when known.
	Exit string `json:"exit,omitempty"`
	// Since is when it entered State (stopped, exited), Unix ns; 0 where
	// unknown.
	Since int64 `json:"since_unix_nano,omitempty"`
}

// Member is what is known of a rank's collectives on communicators of one
// size: its process and the last collective it issued on each.
type Member struct {
	Proc
	Rank  int32 `json:"rank"`
	Ranks int32 `json:"-"`
	// Seq is the last collective's sequence number (-1: none seen);
	// LastIssued when it was issued.
	Seq        int64 `json:"last_seq"`
	LastIssued int64 `json:"last_issued_unix_nano,omitempty"`
}

// GPUView is the device's own view at detection.
type GPUView struct {
	Device int `json:"device"`
	// SMActivity is the GPM SM activity of the latest window, 0..1 (-1:
	// no GPM); a collective kernel spinning on an absent peer keeps it up.
	SMActivity float64 `json:"sm_activity"`
	// Utilization is NVML's busy fraction of the same window.
	Utilization float64 `json:"utilization"`
	At          int64   `json:"at_unix_nano"`
}

// Frame is one stack frame, innermost first.
type Frame struct {
	Function string `json:"function,omitempty"`
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Addr     uint64 `json:"addr,omitempty"`
}

func (f Frame) String() string {
	switch {
	case f.Line > 0:
		return fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line)
	case f.Function != "":
		return fmt.Sprintf("%s (%s)", f.Function, f.File)
	default:
		return fmt.Sprintf("%#x (%s)", f.Addr, f.File)
	}
}

// Thread is one thread's state and stacks at a moment.
type Thread struct {
	TID   uint32 `json:"tid"`
	Comm  string `json:"comm,omitempty"`
	State string `json:"state"`
	WChan string `json:"wchan,omitempty"`
	// Syscall: the syscall it is blocked in ("" when running in user
	// space).
	Syscall string `json:"syscall,omitempty"`
	// InFlight: the probed call it is inside, if any.
	InFlight *Call `json:"in_flight,omitempty"`
	// Native frames (a walk from its user stack pointer) and Python
	// frames (its interpreter frames), innermost first.
	Native []Frame `json:"native,omitempty"`
	Python []Frame `json:"python,omitempty"`
	// Err says why a stack is missing or partial.
	Err string `json:"error,omitempty"`
}

// Stacks is every thread of one process.
type Stacks struct {
	PID     uint32   `json:"pid"`
	Comm    string   `json:"comm,omitempty"`
	State   string   `json:"state"`
	Threads []Thread `json:"threads"`
}

// Status of a Report.
const (
	Ongoing = "ongoing"
	Ended   = "ended"
)

// Report is one hang.
type Report struct {
	// Kind is always "hang": the record shares the gaps file.
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Status string `json:"status"`
	PID    uint32 `json:"pid"`
	TID    uint32 `json:"tid"`
	Rank   int32  `json:"rank"`
	Host   string `json:"host,omitempty"`
	// Reason in words, for the log line and the live view.
	Reason string `json:"reason"`
	Call   Call   `json:"waiting"`
	// Since is when the waiting call began, Detected when it was found,
	// End when it ended (0 while ongoing), Unix ns; Seconds is how long
	// it has lasted so far (to End once ended).
	Since    int64   `json:"start_unix_nano"`
	Detected int64   `json:"detected_unix_nano"`
	End      int64   `json:"end_unix_nano,omitempty"`
	Seconds  float64 `json:"seconds"`
	// Arrived and Missing: the ranks of the collective's communicator that
	// issued it and those that did not (state included).
	Arrived []Member `json:"arrived,omitempty"`
	Missing []Member `json:"missing,omitempty"`
	// Untraced: ranks of the communicator no engine reports.
	Untraced []int32  `json:"untraced,omitempty"`
	GPU      *GPUView `json:"gpu,omitempty"`
	// Stacks: every thread of every traced process at detection.
	Stacks []Stacks `json:"stacks,omitempty"`
}

// Key identifies a hang: one call on one thread.
type Key struct {
	PID, TID uint32
	Since    int64
}

func (c *Call) key() Key {
	if c.Mono != 0 {
		return Key{c.PID, c.TID, c.Mono}
	}
	return Key{c.PID, c.TID, c.Since}
}
