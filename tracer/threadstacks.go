package tracer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// Stacks of every thread of a traced process, taken on demand (a hang, a
// dump) from user space, without stopping the process: no ptrace, so a
// job already under a debugger, or stopped, is read the same way.
//
// Native: /proc/PID/task/TID/syscall gives a blocked thread's user stack
// pointer and instruction pointer. From the stack pointer the walk reads
// the stack (process_vm_readv) and takes the return addresses it finds
// before the first frame record (a saved frame pointer that points higher
// up the stack next to a return address), then follows the frame-pointer
// chain from that record. A thread running in user space at that moment
// has no such entry ("running"): its native stack comes from one perf
// sample of the thread as it runs (spinstack.go).
//
// Python: for a CPython process (the same detection and layouts as the
// BPF walk, python.go), the interpreter's thread states are walked from
// _PyRuntime; each is matched to its thread through glibc's struct pthread
// (the kernel tid at a fixed offset, checked against the process's tasks).

// ThreadStack is one thread's stacks, innermost frame first.
type ThreadStack struct {
	TID     uint32
	Comm    string
	State   string // the /proc state letter's word ("running", "sleeping", "stopped", ...)
	WChan   string
	Syscall string // the syscall it is blocked in ("" when in user space)
	Native  []event.Frame
	Python  []event.Frame
	Err     string
}

// runningTries and runningRetry: how often, and how far apart, a thread
// found running in user space is looked at again for a moment in the
// kernel (about 10 ms at most per such thread).
const (
	runningTries = 20
	runningRetry = 500 * time.Microsecond
)

// stackScan bounds the bytes of a thread's stack read for its walk.
const stackScan = 64 << 10

// pthreadTID is offsetof(struct pthread, tid) in glibc on x86-64.
const pthreadTID = 0x2d0

// ThreadStacks returns every thread's stacks of a traced (or any readable)
// process now.
func (t *Tracer) ThreadStacks(pid uint32) ([]ThreadStack, error) {
	root := filepath.Join(procRoot, strconv.Itoa(int(pid)), "task")
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("threads of pid %d: %w", pid, err)
	}
	var out []ThreadStack
	for _, e := range ents {
		tid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		ts := ThreadStack{TID: uint32(tid)}
		dir := filepath.Join(root, e.Name())
		ts.Comm, ts.State = taskStat(dir)
		if b, err := os.ReadFile(filepath.Join(dir, "wchan")); err == nil && string(b) != "0" {
			ts.WChan = string(b)
		}
		ts.Native, ts.Syscall, ts.Err = t.nativeStack(pid, dir)
		out = append(out, ts)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TID < out[j].TID })
	if py := t.pythonStacks(pid); py != nil {
		for i := range out {
			out[i].Python = py[out[i].TID]
		}
	}
	return out, nil
}

var stateWords = map[byte]string{'R': "running", 'S': "sleeping", 'D': "disk-sleep", 'T': "stopped", 't': "stopped",
	'Z': "zombie", 'X': "exited", 'I': "idle"}

// taskStat reads a task's comm and state word from its stat file.
func taskStat(dir string) (comm, state string) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return "", "exited"
	}
	s := string(b)
	open, closeAt := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closeAt < open || closeAt+2 >= len(s) {
		return "", "unknown"
	}
	w, ok := stateWords[s[closeAt+2]]
	if !ok {
		w = "unknown"
	}
	return s[open+1 : closeAt], w
}

