package tracer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf16"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// Code objects of a CPython process, read from its memory. A frame names its
// code object by address; the object's name, file and line table are read
// once and cached per (process, address). Each time a cached object is used
// again its header is read back (all frames of a stack in one
// process_vm_readv) and must still be the same code type with the same
// name, file, first line and line table: a code object freed and its memory
// reused can then never lend its name or lines to another frame. What does
// not check out ends the stack there, flagged truncated.

// memReader reads another process's memory.
type memReader interface {
	read(addr uint64, dst []byte) error
	// readv fills each dst[i] from addrs[i] in one go; ok[i] says which
	// were readable in full.
	readv(addrs []uint64, dst [][]byte) (ok []bool)
}

type procMem struct{ pid int }

func (m procMem) read(addr uint64, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &dst[0]}}
	local[0].SetLen(len(dst))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}
	n, err := unix.ProcessVMReadv(m.pid, local, remote, 0)
	if err != nil {
		return fmt.Errorf("read pid %d at %#x: %w", m.pid, addr, err)
	}
	if n != len(dst) {
		return fmt.Errorf("read pid %d at %#x: %d of %d bytes", m.pid, addr, n, len(dst))
	}
	return nil
}

func (m procMem) readv(addrs []uint64, dst [][]byte) []bool {
	ok := make([]bool, len(addrs))
	local := make([]unix.Iovec, len(addrs))
	remote := make([]unix.RemoteIovec, len(addrs))
	for i := range addrs {
		if len(dst[i]) == 0 {
			return ok // never asked for: every span has a length field
		}
		local[i] = unix.Iovec{Base: &dst[i][0]}
		local[i].SetLen(len(dst[i]))
		remote[i] = unix.RemoteIovec{Base: uintptr(addrs[i]), Len: len(dst[i])}
	}
	// process_vm_readv stops at the first remote range that faults: the
	// ones before it are good, the rest are retried alone.
	n, _ := unix.ProcessVMReadv(m.pid, local, remote, 0)
	i := 0
	for ; i < len(addrs) && n >= len(dst[i]); i++ {
		ok[i] = true
		n -= len(dst[i])
	}
	for ; i < len(addrs); i++ {
		ok[i] = m.read(addrs[i], dst[i]) == nil
	}
	return ok
}

// pyCode is one resolved code object.
type pyCode struct {
	hdr       []byte // the header as read: later reads must match it
	function  string // co_qualname (3.11+) or co_name
	file      string
	firstLine int
	table     []byte // line table
	size      int    // bytecode length in bytes (3.11+), for the offset check
	lines     map[int64]int
	// checkedAt is when (CLOCK_MONOTONIC ns, the programs' clock) the
	// object was last read or found unchanged.
	checkedAt uint64
	// checks are the name, file and line table objects as read: each
	// later use reads them back and compares their contents, since the
	// allocator hands a freed object's address to the next object of its
	// size (a recompiled function gets its predecessor's addresses).
	checks [3]objCheck
}

// objCheck is the immutable part of a str or bytes object: its length
// field and its data, at known offsets from addr.
type objCheck struct {
	addr            uint64
	lenOff, dataOff uint32
	length          uint64
	data            []byte
}

// span is the bytes to read back: from the length field to the data's end.
func (c *objCheck) span() (uint64, int) {
	return c.addr + uint64(c.lenOff), int(c.dataOff-c.lenOff) + len(c.data)
}

// same compares a read-back span with what was read first (the hash and
// state words between length and data may change; they are skipped).
func (c *objCheck) same(b []byte) bool {
	return len(b) >= 8 && binary.LittleEndian.Uint64(b) == c.length &&
		string(b[c.dataOff-c.lenOff:]) == string(c.data)
}

// maxCodeCache bounds the code objects remembered per process.
const maxCodeCache = 1 << 14

// maxPyString, maxLineTable bound what is read of one object: a corrupt
// length must not allocate gigabytes.
const (
	maxPyString  = 4096
	maxLineTable = 1 << 20
)

