package tracer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/gaptrace/gaptrace/event"
)

// asBytes returns the in-memory bytes of a generated record struct: exactly
// what the BPF program writes into the ring buffer.
func asBytes[T any](v *T) []byte {
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))...)
}

func hdr(typ, kind uint32, pid, tid uint32, ktime uint64) rawHeader {
	return rawHeader{Type: typ, Kind: kind, PidTgid: uint64(pid)<<32 | uint64(tid), KtimeNs: ktime}
}

func putStr[T ~int8](dst []T, s string) {
	for i := range len(s) {
		dst[i] = T(s[i])
	}
}

const (
	tStart = uint64(5_000_000_000)
	tEnd   = uint64(5_000_250_000)
)

// recordedRecords covers every record type the programs write.
func recordedRecords() map[string][]byte {
	sync := rawCUDA{Hdr: hdr(evCUDA, uint32(event.KindSync), 100, 101, tEnd), StartNs: tStart, Stream: 0x7f00, Count: 42, Func: uint32(event.CUStreamSynchronize)}
	enq := rawCUDA{Hdr: hdr(evCUDA, uint32(event.KindEnqueue), 100, 101, tEnd), StartNs: tEnd, Stream: 0x7f00, Count: 3, Func: uint32(event.CULaunchKernelEx), Mark: 0x7e57}
	coll := rawNCCL{Hdr: hdr(evNCCL, uint32(event.KindCollective), 100, 101, tEnd), StartNs: tEnd, Count: 1 << 20, Bytes: 4 << 20, Comm: 0xc0, Stream: 0x7f00, Peer: -1, Op: uint32(event.NCCLAllReduce), Datatype: 7}
	sys := rawSyscall{Hdr: hdr(evSyscall, uint32(event.KindSyscall), 100, 101, tEnd), StartNs: tStart, Ret: 4096, Waker: uint64(200)<<32 | 201, Nr: 17, Fd: 5, Class: uint32(event.SysRead)}
	slowOpen := rawSyscall{Hdr: hdr(evSyscall, uint32(event.KindSyscall), 100, 101, tEnd), StartNs: tStart, Ret: 8, Nr: 257, Fd: -100, Class: uint32(event.SysOpen), OpenFlags: 0x241}
	rq := rawSched{Hdr: hdr(evSched, uint32(event.KindRunqueue), 100, 101, tEnd), StartNs: tStart}
	woken := rawSched{Hdr: hdr(evSched, uint32(event.KindRunqueue), 100, 101, tEnd), StartNs: tStart, Flags: schedFlagWoken}
	fork := rawProc{Hdr: hdr(evProc, uint32(event.KindFork), 100, 101, tEnd), ChildPid: 300, ChildTid: 300}
	putStr(fork.Comm[:], "worker")
	thread := rawProc{Hdr: hdr(evProc, uint32(event.KindFork), 100, 101, tEnd), ChildPid: 100, ChildTid: 104, Flags: procFlagThread}
	exec := rawProc{Hdr: hdr(evProc, uint32(event.KindExec), 300, 300, tEnd)}
	putStr(exec.Comm[:], "python3")
	putStr(exec.Filename[:], "/usr/bin/python3")
	exit := rawProc{Hdr: hdr(evProc, uint32(event.KindExit), 300, 300, tEnd), Flags: procFlagGroupDead}
	open := rawFD{Hdr: hdr(evFD, uint32(event.KindOpen), 100, 101, tEnd), StartNs: tStart, Ret: 7, Fd: 7}
	putStr(open.Path[:], "/data/shard-00001.tar")
	mmap := hdr(evMmap, 0, 100, 101, tEnd)
	return map[string][]byte{
		"sync": asBytes(&sync), "enqueue": asBytes(&enq), "collective": asBytes(&coll), "syscall": asBytes(&sys), "slow open": asBytes(&slowOpen),
		"runqueue": asBytes(&rq), "woken": asBytes(&woken), "fork": asBytes(&fork), "thread": asBytes(&thread), "exec": asBytes(&exec), "exit": asBytes(&exit),
		"open": asBytes(&open), "mmap": asBytes(&mmap),
	}
}

