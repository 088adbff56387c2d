package tracer

import (
	"bytes"
	"fmt"
	"unsafe"

	"github.com/gaptrace/gaptrace/event"
)

// Record types (enum event_type in bpf/events.h), as bpf2go generated them.
const (
	evCUDA    = uint32(cudaEventTypeEV_CUDA)
	evNCCL    = uint32(cudaEventTypeEV_NCCL)
	evSyscall = uint32(cudaEventTypeEV_SYSCALL)
	evSched   = uint32(cudaEventTypeEV_SCHED)
	evProc    = uint32(cudaEventTypeEV_PROC)
	evFD      = uint32(cudaEventTypeEV_FD)
	evMmap    = uint32(cudaEventTypeEV_MMAP)
	evPyStack = uint32(cudaEventTypeEV_PYSTACK)
	// evSyscallPath: a syscall record followed by the path the call named.
	evSyscallPath = uint32(cudaEventTypeEV_SYSCALL_PATH)
	evCPUSample   = uint32(cudaEventTypeEV_CPU_SAMPLE)
	// evFaultRead: page faults that read a mapped file (bpf/fault.h).
	evFaultRead = uint32(cudaEventTypeEV_FAULT_READ)
	// evMarker: a framework step marker (bpf/marker.c).
	evMarker = uint32(markerEventTypeEV_MARKER)
)

// Flags of sched_event and proc_event (enum sched_flags, enum proc_flags).
const (
	schedFlagWoken    = uint32(schedSchedFlagsSCHED_F_WOKEN)
	schedFlagFile     = uint32(schedSchedFlagsSCHED_F_FILE)
	procFlagThread    = uint32(schedProcFlagsPROC_F_THREAD)
	procFlagGroupDead = uint32(schedProcFlagsPROC_F_GROUP_DEAD)
)

// The generated structs are the single source of the layouts; these names
// only pick one object's copy of each.
type (
	rawHeader  = cudaEventHdr
	rawCUDA    = cudaCudaEvent
	rawNCCL    = ncclNcclEvent
	rawSyscall = syscallsSyscallEvent
	rawSysPath = syscallsSyscallPathEvent
	rawFD      = syscallsFdEvent
	rawSched   = schedSchedEvent
	rawProc    = schedProcEvent
	rawSample  = profileCpuSampleEvent
	rawFault   = profileFaultReadEvent
	rawMarker  = markerMarkerEvent
)

var recordSizes = [...]uintptr{
	evCUDA:        unsafe.Sizeof(rawCUDA{}),
	evNCCL:        unsafe.Sizeof(rawNCCL{}),
	evSyscall:     unsafe.Sizeof(rawSyscall{}),
	evSched:       unsafe.Sizeof(rawSched{}),
	evProc:        unsafe.Sizeof(rawProc{}),
	evFD:          unsafe.Sizeof(rawFD{}),
	evMmap:        unsafe.Sizeof(rawHeader{}),
	evPyStack:     unsafe.Sizeof(rawPyStack{}),
	evSyscallPath: unsafe.Sizeof(rawSysPath{}),
	evCPUSample:   unsafe.Sizeof(rawSample{}),
	evFaultRead:   unsafe.Sizeof(rawFault{}),
	evMarker:      unsafe.Sizeof(rawMarker{}),
}

// maxKtime bounds CLOCK_MONOTONIC values (about 146 years of uptime) so
// that conversions cannot overflow on corrupt input.
const maxKtime = 1 << 62

// control tells the tracer what a record means for its own bookkeeping.
type control uint8

const (
	ctlNone        control = iota
	ctlRescan              // an executable mapping appeared in PID: rescan its maps
	ctlNewProcess          // PID forked ChildPID (a process): it is traced now
	ctlExec                // PID exec'd: its mappings are new
	ctlProcessGone         // the last thread of PID exited
	ctlFDChanged           // PID opened or closed FD: drop cached resolution
)

// decoded is the result of decoding one record.
type decoded struct {
	ev   event.Event
	emit bool // ev goes to the consumer
	ctl  control
	// stackID is the user_stacks id of ev's user stack (-1: none) and
	// spWords, for syscalls, the words at the user stack pointer.
	stackID int32
	spWords []uint64
	// ktime is the record's CLOCK_MONOTONIC time as the program wrote it,
	// and pyStack, for a Python stack record, the record itself (valid
	// until the next read): it belongs to the event that follows.
	ktime   uint64
	pyStack []byte
	// waitFDs, for a poll or select, the fds it waited on as the program
	// listed them (at most waitFDs' length), waitN how many it waited on
	// in all and waitSocks which of the listed ones were sockets (bit i:
	// waitFDs[i]).
	waitFDs   []int32
	waitN     uint32
	waitSocks uint32
	// sampleIPs, for a CPU sample, its user stack as the record holds it;
	// faultAddr, for an off-CPU block inside a page fault or a burst of
	// faults on a mapped file, the address.
	sampleIPs []uint64
	faultAddr uint64
	// faultFile: the kernel saw the fault read a regular file (mapped at
	// faultAddr by the record's time).
	faultFile bool
}