// headerLen is how much of a code object identifies it: up to the last
// field compared.
func (l *pyLayout) headerLen() int {
	end := max(l.obType, l.codeFilename, l.codeName, l.codeLinetable) + 8
	end = max(end, l.codeFirstLine+4, l.codeSize+8)
	if l.codeQualname >= 0 {
		end = max(end, uint32(l.codeQualname)+8)
	}
	return int(end)
}

func le64(b []byte, off uint32) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

// sameCode says whether a header read now identifies the same code object
// as the one cached.
func (l *pyLayout) sameCode(old, now []byte) bool {
	for _, off := range []uint32{l.obType, l.codeFilename, l.codeName, l.codeLinetable} {
		if le64(old, off) != le64(now, off) {
			return false
		}
	}
	if l.codeQualname >= 0 && le64(old, uint32(l.codeQualname)) != le64(now, uint32(l.codeQualname)) {
		return false
	}
	if l.instrIsPtr && le64(old, l.codeSize) != le64(now, l.codeSize) {
		return false
	}
	return binary.LittleEndian.Uint32(old[l.codeFirstLine:]) == binary.LittleEndian.Uint32(now[l.codeFirstLine:])
}

// resolve turns one Python stack record into frames, innermost first;
// truncated when the walk was cut short or a frame did not check out.
func (p *pyProc) resolve(rec *rawPyStack) (frames []event.Frame, truncated bool) {
	capture := rec.Hdr.KtimeNs
	n := min(int(rec.Depth), len(rec.Code))
	truncated = rec.Flags&uint32(cudaPyFlagsPY_F_TRUNCATED) != 0 || int(rec.Depth) > len(rec.Code)
	if n == 0 {
		return nil, truncated
	}
	l := &p.layout
	if frames, ok := p.recent(rec, n); ok {
		return frames, truncated
	}
	hl := l.headerLen()
	// One process_vm_readv for the stack: each frame's code header and,
	// for a code object seen before, the name, file and line table it had.
	cached := make([]*pyCode, n)
	size := n * hl
	for i := range n {
		if c := p.codes[rec.Code[i]]; c != nil {
			cached[i] = c
			for k := range c.checks {
				_, sz := c.checks[k].span()
				size += sz
			}
		}
	}
	if cap(p.scratch) < size {
		p.scratch = make([]byte, size)
	}
	buf := p.scratch[:size]
	addrs := p.addrs[:0]
	bufs := p.bufs[:0]
	at := 0
	take := func(addr uint64, sz int) {
		addrs = append(addrs, addr)
		bufs = append(bufs, buf[at:at+sz:at+sz])
		at += sz
	}
	for i := range n {
		take(rec.Code[i], hl)
		if c := cached[i]; c != nil {
			for k := range c.checks {
				take(c.checks[k].span())
			}
		}
	}
	p.addrs, p.bufs = addrs, bufs
	now := uint64(monotonicNow())
	ok := p.mem.readv(addrs, bufs)
	hdrs := make([][]byte, n)
	j := 0
	for i := range n {
		hdr, hok := bufs[j], ok[j]
		j++
		hdrs[i] = hdr
		c := cached[i]
		if c != nil {
			same := hok && l.sameCode(c.hdr, hdr)
			for k := range c.checks {
				same = same && ok[j] && c.checks[k].same(bufs[j])
				j++
			}
			switch {
			case same:
				c.checkedAt = now
			case !hok && c.checkedAt >= capture:
				// Unreadable now (the process exited before its
				// last events were resolved), but checked live and
				// unchanged after this capture: still its answer.
				continue
			default:
				cached[i] = nil
			}
		}
		if !hok || le64(hdr, l.obType) != p.codeType || !liveRefcnt(hdr) {
			n = i // the stack ends here, truncated
			truncated = true
			break
		}
	}
	frames = make([]event.Frame, 0, n)
	for i := range n {
		c := cached[i]
		if c == nil {
			var err error
			if c, err = p.readCode(hdrs[i]); err != nil {
				return frames, true
			}
			c.checkedAt = now
			if len(p.codes) >= maxCodeCache {
				clear(p.codes)
			}
			p.codes[rec.Code[i]] = c
		}
		line, ok := c.line(l, rec.Instr[i])
		if !ok {
			return frames, true
		}
		frames = append(frames, event.Frame{Function: c.function, File: c.file, Line: line})
	}
	return frames, truncated
}

