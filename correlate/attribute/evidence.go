package attribute

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gaptrace/gaptrace/event"
)

// An attribution's result: the dominant cause, the breakdown, and the
// evidence a user checks it by, bounded to the top entries.

// Dominant is the cause with the most time in bd, the first in Causes on
// ties; cpu when bd holds no time.
func Dominant(bd map[Cause]int64) Cause {
	dom, best := CauseCPU, int64(0)
	for _, c := range Causes {
		if ns := bd[c]; ns > best {
			dom, best = c, ns
		}
	}
	return dom
}

// Result turns the accumulators into a dominant cause, a breakdown and
// capped evidence (its Source and Threads are the caller's to set).
func (at *Attribution) Result() (Cause, map[Cause]int64, Evidence, []HostOp) {
	bd := make(map[Cause]int64, len(at.byCause))
	for _, c := range Causes {
		if ns := at.byCause[c]; ns > 0 {
			bd[c] = ns
		}
	}
	dom := Dominant(bd)
	var ev Evidence
	// A staged copy is named whatever won: preempted on a loaded host it
	// is contention, and still a copy from pageable memory to fix.
	var top *opAcc
	for _, o := range at.ops {
		if o.ev.Kind == event.KindMemcpyStaged && (top == nil || o.ns > top.ns || o.ns == top.ns && o.ev.Start < top.ev.Start) {
			top = o
		}
	}
	if top != nil {
		ev.Copy = copyEvidence(top.ev)
	}
	if o := at.stackOp(dom); o != nil {
		ev.Stack, ev.StackTruncated = o.ev.Stack, o.ev.StackTruncated
	} else if top != nil && len(top.ev.Stack) > 0 && (dom == CauseCPUContention || dom == CauseCPU) {
		// The host was staging that copy when it lost its CPU: the copy's
		// line is the one to change.
		ev.Stack, ev.StackTruncated = top.ev.Stack, top.ev.StackTruncated
	}
	at.filesAndPeers(&ev)
	at.workerEvidence(&ev)
	at.lockHolders(&ev)
	var cbest int64
	for name, ns := range at.cudaNS {
		if ns > cbest || (ns == cbest && name < ev.CUDACall) {
			ev.CUDACall, cbest = name, ns
		}
	}
	at.syscallCounts(&ev)
	hops := at.hostOps()
	return dom, bd, ev, hops
}

// TopFiles orders files the longest first (by path, then op, on ties) and
// keeps the first maxFiles: a gap's file evidence, wherever it is added.
func TopFiles(files []FileEvidence) []FileEvidence {
	sort.Slice(files, func(i, j int) bool {
		if files[i].NS != files[j].NS {
			return files[i].NS > files[j].NS
		}
		if files[i].Path != files[j].Path {
			return files[i].Path < files[j].Path
		}
		return files[i].Op < files[j].Op
	})
	if len(files) > maxFiles {
		files = files[:maxFiles]
	}
	return files
}

// filesAndPeers lists the files and socket peers the interval touched, the
// longest first, up to maxFiles and maxPeers.
func (at *Attribution) filesAndPeers(ev *Evidence) {
	for _, f := range at.files {
		ev.Files = append(ev.Files, *f)
	}
	ev.Files = TopFiles(ev.Files)
	for _, p := range at.peers {
		ev.Peers = append(ev.Peers, *p)
	}
	sort.Slice(ev.Peers, func(i, j int) bool {
		if ev.Peers[i].NS != ev.Peers[j].NS {
			return ev.Peers[i].NS > ev.Peers[j].NS
		}
		return ev.Peers[i].Address < ev.Peers[j].Address
	})
	if len(ev.Peers) > maxPeers {
		ev.Peers = ev.Peers[:maxPeers]
	}
	for _, c := range at.children {
		ev.Children = append(ev.Children, *c)
	}
	sort.Slice(ev.Children, func(i, j int) bool {
		if ev.Children[i].NS != ev.Children[j].NS {
			return ev.Children[i].NS > ev.Children[j].NS
		}
		return ev.Children[i].PID < ev.Children[j].PID
	})
	if len(ev.Children) > maxPeers {
		ev.Children = ev.Children[:maxPeers]
	}
}