func TestDecodeRecords(t *testing.T) {
	recs := recordedRecords()
	end := MonotonicToUnix(int64(tEnd))
	start := end - int64(tEnd-tStart)
	tests := []struct {
		name string
		want event.Event
		ctl  control
		emit bool
	}{
		{"sync", event.Event{Kind: event.KindSync, PID: 100, TID: 101, Start: start, End: end, CUDA: event.CUStreamSynchronize, Stream: 0x7f00, Count: 42, FD: -1, PeerRank: -1}, ctlNone, true},
		{"enqueue", event.Event{Kind: event.KindEnqueue, PID: 100, TID: 101, Start: end, End: end, CUDA: event.CULaunchKernelEx, Stream: 0x7f00, Count: 3, Mark: 0x7e57, FD: -1, PeerRank: -1}, ctlNone, true},
		{"collective", event.Event{Kind: event.KindCollective, PID: 100, TID: 101, Start: end, End: end, Op: event.NCCLAllReduce, Count: 1 << 20, Bytes: 4 << 20, Comm: 0xc0, Stream: 0x7f00, FD: -1, PeerRank: -1}, ctlNone, true},
		{"syscall", event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: start, End: end, Syscall: event.SysRead, SyscallNr: 17, Name: syscallName(17), FD: 5, Ret: 4096, Bytes: 4096, WakerPID: 200, WakerTID: 201, PeerRank: -1}, ctlNone, true},
		{"slow open", event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: start, End: end, Syscall: event.SysOpen, SyscallNr: 257, Name: "openat", FD: -100, Ret: 8, OpenFlags: 0x241, PeerRank: -1}, ctlNone, true},
		{"runqueue", event.Event{Kind: event.KindRunqueue, PID: 100, TID: 101, Start: start, End: end, FD: -1, PeerRank: -1}, ctlNone, true},
		{"woken", event.Event{Kind: event.KindRunqueue, PID: 100, TID: 101, Start: start, End: end, FD: -1, PeerRank: -1, Woken: true}, ctlNone, true},
		{"fork", event.Event{Kind: event.KindFork, PID: 100, TID: 101, Start: end, End: end, ChildPID: 300, TaskComm: "worker", FD: -1, PeerRank: -1}, ctlNewProcess, true},
		{"thread", event.Event{Kind: event.KindFork, PID: 100, TID: 101, Start: end, End: end, ChildPID: 104, IsThread: true, FD: -1, PeerRank: -1}, ctlNone, true},
		{"exec", event.Event{Kind: event.KindExec, PID: 300, TID: 300, Start: end, End: end, Name: "python3", TaskComm: "python3", Path: "/usr/bin/python3", FD: -1, PeerRank: -1}, ctlExec, true},
		{"exit", event.Event{Kind: event.KindExit, PID: 300, TID: 300, Start: end, End: end, FD: -1, PeerRank: -1}, ctlProcessGone, true},
		{"open", event.Event{Kind: event.KindOpen, PID: 100, TID: 101, Start: start, End: end, Syscall: event.SysOpen, Name: "openat", FD: 7, Ret: 7, Path: "/data/shard-00001.tar", PeerRank: -1}, ctlFDChanged, true},
		{"mmap", event.Event{PID: 100, TID: 101, Start: end, End: end, FD: -1, PeerRank: -1}, ctlRescan, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d decoded
			if err := decodeRecord(recs[tc.name], &d); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d.ev, tc.want) {
				t.Errorf("event\n got %+v\nwant %+v", d.ev, tc.want)
			}
			if d.ctl != tc.ctl || d.emit != tc.emit {
				t.Errorf("ctl %d emit %v, want %d %v", d.ctl, d.emit, tc.ctl, tc.emit)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	recs := recordedRecords()
	var d decoded
	for name, rec := range map[string][]byte{
		"empty":        nil,
		"short header": recs["sync"][:10],
		"truncated":    recs["sync"][:len(recs["sync"])-1],
		"padded":       append(append([]byte(nil), recs["runqueue"]...), 0),
		"unknown type": func() []byte { b := append([]byte(nil), recs["sync"]...); b[0] = 99; return b }(),
		"bad kind":     func() []byte { b := append([]byte(nil), recs["sync"]...); b[4] = byte(event.KindFork); return b }(),
		"bad func":     func() []byte { r := recordedRecords()["sync"]; (*rawCUDA)(unsafe.Pointer(&r[0])).Func = 200; return r }(),
	} {
		if err := decodeRecord(rec, &d); err == nil {
			t.Errorf("%s: decoded without error: %+v", name, d.ev)
		}
	}
}