// decodeError describes a record that could not be decoded; the tracer
// counts and logs these and goes on with the next record.
type decodeError struct {
	typ  uint32
	size int
	want uintptr
}

func (e *decodeError) Error() string {
	if e.want == 0 {
		return fmt.Sprintf("decode record: unknown type %d (%d bytes)", e.typ, e.size)
	}
	return fmt.Sprintf("decode record type %d: %d bytes, want %d", e.typ, e.size, e.want)
}

// decodeRecord decodes one ring-buffer record into d. It reads the header,
// checks that the record has exactly the size of its type's struct and only
// then reinterprets the bytes; it never panics on malformed input. Times are
// converted to Unix ns here (MonotonicToUnix); fd paths, peers and comms are
// filled in later by the enricher.
func decodeRecord(rec []byte, d *decoded) error {
	*d = decoded{stackID: -1}
	if len(rec) < int(unsafe.Sizeof(rawHeader{})) {
		return &decodeError{size: len(rec), want: unsafe.Sizeof(rawHeader{})}
	}
	h := (*rawHeader)(unsafe.Pointer(&rec[0]))
	if int(h.Type) >= len(recordSizes) || recordSizes[h.Type] == 0 {
		return &decodeError{typ: h.Type, size: len(rec)}
	}
	if want := recordSizes[h.Type]; uintptr(len(rec)) != want {
		return &decodeError{typ: h.Type, size: len(rec), want: want}
	}
	if h.KtimeNs > maxKtime {
		return fmt.Errorf("decode record type %d: timestamp %d out of range", h.Type, h.KtimeNs)
	}
	ev := &d.ev
	d.ktime = h.KtimeNs
	ev.PID = uint32(h.PidTgid >> 32)
	ev.TID = uint32(h.PidTgid)
	ev.End = MonotonicToUnix(int64(h.KtimeNs))
	ev.Start = ev.End
	ev.FD = -1
	ev.PeerRank = -1
	ev.Kind = event.Kind(h.Kind)

	switch h.Type {
	case evCUDA:
		r := (*rawCUDA)(unsafe.Pointer(&rec[0]))
		if !validKind(ev.Kind, event.KindEnqueue, event.KindFree) && ev.Kind != event.KindMemcpyStaged ||
			r.Func >= uint32(event.CUDALast) || r.Dir >= uint32(event.CUDALast) {
			return fmt.Errorf("decode cuda record: kind %d func %d dir %d out of range", h.Kind, r.Func, r.Dir)
		}
		ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
		ev.CUDA = event.CUDA(r.Func)
		ev.Stream = r.Stream
		ev.Bytes = r.Bytes
		ev.Count = r.Count
		ev.Pending = r.Pending
		ev.Mark = r.Mark
		if r.LastLaunchNs != 0 {
			ev.LastLaunch = MonotonicToUnix(int64(r.LastLaunchNs))
		}
		ev.Ret = int64(r.Ret)
		ev.CopyDir = event.CUDA(r.Dir)
		d.stackID = r.StackId
		d.emit = true
	case evNCCL:
		r := (*rawNCCL)(unsafe.Pointer(&rec[0]))
		if !validKind(ev.Kind, event.KindCollective, event.KindGroupEnd) && ev.Kind != event.KindCommInit || r.Op >= uint32(event.NCCLLast) {
			return fmt.Errorf("decode nccl record: kind %d op %d out of range", h.Kind, r.Op)
		}
		ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
		ev.Op = event.NCCLOp(r.Op)
		ev.Count = r.Count
		ev.Bytes = r.Bytes
		ev.Comm = r.Comm
		ev.Stream = r.Stream
		ev.PeerRank = r.Peer
		ev.Ret = int64(r.Ret)
		d.emit = true
	case evSyscall, evSyscallPath:
		return decodeSyscall(rec, h, d)
	case evSched:
		r := (*rawSched)(unsafe.Pointer(&rec[0]))
		if ev.Kind != event.KindRunqueue && ev.Kind != event.KindOffCPU {
			return fmt.Errorf("decode sched record: kind %d out of range", h.Kind)
		}
		ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
		ev.WakerPID, ev.WakerTID = uint32(r.Waker>>32), uint32(r.Waker)
		ev.Woken = ev.Kind == event.KindRunqueue && r.Flags&schedFlagWoken != 0
		if ev.Kind == event.KindOffCPU {
			d.faultAddr = r.FaultAddr
			d.faultFile = r.Flags&schedFlagFile != 0
		}
		d.emit = true
	case evProc:
		return decodeProc(rec, h, d)
	case evFD:
		return decodeFD(rec, h, d)
	case evMmap:
		d.ctl = ctlRescan
	case evPyStack:
		d.pyStack = rec
	case evCPUSample:
		r := (*rawSample)(unsafe.Pointer(&rec[0]))
		if ev.Kind != event.KindCPUSample || r.Depth > uint32(len(r.Ips)) {
			return fmt.Errorf("decode cpu sample record: kind %d depth %d out of range", h.Kind, r.Depth)
		}
		ev.Start = ev.End
		d.sampleIPs = r.Ips[:r.Depth]
		d.emit = true
	case evFaultRead:
		return decodeFaultRead(rec, h, d)
	case evMarker:
		return decodeMarker(rec, h, d)
	}
	return nil
}

