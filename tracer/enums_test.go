package tracer

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/gaptrace/gaptrace/event"
)

// The BPF programs write values of package event (kinds, CUDA functions,
// NCCL ops, syscall classes) as C enums. Go cannot generate those C enums,
// so they are the one place values are still copied by hand; this test
// reads the enums from the BTF of the committed objects (what the kernel
// actually runs) and compares every member with its Go counterpart, both
// ways: a value added on one side only fails here.

var cEnumsOfEvent = map[string]map[string]uint64{
	"event_kind": {
		"K_ENQUEUE":       uint64(event.KindEnqueue),
		"K_MEMCPY_ASYNC":  uint64(event.KindMemcpyAsync),
		"K_MEMSET":        uint64(event.KindMemset),
		"K_MEMCPY":        uint64(event.KindMemcpy),
		"K_SYNC":          uint64(event.KindSync),
		"K_ALLOC":         uint64(event.KindAlloc),
		"K_FREE":          uint64(event.KindFree),
		"K_COLLECTIVE":    uint64(event.KindCollective),
		"K_GROUP_END":     uint64(event.KindGroupEnd),
		"K_SYSCALL":       uint64(event.KindSyscall),
		"K_RUNQUEUE":      uint64(event.KindRunqueue),
		"K_OFFCPU":        uint64(event.KindOffCPU),
		"K_FORK":          uint64(event.KindFork),
		"K_EXEC":          uint64(event.KindExec),
		"K_EXIT":          uint64(event.KindExit),
		"K_OPEN":          uint64(event.KindOpen),
		"K_CLOSE":         uint64(event.KindClose),
		"K_COMM_INIT":     uint64(event.KindCommInit),
		"K_MEMCPY_STAGED": uint64(event.KindMemcpyStaged),
		"K_CPU_SAMPLE":    uint64(event.KindCPUSample),
		"K_FAULT_READ":    uint64(event.KindFaultRead),
		"K_MARKER":        uint64(event.KindMarker),
	},
	"cuda_func": {
		"CU_LAUNCH_KERNEL":             uint64(event.CULaunchKernel),
		"CU_LAUNCH_KERNEL_EX":          uint64(event.CULaunchKernelEx),
		"CU_LAUNCH_COOPERATIVE_KERNEL": uint64(event.CULaunchCooperativeKernel),
		"CU_GRAPH_LAUNCH":              uint64(event.CUGraphLaunch),
		"CU_MEMCPY_ASYNC":              uint64(event.CUMemcpyAsync),
		"CU_MEMSET_ASYNC":              uint64(event.CUMemsetAsync),
		"CU_MEMCPY_HTOD":               uint64(event.CUMemcpyHtoD),
		"CU_MEMCPY_DTOH":               uint64(event.CUMemcpyDtoH),
		"CU_MEMCPY_OTHER":              uint64(event.CUMemcpyOther),
		"CU_STREAM_SYNC":               uint64(event.CUStreamSynchronize),
		"CU_CTX_SYNC":                  uint64(event.CUCtxSynchronize),
		"CU_EVENT_SYNC":                uint64(event.CUEventSynchronize),
		"CU_MEM_ALLOC":                 uint64(event.CUMemAlloc),
		"CU_MEM_FREE":                  uint64(event.CUMemFree),
	},
	"nccl_op": {
		"OP_ALL_REDUCE":     uint64(event.NCCLAllReduce),
		"OP_ALL_GATHER":     uint64(event.NCCLAllGather),
		"OP_REDUCE_SCATTER": uint64(event.NCCLReduceScatter),
		"OP_BROADCAST":      uint64(event.NCCLBroadcast),
		"OP_REDUCE":         uint64(event.NCCLReduce),
		"OP_SEND":           uint64(event.NCCLSend),
		"OP_RECV":           uint64(event.NCCLRecv),
	},
	"syscall_class": {
		"SC_OTHER": uint64(event.SysOther),
		"SC_READ":  uint64(event.SysRead),
		"SC_WRITE": uint64(event.SysWrite),
		"SC_FSYNC": uint64(event.SysFsync),
		"SC_NET":   uint64(event.SysNet),
		"SC_FUTEX": uint64(event.SysFutex),
		"SC_POLL":  uint64(event.SysPoll),
		"SC_SLEEP": uint64(event.SysSleep),
		"SC_OPEN":  uint64(event.SysOpen),
		"SC_CLOSE": uint64(event.SysClose),
		"SC_LAST":  uint64(event.SysLast),
	},
}

// internalMembers are C enum members with no Go counterpart by design; they
// must stay out of the range of the Go type (they never reach an event).
var internalMembers = map[string]map[string]uint64{
	"syscall_class": {"SC_MMAP": uint64(event.SysLast), "SC_UNTRACED": uint64(event.SysLast)},
}

// goCounts is how many values each Go type has above its zero value, so a
// Go value with no C member fails too.
var goCounts = map[string]int{
	"event_kind":    int(event.KindFaultRead) + 1, // and KindMarker, apart
	"cuda_func":     int(event.CUDALast) - 1,
	"nccl_op":       int(event.NCCLLast) - 1,
	"syscall_class": int(event.SysLast) + 1, // SC_OTHER..SC_CLOSE and SC_LAST
}

func TestCEnumsMatchEvent(t *testing.T) {
	objects := []string{"cuda_x86_bpfel.o", "nccl_x86_bpfel.o", "syscalls_x86_bpfel.o", "sched_x86_bpfel.o", "profile_x86_bpfel.o", "marker_x86_bpfel.o"}
	found := make(map[string]int)
	for _, obj := range objects {
		spec, err := btf.LoadSpec(obj)
		if err != nil {
			t.Fatalf("read BTF of %s: %v", obj, err)
		}
		for name, want := range cEnumsOfEvent {
			var enum *btf.Enum
			if err := spec.TypeByName(name, &enum); err != nil {
				if errors.Is(err, btf.ErrNotFound) {
					continue
				}
				t.Fatalf("%s: enum %s: %v", obj, name, err)
			}
			found[name]++
			seen := 0
			for _, m := range enum.Values {
				if lo, ok := internalMembers[name][m.Name]; ok {
					if m.Value < lo {
						t.Errorf("%s: %s.%s = %d overlaps the Go values (below %d)", obj, name, m.Name, m.Value, lo)
					}
					continue
				}
				v, ok := want[m.Name]
				if !ok {
					t.Errorf("%s: %s.%s = %d has no Go counterpart in package event (add it there and here)", obj, name, m.Name, m.Value)
					continue
				}
				seen++
				if m.Value != v {
					t.Errorf("%s: %s.%s = %d, package event says %d", obj, name, m.Name, m.Value, v)
				}
			}
			if seen != len(want) {
				t.Errorf("%s: enum %s has %d of the %d members this test knows", obj, name, seen, len(want))
			}
			if goCounts[name] != len(want) {
				t.Errorf("package event has %d values for %s, the C enum %d", goCounts[name], name, len(want))
			}
		}
	}
	for name := range cEnumsOfEvent {
		if found[name] == 0 {
			t.Errorf("enum %s in no object's BTF (named in bpf/ and forced into BTF?)", name)
		}
	}
}