// fakeReader replays recorded records, then reports itself closed.
type fakeReader struct{ recs [][]byte }

func (f *fakeReader) Read(bool) ([]byte, error) {
	if len(f.recs) == 0 {
		return nil, os.ErrClosed
	}
	r := f.recs[0]
	f.recs = f.recs[1:]
	return r, nil
}

func (f *fakeReader) Flush() error { return nil }
func (f *fakeReader) Close() error { return nil }

func newUnloadedTracer() *Tracer {
	cfg := Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	return &Tracer{
		cfg: cfg, log: cfg.Logger, fds: newFDResolver(), comms: &taskComms{procRoot: "/proc"},
		procs: make(map[uint32]*procState), missingSeen: make(map[string]bool),
		roots: make(map[uint32]bool), unmapped: make(map[uint32]string),
		rescan: make(chan uint32, 16), done: make(chan struct{}), syms: newSymbolizer(),
	}
}

// TestConsumeDispatch runs the decode/dispatch loop on a fake ring buffer:
// fd paths come from the open record (the file is gone by then), forked
// processes get tracked, undecodable records are counted and skipped.
func TestConsumeDispatch(t *testing.T) {
	tr := newUnloadedTracer()
	recs := recordedRecords()
	sys := rawSyscall{Hdr: hdr(evSyscall, uint32(event.KindSyscall), 100, 101, tEnd), StartNs: tStart, Ret: 10, Nr: 0, Fd: 7, Class: uint32(event.SysRead)}
	closeRec := rawFD{Hdr: hdr(evFD, uint32(event.KindClose), 100, 101, tEnd), StartNs: tStart, Fd: 7}
	rd := &fakeReader{recs: [][]byte{recs["open"], asBytes(&sys), asBytes(&closeRec), {1, 2, 3}, recs["fork"], recs["mmap"]}}
	out := make(chan event.Event, 16)
	if err := tr.consume(rd, tr.sendEach(context.Background(), out)); err != nil {
		t.Fatal(err)
	}
	close(out)
	var got []event.Event
	for ev := range out {
		got = append(got, ev)
	}
	if len(got) != 4 {
		t.Fatalf("got %d events, want 4 (open, read, close, fork)", len(got))
	}
	if got[1].Path != "/data/shard-00001.tar" || got[1].FDKind != event.FDFile {
		t.Errorf("read resolved to %q (%d)", got[1].Path, got[1].FDKind)
	}
	if got[2].Kind != event.KindClose || got[2].Path != "/data/shard-00001.tar" {
		t.Errorf("close: %+v", got[2])
	}
	if _, ok := tr.fds.cached(100, 7); ok {
		t.Error("fd still cached after close")
	}
	if _, ok := tr.procs[300]; !ok {
		t.Error("forked process not tracked")
	}
	if n := tr.decodeErrors.Load(); n != 1 {
		t.Errorf("%d decode errors, want 1", n)
	}
	if n := tr.eventsRead.Load(); n != 6 {
		t.Errorf("%d records read, want 6", n)
	}
	if fd, p, other := tr.eventsByKind[RecFD].Load(), tr.eventsByKind[RecProc].Load(), tr.eventsByKind[RecOther].Load(); fd != 2 || p != 2 || other != 1 {
		t.Errorf("records by kind: fd %d, proc %d, undecodable %d; want 2, 2, 1", fd, p, other)
	}
	select {
	case pid := <-tr.rescan:
		if pid != 300 {
			t.Errorf("rescan of %d, want 300 (the new process)", pid)
		}
	default:
		t.Error("no rescan requested")
	}
}

func TestConsumeStopsOnContext(t *testing.T) {
	tr := newUnloadedTracer()
	rec := recordedRecords()["sync"]
	rd := &endlessReader{rec: rec}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan event.Event) // never read: Run blocks on it
	done := make(chan error, 1)
	go func() { done <- tr.consume(rd, tr.sendEach(ctx, out)) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consume: %v", err)
	}
}

