package correlate

import (
	"fmt"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/ranks"
	"github.com/gaptrace/gaptrace/event"
)

// world is everything the engine knows exists: processes, threads,
// devices and NCCL communicators (a ranks.Registry). Models read it
// (attribution follows a wait to the thread or worker that ended it); only
// the engine adds to it and forgets from it.
type world struct {
	// samples: every traced thread's recent CPU samples (samples.go).
	samples samples
	// noWindows: no device sends GPU windows (Config.NoGPUWindows).
	noWindows bool
	// gpmComing: the devices whose GPM windows will come (Config.GPMDevices).
	gpmComing map[int]bool
	devOf     map[uint32]int
	procs     map[uint32]*proc
	threads   map[uint32]*attribute.Thread
	devs      map[int]*device
	// ranks: the NCCL communicators of every traced process, and of the
	// processes other sidecars of the job trace (correlate/ranks).
	ranks *ranks.Registry
	// droppedIntervals: timeline intervals every thread dropped past
	// attribute.MaxIntervals (threads hold a pointer to it: the world is never
	// copied once threads exist).
	droppedIntervals uint64
	// hex: handles (communicators, streams) as collective evidence names
	// them, formatted once each: a job uses a few, every collective
	// names two (hexName).
	hex map[uint64]string
}

func newWorld(noWindows bool, gpmDevices []int) world {
	procs := map[uint32]*proc{}
	gpmComing := map[int]bool{}
	for _, d := range gpmDevices {
		gpmComing[d] = true
	}
	return world{
		noWindows: noWindows,
		gpmComing: gpmComing,
		devOf:     map[uint32]int{},
		procs:     procs,
		threads:   map[uint32]*attribute.Thread{},
		devs:      map[int]*device{},
		ranks: ranks.New(func(pid uint32) bool {
			p := procs[pid]
			return p != nil && p.exitedAt == 0
		}),
	}
}

func (w *world) device(id int) *device {
	d := w.devs[id]
	if d == nil {
		d = &device{id: id, bg: -1, noWindows: w.noWindows, gpmComing: w.gpmComing[id] && !w.noWindows}
		w.devs[id] = d
	}
	return d
}

func (w *world) proc(pid uint32, t int64) *proc {
	p := w.procs[pid]
	if p == nil {
		p = newProc(pid, w.devOf[pid], t)
		w.procs[pid] = p
	}
	return p
}

func (w *world) thread(ev *event.Event) *attribute.Thread {
	th := w.threads[ev.TID]
	// A thread id reused after its thread exited is a new thread.
	if th == nil || th.PID != ev.PID || (th.Exited != 0 && ev.Start >= th.Exited) {
		th = w.newThread(ev.TID, ev.PID)
		w.threads[ev.TID] = th
		w.proc(ev.PID, ev.Start).tids[ev.TID] = struct{}{}
	}
	if ev.TaskComm != "" {
		th.Comm = ev.TaskComm
	}
	return th
}

// newThread is a thread whose timeline drops count in the world's total.
func (w *world) newThread(tid, pid uint32) *attribute.Thread {
	return attribute.NewThread(tid, pid, &w.droppedIntervals)
}

func (w *world) forget(p *proc) {
	for tid := range p.tids {
		if th := w.threads[tid]; th != nil && th.PID == p.pid {
			delete(w.threads, tid)
		}
	}
	delete(w.procs, p.pid)
	w.ranks.Forget(p.pid)
}

// isWorker reports whether process wp can be a data-loader worker of
// feeder process pid: traced (part of the tree), not one of its ancestors
// (a launcher), and not itself feeding a GPU (a sibling DDP rank).
func (w *world) isWorker(wp, pid uint32) bool {
	p, ok := w.procs[wp]
	return ok && !p.everEnq && !w.ancestor(wp, pid)
}

// ancestor reports whether a is an ancestor of pid.
func (w *world) ancestor(a, pid uint32) bool {
	for i := 0; i < maxAncestry; i++ {
		p := w.procs[pid]
		if p == nil || p.parent == 0 {
			return false
		}
		if p.parent == a {
			return true
		}
		pid = p.parent
	}
	return false
}

// maxAncestry bounds the walk up the process tree (a cycle from reused
// pids must not hang the engine).
const maxAncestry = 64

// LoaderWaker reports whether the wait ev of a thread of process pid ended
// because a data-loader worker woke it. A pipe writer not seen yet counts
// too: when attaching to a running trainer, workers forked before the
// attach are known only once they emit something, and a worker that only
// computes emits nothing.
func (w *world) LoaderWaker(ev *event.Event, pid uint32) bool {
	wp := ev.WakerPID
	return w.isWorker(wp, pid) || (ev.FDKind == event.FDPipe && w.procs[wp] == nil)
}

// The world as attribution reads it (attribute.World).
var _ attribute.World = (*world)(nil)

// Thread is the thread tid, nil when unknown.
func (w *world) Thread(tid uint32) *attribute.Thread { return w.threads[tid] }

// TIDs are the threads of process pid, nil when the process is unknown.
func (w *world) TIDs(pid uint32) map[uint32]struct{} {
	if p := w.procs[pid]; p != nil {
		return p.tids
	}
	return nil
}

// ProcComm is process pid's command name, ok when the process is known.
func (w *world) ProcComm(pid uint32) (string, bool) {
	if p := w.procs[pid]; p != nil {
		return p.comm, true
	}
	return "", false
}

// collEvidence describes the collective ev enqueued.
func (w *world) collEvidence(ev *event.Event) *CollectiveEvidence {
	c := &CollectiveEvidence{Op: ev.Op.String(), Bytes: ev.Bytes, Comm: w.hexName(ev.Comm)}
	if rank, n, ok := w.ranks.RankIn(ev.PID, ev.Comm); ok {
		c.Ranks, c.Rank = n, &rank
		// Whom a collective waits on: every other rank. With two ranks
		// that is the late peer itself; with more, the late one is the
		// rank whose own span in the job's shared trace shows no wait.
		if n <= maxWaitingOn {
			for r := int32(0); r < n; r++ {
				if r != rank {
					c.WaitingOn = append(c.WaitingOn, r)
				}
			}
		}
	}
	if ev.PeerRank >= 0 {
		c.PeerRank = ev.PeerRank
	}
	if ev.Stream != 0 {
		c.Stream = w.hexName(ev.Stream)
	}
	return c
}

// maxHexNames bounds world.hex; past it the names start over.
const maxHexNames = 1024

// hexName is fmt.Sprintf("0x%x", v), kept for the next collective.
func (w *world) hexName(v uint64) string {
	if s, ok := w.hex[v]; ok {
		return s
	}
	if w.hex == nil || len(w.hex) >= maxHexNames {
		w.hex = map[uint64]string{}
	}
	s := fmt.Sprintf("0x%x", v)
	w.hex[v] = s
	return s
}

// maxWaitingOn: communicators up to this size list the ranks a collective
// waited on (CollectiveEvidence.WaitingOn).
const maxWaitingOn = 8