// workerEvidence says what each loader worker waited on did, by pid.
func (at *Attribution) workerEvidence(ev *Evidence) {
	for _, w := range at.workers {
		we := WorkerEvidence{PID: w.pid, Activity: "cpu", IONS: w.ioNS}
		if w.waitNS > 0 && 2*w.ioNS >= w.waitNS {
			we.Activity = "io"
		}
		for _, p := range topKeys(w.files, maxWFiles) {
			if p != "" {
				we.Files = append(we.Files, p)
			}
		}
		ev.Workers = append(ev.Workers, we)
	}
	sort.Slice(ev.Workers, func(i, j int) bool { return ev.Workers[i].PID < ev.Workers[j].PID })
	if len(ev.Workers) > maxWorkers {
		ev.Workers = ev.Workers[:maxWorkers]
	}
}

// lockHolders lists the threads that held the lock waited on, the longest
// wait first, each with what it mostly did.
func (at *Attribution) lockHolders(ev *Evidence) {
	if len(at.holders) > 0 {
		for _, h := range at.holders {
			e := h.ev
			var top int64
			for _, c := range Causes {
				if ns := h.doing[c]; ns > top {
					e.Doing, top = c, ns
				}
			}
			e.RunnableNS = h.doing[CauseCPUContention]
			if b := h.block; b != nil {
				e.Stack, e.StackTruncated = b.Stack, b.StackTruncated
				if len(e.Stack) > maxHolderFrames {
					e.Stack, e.StackTruncated = e.Stack[:maxHolderFrames], true
				}
			}
			ev.LockHolders = append(ev.LockHolders, e)
		}
		sort.Slice(ev.LockHolders, func(i, j int) bool {
			if ev.LockHolders[i].NS != ev.LockHolders[j].NS {
				return ev.LockHolders[i].NS > ev.LockHolders[j].NS
			}
			return ev.LockHolders[i].TID < ev.LockHolders[j].TID
		})
		if len(ev.LockHolders) > maxWorkers {
			ev.LockHolders = ev.LockHolders[:maxWorkers]
		}
	}
}

// syscallCounts keeps the maxSyscalls most frequent syscalls.
func (at *Attribution) syscallCounts(ev *Evidence) {
	if len(at.syscalls) > 0 {
		ev.Syscalls = make(map[string]int, len(at.syscalls))
		for _, n := range topKeys(at.syscalls, maxSyscalls) {
			ev.Syscalls[n] = at.syscalls[n]
		}
	}
}

