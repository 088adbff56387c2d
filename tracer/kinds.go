package tracer

import (
	"unsafe"

	"github.com/gaptrace/gaptrace/event"
)

// RecordKind groups the ring's records by what handling one costs the
// sidecar: the cost model (docs/architecture.md) and the
// gaptrace.sidecar.events metric count them by these names.
type RecordKind uint8

const (
	RecLaunch    RecordKind = iota // a flushed run of kernel launches (K_ENQUEUE)
	RecCUDA                        // any other driver call: copy, memset, sync, alloc, free
	RecNCCL                        // a collective, group end, communicator creation
	RecFutex                       // a futex wait at least the threshold long
	RecSyscall                     // any other syscall at least the threshold long
	RecRunqueue                    // a runqueue wait (sched_switch)
	RecOffCPU                      // a block outside any traced call (sched_switch)
	RecPyStack                     // the Python frames of the event after it
	RecFD                          // an open or close, for the fd cache
	RecProc                        // fork, exec, exit, executable mapping
	RecSample                      // a CPU sample of a running thread
	RecOther                       // a record that did not decode
	RecMarker                      // a framework step marker (marker.go)
	RecFaultRead                   // a burst of page faults reading a mapped file
	recKinds
)

var recordKindNames = [recKinds]string{
	RecLaunch: "cuda.launch", RecCUDA: "cuda.call", RecNCCL: "nccl", RecFutex: "syscall.futex",
	RecSyscall: "syscall", RecRunqueue: "sched.runqueue", RecOffCPU: "sched.offcpu",
	RecPyStack: "python.stack", RecFD: "fd", RecProc: "proc", RecSample: "cpu.sample", RecOther: "undecodable",
	RecMarker: "marker", RecFaultRead: "fault.read",
}

func (k RecordKind) String() string {
	if k < recKinds {
		return recordKindNames[k]
	}
	return "unknown"
}

// recordKind classifies a raw record by its header alone (what the ring
// handed over, decodable or not).
func recordKind(rec []byte) RecordKind {
	if len(rec) < int(unsafe.Sizeof(rawHeader{})) {
		return RecOther
	}
	h := (*rawHeader)(unsafe.Pointer(&rec[0]))
	switch h.Type {
	case evCUDA:
		if event.Kind(h.Kind) == event.KindEnqueue {
			return RecLaunch
		}
		return RecCUDA
	case evNCCL:
		return RecNCCL
	case evSyscall, evSyscallPath:
		if len(rec) >= int(unsafe.Sizeof(rawSyscall{})) &&
			(*rawSyscall)(unsafe.Pointer(&rec[0])).Class == uint32(event.SysFutex) {
			return RecFutex
		}
		return RecSyscall
	case evSched:
		if event.Kind(h.Kind) == event.KindRunqueue {
			return RecRunqueue
		}
		return RecOffCPU
	case evPyStack:
		return RecPyStack
	case evFD:
		return RecFD
	case evProc, evMmap:
		return RecProc
	case evCPUSample:
		return RecSample
	case evMarker:
		return RecMarker
	case evFaultRead:
		return RecFaultRead
	}
	return RecOther
}
