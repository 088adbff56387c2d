package tracer

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// Every record type the programs write is counted under the kind the cost
// model prices it as; a record too short for its header is undecodable.
func TestRecordKind(t *testing.T) {
	recs := recordedRecords()
	futex := rawSyscall{Hdr: hdr(evSyscall, uint32(event.KindSyscall), 100, 101, tEnd), StartNs: tStart, Class: uint32(event.SysFutex)}
	offcpu := rawSched{Hdr: hdr(evSched, uint32(event.KindOffCPU), 100, 101, tEnd), StartNs: tStart}
	for name, want := range map[string]RecordKind{
		"sync": RecCUDA, "enqueue": RecLaunch, "collective": RecNCCL, "syscall": RecSyscall, "slow open": RecSyscall,
		"runqueue": RecRunqueue, "woken": RecRunqueue, "fork": RecProc, "exec": RecProc, "exit": RecProc,
		"open": RecFD, "mmap": RecProc,
	} {
		if got := recordKind(recs[name]); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if got := recordKind(asBytes(&futex)); got != RecFutex {
		t.Errorf("futex: %v", got)
	}
	if got := recordKind(asBytes(&offcpu)); got != RecOffCPU {
		t.Errorf("off-CPU: %v", got)
	}
	fault := rawFault{Hdr: hdr(evFaultRead, uint32(event.KindFaultRead), 100, 101, tEnd), StartNs: tStart, Count: 3}
	if got := recordKind(asBytes(&fault)); got != RecFaultRead {
		t.Errorf("fault read: %v", got)
	}
	if got := recordKind([]byte{1, 2, 3}); got != RecOther {
		t.Errorf("3 bytes: %v", got)
	}
	for k := range recKinds {
		if k.String() == "" || k.String() == "unknown" {
			t.Errorf("kind %d has no name", k)
		}
	}
}