// topKeys is the n keys of m with the largest values, the largest first
// (ties by key).
func topKeys[V cmp.Ordered](m map[string]V, n int) []string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(m[b], m[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return keys[:min(n, len(keys))]
}

// hostOps are the maxOps longest host operations, in time order.
func (at *Attribution) hostOps() []HostOp {
	ops := make([]*opAcc, 0, len(at.ops))
	for _, o := range at.ops {
		ops = append(ops, o)
	}
	sort.Slice(ops, func(i, j int) bool {
		if ops[i].ns != ops[j].ns {
			return ops[i].ns > ops[j].ns
		}
		a, b := ops[i], ops[j]
		if a.ev.Start != b.ev.Start {
			return a.ev.Start < b.ev.Start
		}
		if a.ev.End != b.ev.End {
			return a.ev.End < b.ev.End
		}
		return a.tid < b.tid
	})
	if len(ops) > maxOps {
		ops = ops[:maxOps]
	}
	var hops []HostOp
	for _, o := range ops {
		hops = append(hops, HostOpOf(o.ev, o.tid))
	}
	sort.SliceStable(hops, func(i, j int) bool { return hops[i].Start < hops[j].Start })
	return hops
}

// HostOpOf is thread tid's blocking call ev as a host operation.
func HostOpOf(ev *event.Event, tid uint32) HostOp {
	op := HostOp{Name: opName(ev), TID: tid, Start: ev.Start, End: ev.End}
	attrs := map[string]string{}
	switch {
	case isChildWait(ev):
		// The child waited for, and what it ran.
		if ev.ChildPID != 0 {
			attrs["process.child.pid"] = strconv.FormatUint(uint64(ev.ChildPID), 10)
		}
		if ev.Path != "" {
			attrs["process.command_line"] = ev.Path
		}
	case ev.Path != "":
		attrs["file.path"] = ev.Path
	}
	if ev.PeerAddr != "" {
		attrs["network.peer.address"] = ev.PeerAddr
	}
	if ev.PeerPID != 0 {
		attrs["network.peer.pid"] = strconv.FormatUint(uint64(ev.PeerPID), 10)
	}
	if ev.WakerPID != 0 {
		attrs["waker.pid"] = strconv.FormatUint(uint64(ev.WakerPID), 10)
	}
	if ev.Kind == event.KindSyscall && ev.Ret > 0 {
		attrs["bytes"] = strconv.FormatInt(ev.Ret, 10)
	} else if ev.Bytes > 0 {
		attrs["bytes"] = strconv.FormatUint(ev.Bytes, 10)
	}
	if ev.Stream != 0 {
		attrs["cuda.stream"] = fmt.Sprintf("0x%x", ev.Stream)
	}
	if len(attrs) > 0 {
		op.Attrs = attrs
	}
	return op
}

// stackOp is the blocking call whose stack explains the interval: the one
// with a stack that took most of the dominant cause's time (ties: the
// earliest). nil when no call of that cause has a stack (a cpu gap): then
// the gap takes the stack of the call that opened it, not that of an
// unrelated short call inside it. A lock or a data-loader wait is charged
// through the thread that woke the wait, not by the call itself: the
// wait is its call (the GIL taken back after time.sleep(0), the queue
// get inside next(loader)).
func (at *Attribution) stackOp(dom Cause) *opAcc {
	var best *opAcc
	for _, o := range at.ops {
		if len(o.ev.Stack) == 0 {
			continue
		}
		waitedOn := isWait(o.ev) && (dom == CauseLock || dom == CauseLoaderWait)
		if at.cause(o.ev) != dom && !waitedOn {
			continue
		}
		if best == nil || o.ns > best.ns || o.ns == best.ns && o.ev.Start < best.ev.Start {
			best = o
		}
	}
	return best
}

// PageableFix is what a user does about a pageable copy.
const PageableFix = "pin the host buffer (pin_memory=True / cudaHostRegister)"

// copyEvidence describes the staged copy that took most of a gap.
func copyEvidence(ev *event.Event) *CopyEvidence {
	c := &CopyEvidence{Call: stagedName(ev), Bytes: ev.Bytes, NS: ev.Duration(), Pageable: true, Fix: PageableFix}
	switch ev.CopyDir {
	case event.CUMemcpyHtoD:
		c.Direction = "htod"
	case event.CUMemcpyDtoH:
		c.Direction = "dtoh"
	default:
		c.Direction = "unknown"
	}
	if c.NS > 0 && c.Bytes > 0 {
		c.GBps = float64(c.Bytes) / float64(c.NS)
	}
	return c
}

// stagedName is the driver call behind a KindMemcpyStaged.
func stagedName(ev *event.Event) string {
	switch ev.CopyDir {
	case event.CUMemcpyHtoD:
		return "cuMemcpyHtoDAsync"
	case event.CUMemcpyDtoH:
		return "cuMemcpyDtoHAsync"
	}
	return "cuMemcpyAsync"
}

// Stack is the stack of the blocking call that explains cause c (stackOp):
// ok is false when no call of that cause has one.
func (at *Attribution) Stack(c Cause) (stack []event.Frame, truncated, ok bool) {
	o := at.stackOp(c)
	if o == nil {
		return nil, false, false
	}
	return o.ev.Stack, o.ev.StackTruncated, true
}