// codeTrust is how long a code object found unchanged is taken as it is
// without reading it again. A training loop captures the same stack at
// every step's sync (hundreds a second), and re-reading its code objects
// each time was a tenth of the sidecar's CPU on a launch-bound job; a
// function recompiled within this time after its predecessor's last check
// can be named as the predecessor (its line still has to fall in the
// cached code's range).
const codeTrust = 200 * time.Millisecond

// recent resolves a stack of n frames whose every code object was read or
// found unchanged within codeTrust before the capture, without reading the
// process's memory.
func (p *pyProc) recent(rec *rawPyStack, n int) ([]event.Frame, bool) {
	capture := rec.Hdr.KtimeNs
	for i := range n {
		c := p.codes[rec.Code[i]]
		if c == nil || c.checkedAt+uint64(codeTrust) < capture {
			return nil, false
		}
	}
	frames := make([]event.Frame, 0, n)
	for i := range n {
		c := p.codes[rec.Code[i]]
		line, ok := c.line(&p.layout, rec.Instr[i])
		if !ok {
			return nil, false
		}
		frames = append(frames, event.Frame{Function: c.function, File: c.file, Line: line})
	}
	return frames, true
}

// liveRefcnt says whether an object's first word can be the reference
// count of a live object. A freed one keeps its type and fields, but the
// allocator (pymalloc, for the small objects of a recompiled function)
// writes the next free block's address or NULL there: a freed code object
// would otherwise lend its stale first line to whatever now lives at its
// name's address. Immortal objects (3.12+) count 2^32-1.
func liveRefcnt(obj []byte) bool {
	rc := le64(obj, 0)
	return rc >= 1 && rc <= 1<<32
}

// readCode reads what a frame needs of the code object whose header is hdr.
func (p *pyProc) readCode(hdr []byte) (*pyCode, error) {
	l := &p.layout
	c := &pyCode{hdr: append([]byte(nil), hdr...), firstLine: int(int32(binary.LittleEndian.Uint32(hdr[l.codeFirstLine:]))),
		lines: map[int64]int{}}
	nameAt := l.codeName
	if l.codeQualname >= 0 {
		nameAt = uint32(l.codeQualname)
	}
	var err error
	if c.function, c.checks[0], err = p.readStr(le64(hdr, nameAt)); err != nil {
		return nil, fmt.Errorf("code name: %w", err)
	}
	if c.file, c.checks[1], err = p.readStr(le64(hdr, l.codeFilename)); err != nil {
		return nil, fmt.Errorf("code file: %w", err)
	}
	if c.table, c.checks[2], err = p.readBytes(le64(hdr, l.codeLinetable)); err != nil {
		return nil, fmt.Errorf("line table: %w", err)
	}
	if l.instrIsPtr {
		c.size = int(int64(le64(hdr, l.codeSize))) * 2
	}
	return c, nil
}

