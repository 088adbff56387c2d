package tracer

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// Native stack symbolization. The BPF programs hand over return addresses
// (a frame-pointer walk, bpf/common.h user_stacks); here each one becomes a
// {function, ELF path} through the process's /proc/PID/maps and the file's
// ELF symbol tables. Symbols are cached per file version (device, inode,
// size, mtime), a process's mappings per pid until an address misses them.

// maxStackFrames bounds the frames kept per stack: the innermost are the
// ones a user acts on, and evidence stays small.
const maxStackFrames = 32

type symbolizer struct {
	procRoot string
	mu       sync.Mutex
	files    map[fileID]*elfFile
	procs    map[uint32][]*mapping
	// done caches symbolized stacks per process, stack (stackSum) and the caller
	// recovered from the stack words: a loop blocks at a handful of call
	// sites, so after the first time a stack costs one map lookup.
	done map[stackKey]symbolized
	// readAt is when a process's maps were last read: an address in no
	// file mapping (a heap word, JIT code) rereads them at most once per
	// mapsRereadEvery, not once per address.
	readAt map[uint32]time.Time
	// changed: the process mapped executable code since its maps were
	// last read (a library loaded), so an address they miss may be in it.
	changed map[uint32]bool
	// vdso is where a process's [vdso] and [vsyscall] are, from its maps:
	// code in no file, there from exec to exit. A loop that reads the
	// clock in a spin has most of its CPU samples there, and each such
	// frame reread the maps once a second per process.
	vdso map[uint32][]span
	// frameAt caches symbolized addresses per process. CPU samples have
	// no stack id, so done does not hold them, but a loop's samples land
	// on a few hundred addresses: each was a maps search, a symbol search
	// and a line lookup, ~3% of the sidecar's CPU on the loader and 8-rank
	// jobs. Only addresses inside a file mapping with their line known
	// are kept; an exec or exit forgets them.
	frameAt map[uint32]map[uint64]event.Frame
	// self is gaptrace's own executable (device as in maps, inode).
	self struct{ dev, ino uint64 }
}

// maxFramesCached bounds frameAt per process; a process past it starts
// over.
const maxFramesCached = 1 << 14

// mapsRereadEvery bounds how often a process's maps are reread for
// addresses they do not cover. A PyTorch process maps thousands of regions;
// rereading them for every stack word that is not code stalled the event
// consumer for seconds while the job imported its libraries.
const mapsRereadEvery = time.Second

// mapsRereadChanged is the bound instead once the process mapped code
// since: ld.so maps libc a few ms after exec, and a stack taken before
// (the loader's own reads) read maps without it; for a second after,
// every libc frame was an address. A PyTorch import maps hundreds of
// libraries: at most 20 rereads a second.
const mapsRereadChanged = 50 * time.Millisecond

type stackKey struct {
	pid    uint32
	sum    uint64 // stackSum of its addresses
	caller uint64
}

type symbolized struct {
	frames    []event.Frame
	truncated bool
}

// maxSymbolized bounds the symbolized-stack cache.
const maxSymbolized = 1 << 14

func newSymbolizer() *symbolizer {
	s := &symbolizer{procRoot: procRoot, files: map[fileID]*elfFile{}, procs: map[uint32][]*mapping{},
		readAt: map[uint32]time.Time{}, changed: map[uint32]bool{}, vdso: map[uint32][]span{}, done: map[stackKey]symbolized{},
		frameAt: map[uint32]map[uint64]event.Frame{}}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err == nil {
		s.self.dev = uint64(unix.Major(st.Dev))<<32 | uint64(unix.Minor(st.Dev))
		s.self.ino = st.Ino
	}
	return s
}

// forget drops what is known of pid (exec, exit).
func (s *symbolizer) forget(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, pid)
	delete(s.readAt, pid)
	delete(s.changed, pid)
	delete(s.vdso, pid)
	delete(s.frameAt, pid)
	for k := range s.done {
		if k.pid == pid {
			delete(s.done, k)
		}
	}
}

// mapped notes that pid mapped executable code: its maps may be reread
// sooner for an address they miss.
func (s *symbolizer) mapped(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.procs[pid]; ok {
		s.changed[pid] = true
	}
}

// close releases the open ELF files.
func (s *symbolizer) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		if f.f != nil {
			_ = f.f.Close() // read-only file: nothing to lose
		}
	}
	s.files = map[fileID]*elfFile{}
}