type endlessReader struct{ rec []byte }

func (e *endlessReader) Read(bool) ([]byte, error) { return e.rec, nil }
func (e *endlessReader) Flush() error              { return nil }
func (e *endlessReader) Close() error              { return nil }

func TestReadErrorIsReturned(t *testing.T) {
	tr := newUnloadedTracer()
	boom := errors.New("boom")
	err := tr.consume(errReader{boom}, tr.sendEach(context.Background(), make(chan event.Event, 1)))
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want %v", err, boom)
	}
}

type errReader struct{ err error }

func (e errReader) Read(bool) ([]byte, error) { return nil, e.err }
func (e errReader) Flush() error              { return nil }
func (e errReader) Close() error              { return nil }

// heldReader is a ring whose records were committed without a wakeup
// (BPF_RB_NO_WAKEUP): Read blocks until Flush or Close, as the real reader
// does between polls, and after Flush returns the pending records, then
// ErrFlushed. Close without Flush loses them, as closing the real reader
// does.
type heldReader struct {
	recs    [][]byte
	flushed chan struct{}
	closed  chan struct{}
	flushes atomic.Int32
}

func newHeldReader(recs ...[]byte) *heldReader {
	return &heldReader{recs: recs, flushed: make(chan struct{}), closed: make(chan struct{})}
}

func (h *heldReader) Read(wait bool) ([]byte, error) {
	if !wait {
		select {
		case <-h.closed:
		case <-h.flushed:
		default:
			return nil, errEmpty
		}
	}
	select {
	case <-h.closed:
		return nil, os.ErrClosed
	case <-h.flushed:
	}
	if len(h.recs) == 0 {
		return nil, ringbuf.ErrFlushed
	}
	r := h.recs[0]
	h.recs = h.recs[1:]
	return r, nil
}

func (h *heldReader) Flush() error {
	if h.flushes.Add(1) == 1 {
		close(h.flushed)
	}
	return nil
}

func (h *heldReader) Close() error {
	select {
	case <-h.closed:
	default:
		close(h.closed)
	}
	return nil
}

// TestRunDrainsRingOnCancel: records still in the ring when the context
// ends (the traced process's exit, typically) reach the consumer before Run
// returns, and the reader is closed after them.
func TestRunDrainsRingOnCancel(t *testing.T) {
	tr := newUnloadedTracer()
	recs := recordedRecords()
	rd := newHeldReader(recs["sync"], recs["exit"])
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan event.Event) // unbuffered: each record waits for the reader below
	done := make(chan error, 1)
	go func() { done <- tr.run(ctx, rd, tr.sendEach(ctx, out)) }()
	cancel()
	var got []event.Event
	for len(got) < 2 {
		select {
		case ev := <-out:
			got = append(got, ev)
		case err := <-done:
			t.Fatalf("Run returned %v after %d of 2 pending records", err, len(got))
		case <-time.After(10 * time.Second):
			t.Fatalf("pending records not delivered after cancel (got %d)", len(got))
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if got[0].Kind != event.KindSync || got[1].Kind != event.KindExit {
		t.Errorf("got kinds %v, %v; want sync, exit", got[0].Kind, got[1].Kind)
	}
	select {
	case <-rd.closed:
	default:
		t.Error("reader not closed after the drain")
	}
}

func FuzzDecode(f *testing.F) {
	for _, r := range recordedRecords() {
		f.Add(r)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d decoded
		if err := decodeRecord(b, &d); err != nil {
			return
		}
		if d.ev.Start > d.ev.End {
			t.Fatalf("start %d after end %d", d.ev.Start, d.ev.End)
		}
		if d.ev.Kind == event.KindInvalid && d.ctl != ctlRescan {
			t.Fatalf("invalid kind decoded: %+v", d.ev)
		}
	})
}