// nativeStack walks one thread's user stack from where its syscall file
// says it is.
func (t *Tracer) nativeStack(pid uint32, dir string) (frames []event.Frame, syscall, errText string) {
	var f []string
	var b []byte
	// A thread that spins (a CUDA sync in spin or yield mode) enters the
	// kernel often: a few looks catch it there.
	for try := 0; try < runningTries; try++ {
		var err error
		if b, err = os.ReadFile(filepath.Join(dir, "syscall")); err != nil {
			return nil, "", "syscall: " + err.Error()
		}
		if f = strings.Fields(string(b)); len(f) > 0 && f[0] != "running" {
			break
		}
		time.Sleep(runningRetry)
	}
	if len(f) == 0 || f[0] == "running" {
		return t.spinningStack(pid, dir) // spinstack.go
	}
	if len(f) < 3 {
		return nil, "", "syscall: " + strings.TrimSpace(string(b))
	}
	if nr, err := strconv.Atoi(f[0]); err == nil && nr >= 0 {
		syscall = syscallName(nr)
	}
	sp, err1 := strconv.ParseUint(strings.TrimPrefix(f[len(f)-2], "0x"), 16, 64)
	pc, err2 := strconv.ParseUint(strings.TrimPrefix(f[len(f)-1], "0x"), 16, 64)
	if err1 != nil || err2 != nil || sp == 0 {
		return nil, syscall, "syscall: no user stack pointer"
	}
	stack := make([]byte, stackScan)
	n := readPartial(procMem{pid: int(pid)}, sp, stack)
	if n < 8 {
		return nil, syscall, "stack unreadable"
	}
	ips := t.walkStack(pid, pc, sp, stack[:n])
	frames, _ = t.syms.frames(pid, 0, ips, nil)
	return frames, syscall, ""
}

// readPartial reads as much of [addr, addr+len(dst)) as is mapped, in
// pages, and returns how many leading bytes it got.
func readPartial(m procMem, addr uint64, dst []byte) int {
	if m.read(addr, dst) == nil {
		return len(dst)
	}
	n := 0
	for n < len(dst) {
		end := min(len(dst), int((addr+uint64(n))/4096+1)*4096-int(addr))
		if m.read(addr+uint64(n), dst[n:end]) != nil {
			break
		}
		n = end
	}
	return n
}

// walkStack returns the return addresses of a stack read from sp: pc, the
// return addresses below the first frame record, then the frame chain.
func (t *Tracer) walkStack(pid uint32, pc, sp uint64, stack []byte) []uint64 {
	word := func(addr uint64) (uint64, bool) {
		if addr < sp || addr+8 > sp+uint64(len(stack)) {
			return 0, false
		}
		return binary.LittleEndian.Uint64(stack[addr-sp:]), true
	}
	ips := []uint64{pc}
	isRet := func(w uint64) bool { return w >= 4096 && t.syms.isReturnAddress(pid, w) }
	// The first frame record: a word that points higher up the stack,
	// followed by a return address.
	var fp uint64
	for a := sp; a+16 <= sp+uint64(len(stack)) && len(ips) < stackDepth; a += 8 {
		w, _ := word(a)
		if w > a && w < sp+uint64(len(stack)) && w%8 == 0 {
			if r, ok := word(a + 8); ok && isRet(r) {
				fp = a
				break
			}
		}
		// Code built without frame pointers (-O2) keeps none: every
		// return address up to the first record is taken, which may
		// include a stale one left by a call that returned.
		if isRet(w) {
			ips = append(ips, w)
		}
	}
	for fp != 0 && len(ips) < stackDepth {
		next, ok1 := word(fp)
		ret, ok2 := word(fp + 8)
		if !ok1 || !ok2 || !isRet(ret) {
			break
		}
		ips = append(ips, ret)
		if next <= fp {
			break
		}
		fp = next
	}
	return ips
}

// isReturnAddress says whether addr follows a call instruction in an
// executable file mapping of pid.
func (s *symbolizer) isReturnAddress(pid uint32, addr uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.mappingOf(pid, addr)
	if !ok {
		return false
	}
	ef := s.file(pid, m)
	return ef.f != nil && ef.afterCall(addr-m.start+m.off)
}

// errNotPython: the process runs no supported CPython.
var errNotPython = errors.New("not a supported CPython")

