package attribute

import (
	"time"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// Evidence caps keep one gap's record small however busy the host was.
const (
	maxFiles    = 8
	maxPeers    = 8
	maxWorkers  = 4
	maxOps      = 16
	maxSyscalls = 16
	maxWFiles   = 4
	// maxHolderFrames bounds a lock holder's stack: its own code is
	// innermost, the callers that reach the loop's are of less use.
	maxHolderFrames = 24
)

type fileKey struct{ path, op string }

type opAcc struct {
	ev  *event.Event
	tid uint32
	ns  int64
}

type workerAcc struct {
	pid     uint32
	waitNS  int64
	ioNS    int64
	files   map[string]int64
	calls   int
	visited map[*event.Event]bool
}

// World is what an attribution reads of everything the engine knows: a
// wait is followed to the thread or the process that ended it. The
// attribution never changes it.
type World interface {
	// Thread is the thread tid, nil when unknown.
	Thread(tid uint32) *Thread
	// TIDs are the threads of process pid (nil when the process is
	// unknown); a thread id may have been reused by another process, so
	// each thread's PID is checked.
	TIDs(pid uint32) map[uint32]struct{}
	// ProcComm is process pid's command name, ok when the process is known.
	ProcComm(pid uint32) (comm string, ok bool)
	// LoaderWaker says whether the wait ev of a thread of process pid
	// ended because a data-loader worker woke it.
	LoaderWaker(ev *event.Event, pid uint32) bool
}

// Attribution accumulates the breakdown and evidence of one interval: Add
// the time of the threads that explain it, then take the Result.
type Attribution struct {
	byCause  map[Cause]int64
	files    map[fileKey]*FileEvidence
	peers    map[string]*PeerEvidence
	children map[uint32]*ChildEvidence
	workers  map[uint32]*workerAcc
	syscalls map[string]int
	cudaNS   map[string]int64
	ops      map[*event.Event]*opAcc
	total    int64
	// micro weighs feeders for micro-gap attribution: time blocked in a
	// sync (the GPU was busy) and idle waits on nobody in particular (an
	// autograd worker parked on its queue while the main thread launches)
	// explain no idle and are left out.
	micro bool
	// written: file paths the thread wrote or synced in the interval
	// (a slow open of one of them is part of writing it).
	written map[string]bool
	// holders: lock holders by TID; holder is the one being charged now
	// (a sibling whose compute while the feeder waited is lock time).
	holders map[uint32]*holderAcc
	holder  *holderAcc
	// gil: the lock holder is charged for a wait on CPython's GIL.
	gil bool
	// waitAt is 1 + the index, among the segments Add walks, of the wait
	// waitT says what it waited on (queued); 0 when none.
	waitAt int
	waitT  waitTarget
}

// holderAcc is a lock holder's evidence and what it did while waited on.
type holderAcc struct {
	ev             LockHolderEvidence
	doing          map[Cause]int64
	fileNS, peerNS int64
	// block is its blocking call with a stack that was waited on longest
	// (blockNS of it), its code where it held the lock off the CPU.
	block   *event.Event
	blockNS int64
}

// blocked notes that the holder was in blocking call ev for ns of the wait.
func (h *holderAcc) blocked(ev *event.Event, ns int64) {
	if len(ev.Stack) > 0 && (ns > h.blockNS || ns == h.blockNS && h.block != nil && ev.Start < h.block.Start) {
		h.block, h.blockNS = ev, ns
	}
}

// did notes that the holder spent ns as its own cause c (on file or peer).
func (h *holderAcc) did(c Cause, ns int64, file, peer string) {
	h.doing[c] += ns
	if file != "" && ns > h.fileNS {
		h.ev.File, h.fileNS = file, ns
	}
	if peer != "" && ns > h.peerNS {
		h.ev.Peer, h.peerNS = peer, ns
	}
}

// heldWhile maps what a lock holder did to the waiter's cause: the
// holder waiting on the job's data (a reader, a loader worker, a peer: a
// pin-memory thread between the loop and its workers) passes that cause
// on; computing, waiting for a CPU, sleeping or anything else with the
// lock held is the lock's time.
func heldWhile(c Cause) Cause {
	switch c {
	case CauseIORead, CauseIOWrite, CauseNet, CauseLoaderWait, CauseCUDAMemcpy, CauseCUDAAlloc, CauseComm:
		return c
	}
	return CauseLock
}

// New is an empty attribution.
func New() *Attribution {
	return &Attribution{
		byCause:  map[Cause]int64{},
		files:    map[fileKey]*FileEvidence{},
		peers:    map[string]*PeerEvidence{},
		children: map[uint32]*ChildEvidence{},
		workers:  map[uint32]*workerAcc{},
		syscalls: map[string]int{},
		cudaNS:   map[string]int64{},
		ops:      map[*event.Event]*opAcc{},
	}
}

// absorbNS: on-CPU slivers this short between two blocking calls of the
// same cause belong to that cause. A thread in a read loop spends a few µs
// between calls, and calls shorter than the tracer's threshold (50 µs)
// never arrive, so its loop shows holes that are not computation.
const absorbNS = int64(100 * time.Microsecond)

// NewMicro is an attribution that weighs feeders for micro-gap
// attribution (the micro field): read its ByCause, not its Result.
func NewMicro() *Attribution {
	at := New()
	at.micro = true
	return at
}

// ByCause is the time added so far, by cause.
func (at *Attribution) ByCause() map[Cause]int64 { return at.byCause }

// Add adds what th did over [a,b) outside mask, following its waits
// through world. The world is an argument, not a field: an interface
// reached through the Attribution would make the compiler move all of its
// maps to the heap.
func (at *Attribution) Add(world World, th *Thread, a, b int64, mask []interval.Span) {
	segs := th.Segments(a, b, mask)
	for _, s := range segs {
		if ev := s.Ev; ev != nil && ev.Kind == event.KindSyscall && ev.Path != "" &&
			(ev.Syscall == event.SysWrite || ev.Syscall == event.SysFsync) {
			if at.written == nil {
				at.written = map[string]bool{}
			}
			at.written[ev.Path] = true
		}
	}
	next := callAfter(segs)
	at.waitAt = 0
	for i, s := range segs {
		if c := at.absorbed(world, th, segs, i); c != "" {
			if !at.micro || c != CauseOther {
				at.byCause[c] += s.B - s.A
				at.total += s.B - s.A
			}
			continue
		}
		if at.queued(world, th, segs, i, next) {
			continue
		}
		at.segment(world, th, s, 0)
	}
}

// absorbed is the cause of segs[i] when it is an on-CPU sliver (absorbNS
// at most) between two blocking calls of th of that same cause, "" when
// it is not one.
func (at *Attribution) absorbed(world World, th *Thread, segs []Segment, i int) Cause {
	s := segs[i]
	if s.Ev != nil || s.B-s.A > absorbNS || i == 0 || i+1 >= len(segs) ||
		segs[i-1].Ev == nil || segs[i+1].Ev == nil || segs[i-1].B != s.A || segs[i+1].A != s.B {
		return ""
	}
	if c := at.quickCause(world, th, segs[i-1].Ev); c == at.quickCause(world, th, segs[i+1].Ev) {
		return c
	}
	return ""
}

// lockHolder is the evidence entry of sibling thread th as a lock holder.
func (at *Attribution) lockHolder(th *Thread) *holderAcc {
	if at.holders == nil {
		at.holders = map[uint32]*holderAcc{}
	}
	h := at.holders[th.TID]
	if h == nil {
		h = &holderAcc{ev: LockHolderEvidence{TID: th.TID, Comm: th.Comm}, doing: map[Cause]int64{}}
		at.holders[th.TID] = h
	}
	return h
}

// quickCause is the cause segment gives ev without recording evidence;
// "" when it depends on another thread.
func (at *Attribution) quickCause(world World, th *Thread, ev *event.Event) Cause {
	if ev.Kind == event.KindSync {
		return ""
	}
	if isWait(ev) {
		w := ev.WakerPID
		if w != 0 && w != th.PID && !timedOut(ev) && world.LoaderWaker(ev, th.PID) {
			return CauseLoaderWait
		}
		return ""
	}
	return BaseCause(ev)
}

func (at *Attribution) segment(world World, th *Thread, s Segment, depth int) {
	ns := s.B - s.A
	if ns <= 0 {
		return
	}
	if depth == 0 {
		at.total += ns
	}
	ev := s.Ev
	if ev != nil && at.micro && ev.Kind == event.KindSync {
		return
	}
	if ev == nil {
		if at.holder != nil {
			at.holder.did(CauseCPU, ns, "", "")
			at.byCause[CauseLock] += ns
			return
		}
		at.byCause[CauseCPU] += ns
		return
	}
	if isWait(ev) {
		switch t := at.waitedOn(world, th, ev, s.A, s.B, depth); {
		case t.loader != 0:
			if at.holder != nil {
				at.holder.did(CauseLoaderWait, ns, "", "")
			}
			at.byCause[CauseLoaderWait] += ns
			at.note(world, th, ev, ns)
			at.worker(world, t.loader, s.A, s.B)
			return
		case t.sib != nil:
			// Waiting on a sibling thread: charge what the sibling did
			// while it was waited on (it held the lock, fed the queue...).
			at.note(world, th, ev, ns)
			at.sibling(world, ev, t.sib, s.A, s.B, ns)
			return
		case t.lock:
			// No holder was seen (it computed without emitting anything),
			// but the interpreter itself waited on a condition with a
			// timeout: the GIL's switch-interval wait, or a threading lock
			// acquired with a timeout. The wait is the lock's.
			at.byCause[CauseLock] += ns
			at.note(world, th, ev, ns)
			return
		}
		if at.micro {
			return
		}
	}
	c := at.cause(ev)
	own := c
	switch {
	case at.gil:
		// Waiting for the GIL is waiting for the interpreter, whatever its
		// holder does with it.
		c = CauseLock
	case at.holder != nil:
		// A holder waiting for a CPU still holds the lock: the feeder
		// waits on the lock, and the machine's load only lengthens it.
		c = heldWhile(c)
	}
	at.byCause[c] += ns
	at.note(world, th, ev, ns)
	// The evidence is what the thread did (own): a GIL holder's write
	// names its file, though the waiter's time is the lock's.
	var file, peer string
	switch own {
	case CauseIORead, CauseIOWrite:
		f := at.file(ev)
		f.NS += ns
		file = f.Path
	case CauseNet:
		p := at.peer(world, ev)
		p.NS += ns
		peer = p.Address
	case CauseSubprocess:
		at.child(ev).NS += ns
	case CauseCUDAMemcpy, CauseCUDAAlloc, CauseComm:
		at.cudaNS[opName(ev)] += ns
	}
	if at.holder != nil {
		at.holder.did(own, ns, file, peer)
		at.holder.blocked(ev, ns)
	}
}

// note counts a blocking interval once (calls, bytes) and its share of time.
func (at *Attribution) note(world World, th *Thread, ev *event.Event, ns int64) {
	o := at.ops[ev]
	first := o == nil
	if first {
		o = &opAcc{ev: ev, tid: th.TID}
		at.ops[ev] = o
	}
	o.ns += ns
	if !first {
		return
	}
	if ev.Kind == event.KindSyscall {
		at.syscalls[syscallName(ev)] += callsOf(ev)
	}
	var bytes uint64
	if ev.Kind == event.KindSyscall && ev.Ret > 0 {
		bytes = uint64(ev.Ret)
	} else {
		bytes = ev.Bytes
	}
	switch at.cause(ev) {
	case CauseIORead, CauseIOWrite:
		f := at.file(ev)
		f.Calls += callsOf(ev)
		f.Bytes += bytes
	case CauseNet:
		p := at.peer(world, ev)
		p.Calls++
		p.Bytes += bytes
	case CauseSubprocess:
		at.child(ev).Calls++
	}
}

// callsOf is how many calls syscall record ev stands for: a run of reads
// (event.Event Count) or one.
func callsOf(ev *event.Event) int {
	if ev.Kind == event.KindSyscall && ev.Count > 1 {
		return int(min(ev.Count, 1<<20))
	}
	return 1
}

// child is the evidence entry of the child process ev waited for: wait4
// names it and its command (the tracer, from its exec).
func (at *Attribution) child(ev *event.Event) *ChildEvidence {
	c := at.children[ev.ChildPID]
	if c == nil {
		c = &ChildEvidence{PID: ev.ChildPID, Command: ev.Path}
		at.children[ev.ChildPID] = c
	}
	return c
}

// cause is BaseCause with what the open's flags or the interval's other
// calls tell: a slow open is part of the file work that follows it
// (truncating a checkpoint before rewriting it, a cold lookup before a
// read). An open for writing (write access, O_CREAT, O_TRUNC, O_APPEND) is
// writing even where the gap ends before the writes (lite splits a save).
func (at *Attribution) cause(ev *event.Event) Cause {
	c := BaseCause(ev)
	if c == CauseOther && ev.Kind == event.KindSyscall && ev.Syscall == event.SysOpen && IsFile(ev) {
		if at.written[ev.Path] || opensForWriting(ev.OpenFlags) {
			return CauseIOWrite
		}
		return CauseIORead
	}
	return c
}

// opensForWriting reports whether open flags ask for writing: O_WRONLY,
// O_RDWR, O_CREAT, O_TRUNC or O_APPEND, by Linux's values (the flags come
// from the traced kernel, whatever the machine a recording is replayed on).
func opensForWriting(flags uint32) bool {
	const w = 0x1 | 0x2 | 0x40 | 0x200 | 0x400
	return flags&w != 0
}

// file is the evidence entry of ev's file and operation.
func (at *Attribution) file(ev *event.Event) *FileEvidence {
	op := "read"
	switch {
	case ev.Kind == event.KindOffCPU:
		op = "fault"
	case PathOp(ev):
		op = ev.Name // rename, unlink, truncate
	case ev.Syscall == event.SysWrite:
		op = "write"
	case ev.Syscall == event.SysFsync:
		op = "fsync"
	case ev.Syscall == event.SysOpen:
		op = "open"
	}
	k := fileKey{ev.Path, op}
	f := at.files[k]
	if f == nil {
		f = &FileEvidence{Path: ev.Path, Op: op}
		at.files[k] = f
	}
	return f
}

// peer is the evidence entry of ev's socket peer.
func (at *Attribution) peer(world World, ev *event.Event) *PeerEvidence {
	addr := ev.PeerAddr
	if addr == "" {
		addr = ev.Path
	}
	p := at.peers[addr]
	if p == nil {
		p = &PeerEvidence{Address: addr, PID: ev.PeerPID}
		if comm, ok := world.ProcComm(ev.PeerPID); ok && ev.PeerPID != 0 {
			p.Comm = comm
		}
		at.peers[addr] = p
	}
	return p
}

// worker records what loader worker process pid did over [a,b): time in
// file I/O decides whether it was reading or computing.
func (at *Attribution) worker(world World, pid uint32, a, b int64) {
	w := at.workers[pid]
	if w == nil {
		w = &workerAcc{pid: pid, files: map[string]int64{}, visited: map[*event.Event]bool{}}
		at.workers[pid] = w
	}
	w.waitNS += b - a
	for tid := range world.TIDs(pid) {
		th := world.Thread(tid)
		if th == nil || th.PID != pid {
			continue
		}
		for _, s := range th.Segments(a, b, nil) {
			if s.Ev == nil {
				continue
			}
			if c := BaseCause(s.Ev); (c == CauseIORead || c == CauseIOWrite) && !handOver(s.Ev) {
				w.ioNS += s.B - s.A
				w.files[s.Ev.Path] += s.B - s.A
				if !w.visited[s.Ev] {
					w.visited[s.Ev] = true
					w.calls++
				}
			}
		}
	}
}
