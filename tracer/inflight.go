package tracer

import (
	"fmt"

	"github.com/gaptrace/gaptrace/event"
)

// InFlight is one call that a traced thread is inside now, as the
// programs' per-thread state (bpf/common.h, struct thread_state) holds it
// between a call's entry and its return. Reading it costs the traced job
// nothing: the state is kept for pairing anyway, and user space reads it
// from the map, on its own time.
type InFlight struct {
	PID, TID uint32
	// CUDA is the probed blocking CUDA call in flight (CUDANone: none);
	// CUDAStart when it began (Unix ns), Stream and Bytes its arguments.
	CUDA      event.CUDA
	CUDAStart int64
	// CUDAMono and SysMono: the same starts on the programs' clock
	// (CLOCK_MONOTONIC), the same value at every read while the call
	// lasts.
	CUDAMono, SysMono int64
	Stream            uint64
	Bytes             uint64
	// Syscall is the traced syscall in flight ("" when none); SysStart
	// when it began; FD its file descriptor (-1: none, or a path call).
	Syscall  string
	SysStart int64
	FD       int32
	// Feeder: the thread launched a kernel or made a blocking CUDA call
	// since it was first seen.
	Feeder bool
}

// ThreadProgress is, per traced process, the latest time (Unix ns) any of
// its threads launched a kernel or began a CUDA blocking call that has
// returned: the host's view of the device being fed.
type ThreadProgress map[uint32]int64

// InFlightCalls reads every traced thread's state: the calls in flight and
// each process's latest progress. One pass over the map (a few hundred
// entries for a job of a few processes).
func (t *Tracer) InFlightCalls() ([]InFlight, ThreadProgress, error) {
	m := t.shared[cudaMapThreads]
	if m == nil {
		return nil, nil, fmt.Errorf("thread state map not loaded")
	}
	t.mu.Lock()
	traced := make(map[uint32]bool, len(t.procs))
	for pid := range t.procs {
		traced[pid] = true
	}
	t.mu.Unlock()
	var (
		key  uint64
		st   cudaThreadState
		out  []InFlight
		prog = ThreadProgress{}
	)
	it := m.Iterate()
	for it.Next(&key, &st) {
		pid, tid := uint32(key>>32), uint32(key)
		if !traced[pid] {
			continue
		}
		f := InFlight{PID: pid, TID: tid, FD: -1, Feeder: st.LastLaunch != 0 || st.CallStart != 0}
		p := int64(st.LastLaunch)
		if st.CallDepth == 0 && st.CallStart != 0 {
			p = max(p, int64(st.CallStart))
		}
		if p > 0 {
			prog[pid] = max(prog[pid], MonotonicToUnix(p))
		} else if _, ok := prog[pid]; !ok {
			prog[pid] = 0
		}
		any := false
		if st.CallDepth > 0 && st.CallStart != 0 && st.CallFunc < uint32(event.CUDALast) {
			f.CUDA, f.CUDAStart, f.CUDAMono = event.CUDA(st.CallFunc), MonotonicToUnix(int64(st.CallStart)), int64(st.CallStart)
			f.Stream, f.Bytes = st.CallStream, st.CallBytes
			any = true
		}
		if st.ScStart != 0 {
			f.Syscall, f.SysStart, f.SysMono = syscallName(int(st.ScNr)), MonotonicToUnix(int64(st.ScStart)), int64(st.ScStart)
			if st.ScPath == 0 && int64(st.ScArg0) >= 0 && st.ScArg0 < 1<<31 {
				f.FD = int32(st.ScArg0)
			}
			any = true
		}
		if any {
			out = append(out, f)
		}
	}
	if err := it.Err(); err != nil {
		return out, prog, fmt.Errorf("read thread states: %w", err)
	}
	return out, prog, nil
}