// decodeSyscall decodes a syscall record (evSyscall, evSyscallPath) into d.
func decodeSyscall(rec []byte, h *rawHeader, d *decoded) error {
	ev := &d.ev
	r := (*rawSyscall)(unsafe.Pointer(&rec[0]))
	if ev.Kind != event.KindSyscall || r.Class >= uint32(event.SysLast) {
		return fmt.Errorf("decode syscall record: kind %d class %d out of range", h.Kind, r.Class)
	}
	ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
	ev.Syscall = event.SyscallClass(r.Class)
	ev.SyscallNr = r.Nr
	ev.Name = syscallName(int(r.Nr))
	ev.FD = r.Fd
	ev.Ret = r.Ret
	if ev.Syscall == event.SysOpen {
		ev.OpenFlags = r.OpenFlags
	}
	if r.Ret > 0 && (ev.Syscall == event.SysRead || ev.Syscall == event.SysWrite || ev.Syscall == event.SysNet) {
		ev.Bytes = uint64(r.Ret)
	}
	if r.Calls > 1 && ev.Syscall == event.SysRead {
		// A run of reads of one fd by a process that feeds no GPU
		// (bpf/readrun.h): Start..End spans them, Ret and Bytes sum them.
		ev.Count = uint64(r.Calls)
	}
	ev.WakerPID, ev.WakerTID = uint32(r.Waker>>32), uint32(r.Waker)
	d.stackID = r.StackId
	d.spWords = r.SpWords[:]
	if r.WaitNfds > 0 && ev.Syscall == event.SysPoll {
		d.waitFDs = r.WaitFds[:min(int(r.WaitNfds), len(r.WaitFds))]
		d.waitN, d.waitSocks = r.WaitNfds, r.WaitSocks
	}
	if h.Type == evSyscallPath {
		// rename, unlink, truncate: the file is the path it named.
		ev.Path = cString((*rawSysPath)(unsafe.Pointer(&rec[0])).Path[:])
		ev.FD, ev.FDKind = -1, event.FDFile
	}
	d.emit = true
	return nil
}

// decodeProc decodes a process record (fork, exec, exit) into d.
func decodeProc(rec []byte, h *rawHeader, d *decoded) error {
	ev := &d.ev
	r := (*rawProc)(unsafe.Pointer(&rec[0]))
	ev.TaskComm = cString(r.Comm[:])
	switch ev.Kind {
	case event.KindFork:
		ev.IsThread = r.Flags&procFlagThread != 0
		// A new thread is known by its own id: its waits and wake-ups
		// name it, not the process.
		ev.ChildPID = r.ChildPid
		if ev.IsThread {
			ev.ChildPID = r.ChildTid
		}
		if !ev.IsThread {
			d.ctl = ctlNewProcess
		}
	case event.KindExec:
		ev.Path = cString(r.Filename[:])
		ev.Name = ev.TaskComm
		d.ctl = ctlExec
	case event.KindExit:
		if r.Flags&procFlagGroupDead != 0 {
			d.ctl = ctlProcessGone
		}
		ev.Ret = int64(r.ExitCode)
	default:
		return fmt.Errorf("decode proc record: kind %d out of range", h.Kind)
	}
	d.emit = true
	return nil
}

// decodeFD decodes an fd record (open, close) into d.
func decodeFD(rec []byte, h *rawHeader, d *decoded) error {
	ev := &d.ev
	r := (*rawFD)(unsafe.Pointer(&rec[0]))
	switch ev.Kind {
	case event.KindOpen:
		ev.Syscall = event.SysOpen
		ev.Name = "openat"
		ev.Path = cString(r.Path[:])
	case event.KindClose:
		ev.Syscall = event.SysClose
		ev.Name = "close"
	default:
		return fmt.Errorf("decode fd record: kind %d out of range", h.Kind)
	}
	ev.Start = startOf(r.StartNs, h.KtimeNs, ev.End)
	ev.FD = r.Fd
	ev.Ret = r.Ret
	if ev.Kind == event.KindOpen && r.Ret < 0 {
		ev.FD = -1 // failed open: no fd changed
		return nil
	}
	d.ctl = ctlFDChanged
	d.emit = true
	return nil
}

func validKind(k, lo, hi event.Kind) bool { return k >= lo && k <= hi }

// startOf converts an interval start; a start after the end (never written
// by the programs, possible in corrupt input) collapses to a point.
func startOf(startNs, endNs uint64, end int64) int64 {
	if startNs == 0 || startNs > endNs {
		return end
	}
	return end - int64(endNs-startNs)
}

func cString[T ~int8 | ~uint8](b []T) string {
	buf := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), len(b))
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf)
}