// line maps a frame's position (see py_stack_event.instr) to a line. The
// code object must have the first line it had at capture, and for 3.11+
// the position must lie in its bytecode; else it is not the code object
// the frame ran (ok false).
func (c *pyCode) line(l *pyLayout, instr uint64) (int, bool) {
	if int(int32(instr>>32)) != c.firstLine {
		return 0, false
	}
	at := uint32(instr)
	var off int64 // byte offset of the instruction
	switch {
	case l.instrIsPtr:
		off = int64(at) - int64(l.codeAdaptive)
		if off < -2 || off >= int64(c.size) || off%2 != 0 {
			return 0, false
		}
		if off < 0 { // before the first instruction
			return c.firstLine, true
		}
	case l.minor == 10:
		off = int64(int32(at)) * 2
	default:
		off = int64(int32(at))
	}
	if off < 0 {
		return c.firstLine, true
	}
	if ln, ok := c.lines[off]; ok {
		return ln, true
	}
	var ln int
	switch {
	case l.minor <= 9:
		ln = lnotabLine(c.table, c.firstLine, int(off))
	case l.minor == 10:
		ln = linetable310Line(c.table, c.firstLine, int(off))
	default:
		ln = locationLine(c.table, c.firstLine, int(off/2))
	}
	if len(c.lines) < 4096 {
		c.lines[off] = ln
	}
	return ln, true
}

