package tracer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// A thread that spins in user space (a CUDA sync in spin mode, an NCCL
// proxy's busy wait, a `while not flag` loop) never shows a user stack
// pointer in /proc/PID/task/TID/syscall. Its stack is then taken by one
// perf sample of the thread itself: a task-clock event on that thread
// alone that samples its user registers and the top of its user stack
// after spinSamplePeriod of its CPU time, read once from the event's ring
// and closed. It is taken only on demand (a hang, a dump), for a thread
// found running; nothing runs per traced event.

const (
	// spinSamplePeriod: the thread's CPU time before the sample, ns.
	spinSamplePeriod = 200_000
	// spinSampleWait bounds the wait for the sample: a thread that is
	// running gets its sample within a few ms even on a loaded machine.
	spinSampleWait = 200 * time.Millisecond
	// spinStackBytes: the top of the user stack copied with the sample.
	spinStackBytes = 16 << 10
	// spinRingPages: data pages of the event's ring (one sample fits).
	spinRingPages = 8
)

// x86-64 perf register numbers (asm/perf_regs.h): BP, SP, IP, sampled in
// this order.
const (
	perfRegBP = 6
	perfRegSP = 7
	perfRegIP = 8
)

// errNoSample: the thread took no CPU time while waited for.
var errNoSample = errors.New("no sample: the thread did not run")

// spinningStack is the native stack of a thread found running in user
// space, from a sample (nativeStack's answer: frames, no syscall, or why
// there are none).
func (t *Tracer) spinningStack(pid uint32, dir string) ([]event.Frame, string, string) {
	tid, err := strconv.ParseUint(filepath.Base(dir), 10, 32)
	if err != nil {
		return nil, "", "running in user space: bad task " + dir
	}
	frames, err := t.sampleStack(pid, uint32(tid))
	if err != nil {
		return nil, "", "running in user space: " + err.Error()
	}
	return frames, "", ""
}

// sampleStack walks the user stack of thread tid of pid from one perf
// sample taken while it runs.
func (t *Tracer) sampleStack(pid, tid uint32) ([]event.Frame, error) {
	ip, sp, stack, err := sampleUser(tid)
	if err != nil {
		return nil, err
	}
	ips := t.walkStack(pid, ip, sp, stack)
	frames, _ := t.syms.frames(pid, 0, ips, nil)
	return frames, nil
}

// sampleUser takes one sample of tid's user registers and stack.
func sampleUser(tid uint32) (ip, sp uint64, stack []byte, err error) {
	attr := unix.PerfEventAttr{
		Type:              unix.PERF_TYPE_SOFTWARE,
		Config:            unix.PERF_COUNT_SW_TASK_CLOCK,
		Sample:            spinSamplePeriod,
		Sample_type:       unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_REGS_USER | unix.PERF_SAMPLE_STACK_USER,
		Bits:              unix.PerfBitExcludeHv,
		Wakeup:            1,
		Sample_regs_user:  1<<perfRegBP | 1<<perfRegSP | 1<<perfRegIP,
		Sample_stack_user: spinStackBytes,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, int(tid), -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("perf event on tid %d: %w", tid, err)
	}
	defer unix.Close(fd)
	page := unix.Getpagesize()
	ring, err := unix.Mmap(fd, 0, page*(1+spinRingPages), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("perf ring of tid %d: %w", tid, err)
	}
	defer func() { _ = unix.Munmap(ring) }()
	deadline := time.Now().Add(spinSampleWait)
	for {
		if rec := firstSample(ring, page); rec != nil {
			return parseUserSample(rec)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, 0, nil, errNoSample
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, 0, nil, fmt.Errorf("perf ring of tid %d: %w", tid, err)
		}
	}
}

// firstSample is the body of the first PERF_RECORD_SAMPLE in the ring (nil
// while there is none).
func firstSample(ring []byte, page int) []byte {
	head := atomic.LoadUint64((*uint64)(unsafe.Pointer(&ring[1024]))) // perf_event_mmap_page.data_head
	data := ring[page:]
	for pos := uint64(0); pos+8 <= head && pos+8 <= uint64(len(data)); {
		typ := binary.LittleEndian.Uint32(data[pos:])
		size := uint64(binary.LittleEndian.Uint16(data[pos+6:]))
		if size < 8 || pos+size > uint64(len(data)) {
			return nil
		}
		if typ == unix.PERF_RECORD_SAMPLE {
			return data[pos+8 : pos+size]
		}
		pos += size
	}
	return nil
}

// parseUserSample reads a sample's pid/tid, user registers and stack.
func parseUserSample(b []byte) (ip, sp uint64, stack []byte, err error) {
	le := binary.LittleEndian
	const regsAt = 8 // after pid, tid
	if len(b) < regsAt+8 {
		return 0, 0, nil, errors.New("short perf sample")
	}
	if abi := le.Uint64(b[regsAt:]); abi == 0 {
		return 0, 0, nil, errors.New("perf sample without user registers (a kernel thread)")
	}
	if len(b) < regsAt+8+3*8+8 {
		return 0, 0, nil, errors.New("short perf sample")
	}
	sp, ip = le.Uint64(b[regsAt+8+8:]), le.Uint64(b[regsAt+8+16:])
	at := regsAt + 8 + 3*8
	size := le.Uint64(b[at:])
	at += 8
	if size == 0 || uint64(len(b)) < uint64(at)+size+8 {
		return 0, 0, nil, errors.New("perf sample without a user stack")
	}
	dyn := le.Uint64(b[uint64(at)+size:])
	// A copy: the ring is unmapped once the sample is read.
	return ip, sp, append([]byte(nil), b[at:uint64(at)+min(dyn, size)]...), nil
}