// frames symbolizes the return addresses ips of a stack of pid whose
// stackSum is sum (0: not remembered), innermost
// first; truncated says outer frames were cut (the walk filled its depth,
// or the stack has more than maxStackFrames). spWords (may be nil) are the words at the stack pointer when the
// stack was taken inside a syscall: the wrapper that made the call keeps no
// frame pointer, so the frame-pointer walk goes from it straight to its
// caller's caller, or, where the job's own code was built without frame
// pointers (gcc -O2), stops there; the words among them that are return
// addresses (each follows a call instruction in an executable mapping),
// up to the first the walk already has, are those callers, innermost
// first (callersOf).
func (s *symbolizer) frames(pid uint32, sum uint64, ips []uint64, spWords []uint64) (frames []event.Frame, truncated bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ips) == 0 {
		return nil, false
	}
	truncated = len(ips) >= stackDepth
	var callers []uint64
	var caller uint64 // the callers' key
	if len(spWords) > 0 {
		callers = s.callersOf(pid, ips, spWords)
		for _, c := range callers {
			caller = caller*1099511628211 ^ c
		}
	}
	key := stackKey{pid: pid, sum: sum, caller: caller}
	if d, ok := s.done[key]; ok && sum != 0 {
		return d.frames, d.truncated
	}
	pending := false
	if sum != 0 {
		defer func() {
			if pending {
				return // a line table still being read: the next time knows more
			}
			if len(s.done) >= maxSymbolized {
				clear(s.done)
			}
			s.done[key] = symbolized{frames, truncated}
		}()
	}
	if len(callers) > 0 {
		ips = slices.Concat(ips[:1], callers, ips[1:])
	}
	if len(ips) > maxStackFrames {
		ips, truncated = ips[:maxStackFrames], true
	}
	frames = make([]event.Frame, 0, len(ips))
	for _, ip := range ips {
		fr, p := s.frame(pid, ip)
		frames = append(frames, fr)
		pending = pending || p
	}
	return frames, truncated
}

// maxScanCallers bounds the callers read from the words at the stack
// pointer (frames): a syscall's wrapper, the job's function that called
// it, and that function's caller are all a stack without frame pointers
// can name.
const maxScanCallers = 3

// callersOf returns the return addresses among spWords, in stack order,
// that the frame-pointer walk (ips) lacks: it stops at the first word the
// walk has, from where the walk goes on.
func (s *symbolizer) callersOf(pid uint32, ips, spWords []uint64) []uint64 {
	var out []uint64
	for _, w := range spWords {
		if len(out) == maxScanCallers {
			break
		}
		if w < 4096 || slices.Contains(out, w) {
			continue
		}
		if contains(ips, w) {
			break // the walk already has it, and what follows
		}
		m, ok := s.mappingOf(pid, w)
		if !ok {
			continue
		}
		ef := s.file(pid, m)
		if ef.f == nil {
			continue
		}
		if ef.afterCall(w - m.start + m.off) {
			out = append(out, w)
		}
	}
	return out
}

// frame symbolizes one return address. The address after a call belongs
// to the caller's next instruction, which may start another function or
// line: lookups use ip-1, inside the call.
func (s *symbolizer) frame(pid uint32, ip uint64) (event.Frame, bool) {
	if fr, ok := s.frameAt[pid][ip]; ok {
		return fr, false
	}
	fr, pending, mapped := s.resolve(pid, ip)
	if mapped && !pending {
		at := s.frameAt[pid]
		if at == nil || len(at) >= maxFramesCached {
			at = make(map[uint64]event.Frame)
			s.frameAt[pid] = at
		}
		at[ip] = fr
	}
	return fr, pending
}

// resolve symbolizes ip in pid; mapped says it lies in a file mapping.
func (s *symbolizer) resolve(pid uint32, ip uint64) (fr event.Frame, pending, mapped bool) {
	m, ok := s.mappingOf(pid, ip)
	if !ok {
		return event.Frame{Function: fmt.Sprintf("0x%x", ip)}, false, false
	}
	ef := s.file(pid, m)
	fr = event.Frame{File: m.path}
	off := ip - m.start + m.off
	if ef.err == nil {
		if name, vaddr, ok := ef.lookup(off - 1); ok {
			fr.Function = name
			src, line, pending := ef.line(vaddr)
			if line > 0 {
				fr.Source, fr.Line = src, line
			}
			return fr, pending, true
		}
	}
	fr.Function = fmt.Sprintf("%s+0x%x", filepath.Base(m.path), off)
	return fr, false, true
}

// stackDepth is STACK_DEPTH of bpf/common.h: the user_stacks value size in
// addresses (load checks it against the map).
const stackDepth = 64