// readStr reads a str object: compact ASCII or compact latin-1/UCS-2/UCS-4
// (every name and file name of a code object is compact).
func (p *pyProc) readStr(addr uint64) (string, objCheck, error) {
	l := &p.layout
	var hdr [80]byte
	if l.strCompact > uint32(len(hdr)) {
		return "", objCheck{}, fmt.Errorf("str header of %d bytes", l.strCompact)
	}
	if err := p.mem.read(addr, hdr[:l.strCompact]); err != nil {
		return "", objCheck{}, err
	}
	if !liveRefcnt(hdr[:]) {
		return "", objCheck{}, fmt.Errorf("str at %#x: freed", addr)
	}
	n := int64(le64(hdr[:], l.strLength))
	state := binary.LittleEndian.Uint32(hdr[l.strState:])
	kind, compact, ascii := int(state>>2&7), state>>5&1 == 1, state>>6&1 == 1
	if n < 0 || n > maxPyString || !compact || kind != 1 && kind != 2 && kind != 4 {
		return "", objCheck{}, fmt.Errorf("str at %#x: length %d, state %#x: not a compact string", addr, n, state)
	}
	dataOff := l.strCompact
	if ascii {
		dataOff = l.strASCII
	}
	b := make([]byte, int(n)*kind)
	if err := p.mem.read(addr+uint64(dataOff), b); err != nil {
		return "", objCheck{}, err
	}
	chk := objCheck{addr: addr, lenOff: l.strLength, dataOff: dataOff, length: uint64(n), data: b}
	switch kind {
	case 1:
		if ascii {
			return string(b), chk, nil
		}
		r := make([]rune, n)
		for i, c := range b {
			r[i] = rune(c)
		}
		return string(r), chk, nil
	case 2:
		u := make([]uint16, n)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		return string(utf16.Decode(u)), chk, nil
	}
	r := make([]rune, n)
	for i := range r {
		r[i] = rune(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return string(r), chk, nil
}

// readBytes reads a bytes object's contents.
func (p *pyProc) readBytes(addr uint64) ([]byte, objCheck, error) {
	l := &p.layout
	var sz [8]byte
	if err := p.mem.read(addr+uint64(l.bytesSize), sz[:]); err != nil {
		return nil, objCheck{}, err
	}
	n := int64(binary.LittleEndian.Uint64(sz[:]))
	if n < 0 || n > maxLineTable {
		return nil, objCheck{}, fmt.Errorf("bytes at %#x: length %d", addr, n)
	}
	b := make([]byte, n)
	if err := p.mem.read(addr+uint64(l.bytesData), b); err != nil {
		return nil, objCheck{}, err
	}
	return b, objCheck{addr: addr, lenOff: l.bytesSize, dataOff: l.bytesData, length: uint64(n), data: b}, nil
}

// lnotabLine is PyCode_Addr2Line of 3.9: (byte increment, signed line
// increment) pairs; off is a byte offset.
func lnotabLine(tab []byte, first, off int) int {
	line, addr := first, 0
	for i := 0; i+1 < len(tab); i += 2 {
		addr += int(tab[i])
		if addr > off {
			break
		}
		line += int(int8(tab[i+1]))
	}
	return line
}

// linetable310Line is PyCode_Addr2Line of 3.10: (byte length, signed line
// delta) pairs, -128 meaning no line; off is a byte offset.
func linetable310Line(tab []byte, first, off int) int {
	end, computed := 0, first
	for i := 0; i+1 < len(tab); i += 2 {
		start := end
		end += int(tab[i])
		d := int8(tab[i+1])
		cur := -1 // -128: no line
		if d != -128 {
			computed += int(d)
			cur = computed
		}
		if start <= off && off < end {
			return cur
		}
	}
	return -1
}

// locationLine is PyCode_Addr2Line of 3.11+ (Objects/locations.md): entries
// led by a byte with the top bit set, (code << 3 | length-1); unit is the
// instruction's index in code units. -1 when the instruction has no line.
func locationLine(tab []byte, first, unit int) int {
	line, addr := first, 0
	for i := 0; i < len(tab); {
		b := tab[i]
		if b&0x80 == 0 {
			return -1 // not an entry start: corrupt table
		}
		code, length := int(b>>3&15), int(b&7)+1
		i++
		delta, has := 0, true
		switch {
		case code == 15: // no location
			has = false
		case code == 14: // long form: line delta, end line, columns
			delta, i = svarint(tab, i)
			_, i = uvarint(tab, i)
			_, i = uvarint(tab, i)
			_, i = uvarint(tab, i)
		case code == 13: // no column
			delta, i = svarint(tab, i)
		case code >= 10: // one-line forms: delta in the code, two column bytes
			delta = code - 10
			i += 2
		default: // short form: same line, one column byte
			i++
		}
		line += delta
		if unit < addr+length {
			if !has {
				return -1
			}
			return line
		}
		addr += length
	}
	return -1
}

func uvarint(tab []byte, i int) (int, int) {
	v, shift := 0, 0
	for i < len(tab) && shift < 32 {
		b := tab[i]
		i++
		v |= int(b&63) << shift
		shift += 6
		if b&64 == 0 {
			break
		}
	}
	return v, i
}

func svarint(tab []byte, i int) (int, int) {
	v, i := uvarint(tab, i)
	if v&1 != 0 {
		return -(v >> 1), i
	}
	return v >> 1, i
}

// rawPyStack is struct py_stack_event.
type rawPyStack = cudaPyStackEvent

var errNoPython = errors.New("not a python process")

// pyRecord keeps a Python stack record until its event comes.
func (s *pyStacks) hold(rec []byte) {
	if s == nil { // a tracer fed recorded records
		return
	}
	r := *(*rawPyStack)(unsafe.Pointer(&rec[0]))
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) >= 1<<16 {
		clear(s.pending) // events never came (lost in a full ring)
	}
	ps := s.pending[r.Hdr.PidTgid]
	if ps == nil {
		ps = &pyPendingSet{}
		s.pending[r.Hdr.PidTgid] = ps
	}
	ps.put(pyPending{ktime: r.Hdr.KtimeNs, rec: r})
}

// take returns the Python frames recorded for the event of thread id at
// ktime, if any.
func (s *pyStacks) take(id, ktime uint64) (frames []event.Frame, truncated, ok bool, err error) {
	if s == nil {
		return nil, false, false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.pending[id]
	if ps == nil {
		return nil, false, false, nil
	}
	// Records of the thread from other CPUs (a scheduling event about
	// it) may come between the stack and its event, and a fault burst's
	// record waits for the burst's end: only the event with the stack's
	// timestamp takes it.
	pend, found := ps.take(ktime)
	if !found {
		return nil, false, false, nil
	}
	if ps.n == 0 {
		delete(s.pending, id)
	}
	p := s.procs[uint32(id>>32)]
	if p == nil {
		return nil, false, false, errNoPython
	}
	frames, truncated = p.resolve(&pend.rec)
	return frames, truncated, true, nil
}