// TestLayout compares every generated Go record struct with the C struct in
// the BTF of the object it came from: size and every field offset.
func TestLayout(t *testing.T) {
	specs := map[string]func() (*ebpf.CollectionSpec, error){"cuda": loadCuda, "nccl": loadNccl, "syscalls": loadSyscalls, "sched": loadSched, "marker": loadMarker}
	check := []struct {
		obj, ctype string
		goType     any
	}{
		{"cuda", "event_hdr", rawHeader{}},
		{"cuda", "cuda_event", rawCUDA{}},
		{"cuda", "short_key", cudaShortKey{}},
		{"cuda", "thread_state", cudaThreadState{}},
		{"nccl", "nccl_event", rawNCCL{}},
		{"syscalls", "syscall_event", rawSyscall{}},
		{"syscalls", "fd_event", rawFD{}},
		{"sched", "sched_event", rawSched{}},
		{"sched", "proc_event", rawProc{}},
		{"marker", "marker_event", rawMarker{}},
	}
	for _, c := range check {
		spec, err := specs[c.obj]()
		if err != nil {
			t.Fatal(err)
		}
		var st *btf.Struct
		if err := spec.Types.TypeByName(c.ctype, &st); err != nil {
			t.Fatalf("%s: %v", c.ctype, err)
		}
		gt := reflect.TypeOf(c.goType)
		if uintptr(st.Size) != gt.Size() {
			t.Errorf("%s: C size %d, Go %s size %d", c.ctype, st.Size, gt.Name(), gt.Size())
		}
		var goOffsets []uintptr
		for i := range gt.NumField() {
			if f := gt.Field(i); f.Name != "_" {
				goOffsets = append(goOffsets, f.Offset)
			}
		}
		if len(goOffsets) != len(st.Members) {
			t.Errorf("%s: %d C members, %d Go fields", c.ctype, len(st.Members), len(goOffsets))
			continue
		}
		for i, m := range st.Members {
			if uintptr(m.Offset.Bytes()) != goOffsets[i] {
				t.Errorf("%s.%s: C offset %d, Go %d", c.ctype, m.Name, m.Offset.Bytes(), goOffsets[i])
			}
		}
	}
	// Every record type user space accepts has its size from those structs.
	for _, typ := range []uint32{evCUDA, evNCCL, evSyscall, evSched, evProc, evFD, evMmap, evPyStack, evSyscallPath, evMarker} {
		if recordSizes[typ] == 0 {
			t.Errorf("record type %d has no size", typ)
		}
	}
}

// TestProbePlanAliases checks address deduplication on a library whose
// ncclX are weak aliases of pncclX (built from the simulated NCCL).
func TestProbePlanAliases(t *testing.T) {
	lib := filepath.Join(simgpu(t), "libnccl.so.2")
	planned, missing, err := planProbes(lib, libNCCL, ProbesFull)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 0 {
		t.Errorf("missing %v", missing)
	}
	seen := map[uint64]string{}
	names := map[string]bool{}
	for _, p := range planned {
		if prev, ok := seen[p.addr]; ok {
			t.Errorf("%s and %s share address %#x: probed twice", prev, p.symbol, p.addr)
		}
		seen[p.addr] = p.symbol
		names[p.symbol] = true
	}
	for _, want := range []string{"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd"} {
		if !names[want] {
			t.Errorf("%s not planned (canonical name first)", want)
		}
	}
	if names["ncclCommGetAsyncError"] || names["pncclCommGetAsyncError"] {
		t.Error("ncclCommGetAsyncError planned")
	}

	cuda := filepath.Join(simgpu(t), "libcuda.so.1")
	full, _, err := planProbes(cuda, libCUDA, ProbesFull)
	if err != nil {
		t.Fatal(err)
	}
	lite, _, err := planProbes(cuda, libCUDA, ProbesLite)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range lite {
		if p.spec.launch {
			t.Errorf("lite plans launch probe %s", p.symbol)
		}
	}
	if len(full) <= len(lite) {
		t.Errorf("full plans %d probes, lite %d", len(full), len(lite))
	}
}