// pythonStacks walks every interpreter thread state of a CPython process:
// Python frames by tid, nil when the process is not one gaptrace reads.
func (t *Tracer) pythonStacks(pid uint32) map[uint32][]event.Frame {
	p, err := t.pyProcFor(pid)
	if err != nil || p == nil {
		return nil
	}
	t.py.mu.Lock()
	defer t.py.mu.Unlock()
	l := &p.layout
	rd := func(addr uint64) (uint64, bool) {
		var b [8]byte
		if addr < 4096 || p.mem.read(addr, b[:]) != nil {
			return 0, false
		}
		return binary.LittleEndian.Uint64(b[:]), true
	}
	out := map[uint32][]event.Frame{}
	interp, ok := rd(p.runtime + uint64(l.interpHead))
	if !ok {
		return nil
	}
	ts, ok := rd(interp + uint64(l.tstateHead))
	for n := 0; ok && ts != 0 && n < 256; n++ {
		if th, ok := rd(ts + uint64(l.tstateThreadID)); ok {
			var tb [4]byte
			if p.mem.read(th+pthreadTID, tb[:]) == nil {
				tid := binary.LittleEndian.Uint32(tb[:])
				if _, err := os.Stat(filepath.Join(procRoot, strconv.Itoa(int(pid)), "task", strconv.Itoa(int(tid)))); err == nil {
					out[tid] = p.walkUser(ts)
				}
			}
		}
		ts, ok = rd(ts + uint64(l.tstateNext))
	}
	return out
}

// pyProcFor is the process's CPython description, loaded when Python
// stacks are not on (they load it at attach otherwise).
func (t *Tracer) pyProcFor(pid uint32) (*pyProc, error) {
	s := t.py
	if s == nil {
		return nil, errNotPython
	}
	s.mu.Lock()
	p := s.procs[pid]
	s.mu.Unlock()
	return p, nil
}

// walkUser reads one thread state's frames the way py_stack does in the
// kernel and resolves them like a captured record.
func (p *pyProc) walkUser(ts uint64) []event.Frame {
	l := &p.layout
	o := l.offsets(p.runtime)
	var b [8]byte
	if p.mem.read(ts+uint64(l.tstateFrame), b[:]) != nil {
		return nil
	}
	frame := binary.LittleEndian.Uint64(b[:])
	if l.cframeFrame >= 0 && frame != 0 {
		if p.mem.read(frame+uint64(l.cframeFrame), b[:]) != nil {
			return nil
		}
		frame = binary.LittleEndian.Uint64(b[:])
	}
	rec := rawPyStack{}
	rec.Hdr.KtimeNs = uint64(monotonicNow())
	buf := make([]byte, o.FrameRead)
	for frame != 0 && int(rec.Depth) < len(rec.Code) {
		if p.mem.read(frame, buf) != nil {
			rec.Flags |= uint32(cudaPyFlagsPY_F_TRUNCATED)
			break
		}
		shim := l.frameOwner >= 0 && buf[l.frameOwner] == 3 // FRAME_OWNED_BY_CSTACK
		if !shim {
			code := le64(buf, l.frameCode)
			var fb [4]byte
			if p.mem.read(code+uint64(l.codeFirstLine), fb[:]) != nil {
				rec.Flags |= uint32(cudaPyFlagsPY_F_TRUNCATED)
				break
			}
			first := uint64(binary.LittleEndian.Uint32(fb[:]))
			var at uint32
			if l.instrIsPtr {
				at = uint32(le64(buf, l.frameInstr) - code)
			} else {
				at = binary.LittleEndian.Uint32(buf[l.frameInstr:])
			}
			rec.Code[rec.Depth] = code
			rec.Instr[rec.Depth] = first<<32 | uint64(at)
			rec.Depth++
		}
		frame = le64(buf, l.framePrev)
	}
	frames, _ := p.resolve(&rec)
	return frames
}