func TestMonotonicToUnix(t *testing.T) {
	for range 3 {
		mono := monotonicNow()
		var now = MonotonicToUnix(mono)
		wall := time.Now().UnixNano()
		if d := wall - now; d < 0 || d > 5_000_000 {
			t.Fatalf("converted monotonic %d is %dns before wall clock", now, d)
		}
	}
	// Re-measuring keeps the offset stable to well under a microsecond
	// when nobody steps the clock.
	a := measureClockOffset(16)
	b := measureClockOffset(16)
	if d := a - b; d > 20_000 || d < -20_000 {
		t.Fatalf("offsets %d and %d differ by %dns", a, b, d)
	}
}

func BenchmarkDecode(b *testing.B) {
	recs := recordedRecords()
	mix := [][]byte{recs["enqueue"], recs["sync"], recs["syscall"], recs["collective"], recs["runqueue"]}
	var d decoded
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := decodeRecord(mix[i%len(mix)], &d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// chunkedReader is a ring that a poll finds holding chunks[0], then
// chunks[1], …: a Read that must not wait finds nothing at the end of each
// chunk.
type chunkedReader struct {
	chunks [][][]byte
}

func (c *chunkedReader) Read(wait bool) ([]byte, error) {
	if !wait && len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
		return nil, errEmpty
	}
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		return nil, os.ErrClosed
	}
	r := c.chunks[0][0]
	c.chunks[0] = c.chunks[0][1:]
	return r, nil
}

func (c *chunkedReader) Flush() error { return nil }
func (c *chunkedReader) Close() error { return nil }

// TestConsumeBatches: what one pass over the ring finds goes to the
// consumer as one slice (a long pass in slices of maxBatch), in ring
// order, every event once; records that emit nothing (an mmap) or do not
// decode take no place in a batch.
func TestConsumeBatches(t *testing.T) {
	tr := newUnloadedTracer()
	recs := recordedRecords()
	var seq uint32
	sync := func() []byte {
		seq++
		s := rawSyscall{Hdr: hdr(evSyscall, uint32(event.KindSyscall), 100, 101, tEnd+uint64(seq)), StartNs: tStart, Ret: 1, Nr: 0, Fd: -1, Class: uint32(event.SysRead)}
		return asBytes(&s)
	}
	chunk := func(n int) [][]byte {
		var c [][]byte
		for range n {
			c = append(c, sync())
		}
		return c
	}
	first := append(chunk(3), recs["mmap"], []byte{1, 2, 3})
	rd := &chunkedReader{chunks: [][][]byte{first, chunk(1), chunk(maxBatch*2 + 7)}}
	out := make(chan []event.Event, 16)
	if err := tr.consume(rd, func(b []event.Event) bool { out <- b; return true }); err != nil {
		t.Fatal(err)
	}
	close(out)
	var sizes []int
	var next, n int64 // the end times count up from the first (ktime turned into Unix time)
	for b := range out {
		sizes = append(sizes, len(b))
		for _, ev := range b {
			if n == 0 {
				next = ev.End
			}
			n++
			if ev.End != next {
				t.Fatalf("event ending at %d, want %d: lost, repeated or out of order", ev.End, next)
			}
			next++
		}
	}
	if want := []int{3, 1, maxBatch, maxBatch, 7}; !slices.Equal(sizes, want) {
		t.Errorf("batches of %v, want %v", sizes, want)
	}
	if n != int64(seq) {
		t.Errorf("%d events delivered, want %d", n, seq)
	}
}

// TestRecycledBatchReused: a batch handed back is the next one's storage,
// emptied (nothing of the old events left in it).
func TestRecycledBatchReused(t *testing.T) {
	tr := newUnloadedTracer()
	tr.free = make(chan []event.Event, 1)
	recs := recordedRecords()
	rd := &chunkedReader{chunks: [][][]byte{{recs["sync"], recs["sync"]}, {recs["exit"]}}}
	var got [][]event.Event
	if err := tr.consume(rd, func(b []event.Event) bool {
		got = append(got, b)
		if len(got) == 1 {
			tr.Recycle(b)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[1]) != 1 || got[1][0].Kind != event.KindExit {
		t.Fatalf("batches %v", got)
	}
	if &got[0][:1][0] != &got[1][0] {
		t.Error("the recycled batch was not reused")
	}
	if got[0][:2][1].Kind != event.KindInvalid {
		t.Errorf("recycled storage still holds an old event: %+v", got[0][:2][1])
	}
}
