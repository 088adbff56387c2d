package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/tracer"
)

// snapshot gathers the detector's input: in-flight calls (the tracer's
// per-thread state), process states (/proc), members (collectives seen
// here and through --peers).
func (h *hangWatch) snapshot(now int64) (hang.Snapshot, error) {
	fl, prog, err := h.tr.InFlightCalls()
	if err != nil {
		return hang.Snapshot{}, err
	}
	pids := h.tr.Processes()
	s := hang.Snapshot{Now: now, Progress: map[uint32]int64(prog), Procs: map[uint32]hang.Proc{},
		Rank: map[uint32]int32{}, Host: h.host}
	for _, pid := range pids {
		s.Procs[uint32(pid)] = h.procState(uint32(pid))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for pid, p := range h.exited {
		if _, live := s.Procs[pid]; !live {
			s.Procs[pid] = p
		}
	}
	after := int64(h.det.After)
	for i := range fl {
		if c, ok := h.call(&fl[i], now, after); ok {
			s.Calls = append(s.Calls, c)
		}
	}
	// A process asleep in a long syscall of a feeding thread is waiting
	// on that file: what its peers' reports name it by.
	for _, c := range s.Calls {
		if p, ok := s.Procs[c.PID]; ok && c.Kind == hang.Syscall && c.Feeder && c.File != "" && p.File == "" {
			p.File = c.Name + " " + c.File
			s.Procs[c.PID] = p
		}
	}
	for k, c := range h.comms {
		rank, ranks := c.rank, c.ranks
		if ranks == 0 {
			rank, ranks = h.envRank(k.pid)
		}
		m := hang.Member{Proc: hang.Proc{PID: k.pid, Host: h.host}, Rank: rank, Ranks: ranks, Seq: c.n - 1,
			LastIssued: c.last.Issued}
		s.Members = append(s.Members, m)
		if rank >= 0 {
			s.Rank[k.pid] = rank
		}
	}
	for _, m := range h.remote {
		s.Members = append(s.Members, h.remoteMember(*m))
	}
	h.socketPeers(&s, pids, after)
	return s, nil
}

// socketPeers fills what the detector needs to name the ranks a wait
// outside NCCL waits for (h.mu held): the rank of every traced process from
// its environment, and for each process with a call past half the
// threshold, the traced processes at the other end of its sockets.
func (h *hangWatch) socketPeers(s *hang.Snapshot, pids []int, after int64) {
	for _, pid := range pids {
		if _, ok := s.Rank[uint32(pid)]; !ok && h.work != nil {
			if rk, n := h.envRank(uint32(pid)); n > 0 {
				s.Rank[uint32(pid)] = rk
			}
		}
	}
	for _, c := range s.Calls {
		if s.Now-c.Since < after/2 || c.Collective != nil || c.PeerPID != 0 {
			continue
		}
		if _, done := s.Connected[c.PID]; done {
			continue
		}
		if s.Connected == nil {
			s.Connected = map[uint32][]uint32{}
		}
		var peers []uint32
		for p := range h.tr.SocketPeers(c.PID) {
			if _, traced := s.Procs[p]; traced {
				peers = append(peers, p)
			}
		}
		s.Connected[c.PID] = peers
	}
}

// call turns one thread's in-flight state into the detector's Call: the
// CUDA call when there is one (a syscall inside it is its wait), else the
// syscall. Files and collectives are looked up only for calls already
// past half the threshold.
func (h *hangWatch) call(f *tracer.InFlight, now, after int64) (hang.Call, bool) {
	c := hang.Call{PID: f.PID, TID: f.TID, Feeder: f.Feeder, FD: -1}
	switch {
	case f.CUDA != event.CUDANone:
		c.Kind, c.Name, c.Since, c.Mono, c.Stream, c.Bytes = hang.CUDA, f.CUDA.String(), f.CUDAStart, f.CUDAMono, f.Stream, f.Bytes
		switch f.CUDA {
		case event.CUStreamSynchronize, event.CUCtxSynchronize, event.CUEventSynchronize:
			c.Kind = hang.Sync
		}
	case f.Syscall != "":
		c.Kind, c.Name, c.Since, c.Mono, c.FD = hang.Syscall, f.Syscall, f.SysStart, f.SysMono, f.FD
	default:
		return c, false
	}
	if now-c.Since < after/2 {
		return c, true
	}
	if c.Kind == hang.Syscall && c.FD >= 0 {
		c.File = fdTarget(c.PID, c.FD)
		if strings.HasPrefix(c.File, "socket:[") {
			c.PeerAddr, c.PeerPID = h.tr.SocketPeer(c.PID, c.FD)
		}
	}
	if c.Kind == hang.Sync {
		c.Collective = h.waitedCollective(&c)
	}
	return c, true
}

// waitedCollective is the collective a sync waits for: the last one its
// process issued, before the sync began, on the stream it synchronizes
// (any stream for a context or event sync).
func (h *hangWatch) waitedCollective(c *hang.Call) *hang.Collective {
	var best *commState
	if c.Name == event.CUStreamSynchronize.String() {
		if k, ok := h.streams[streamKey{c.PID, c.Stream}]; ok {
			best = h.comms[k]
		}
	} else {
		for k, cs := range h.comms {
			if k.pid == c.PID && cs.n > 0 && (best == nil || cs.last.Issued > best.last.Issued) {
				best = cs
			}
		}
	}
	if best == nil || best.n == 0 || best.last.Issued > c.Since {
		return nil
	}
	out := best.last
	out.Rank, out.Ranks = best.rank, best.ranks
	if out.Ranks == 0 {
		out.Rank, out.Ranks = h.envRank(c.PID)
	}
	return &out
}

// envRank is a process's rank and world size from its environment (RANK,
// WORLD_SIZE), read once; -1, 0 when it has none.
func (h *hangWatch) envRank(pid uint32) (int32, int32) {
	if r, ok := h.ranks[pid]; ok {
		if r < 0 {
			return -1, 0
		}
		return r & 0xffff, r >> 16
	}
	rank, size, ok := h.work.RankOf(pid)
	if !ok || rank < 0 || size <= 0 || rank >= 1<<15 || size >= 1<<15 {
		h.ranks[pid] = -1
		return -1, 0
	}
	h.ranks[pid] = int32(size)<<16 | int32(rank)
	return int32(rank), int32(size)
}

// procState reads a local process's state; for one in D, the wait channel
// and the file its blocked thread's syscall names.
func (h *hangWatch) procState(pid uint32) hang.Proc {
	p := hang.Proc{PID: pid, Host: h.host}
	dir := filepath.Join("/proc", strconv.Itoa(int(pid)))
	state, comm, ok := statState(filepath.Join(dir, "stat"))
	if !ok {
		p.State = hang.StateExited
		return p
	}
	p.Comm = comm
	switch state {
	case 'R':
		p.State = hang.StateRunning
	case 'S', 'I':
		p.State = hang.StateSleeping
	case 'T', 't':
		p.State = hang.StateStopped
	case 'Z', 'X':
		p.State = hang.StateZombie
		p.Exit = exitText(pid)
	case 'D':
		p.State = hang.StateDisk
	default:
		p.State = hang.StateUnknown
	}
	// A process is as stuck as its most stuck thread: one thread in D or
	// stopped is what its peers wait on.
	ents, _ := os.ReadDir(filepath.Join(dir, "task"))
	for _, e := range ents {
		td := filepath.Join(dir, "task", e.Name())
		st, _, ok := statState(filepath.Join(td, "stat"))
		if !ok {
			continue
		}
		if st == 'D' {
			p.State = hang.StateDisk
			if b, err := os.ReadFile(filepath.Join(td, "wchan")); err == nil {
				p.WChan = string(b)
			}
			p.File = blockedFile(pid, td)
			break
		}
		if (st == 'T' || st == 't') && p.State == hang.StateSleeping {
			p.State = hang.StateStopped
		}
	}
	return p
}

// statState reads the state letter and comm of a stat file.
func statState(path string) (byte, string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, "", false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 >= len(s) {
		return 0, "", false
	}
	return s[end+2], s[open+1 : end], true
}

// exitText reads a zombie's exit status from its stat file (field 52);
// "" when it is already reaped.
func exitText(pid uint32) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(pid)), "stat"))
	if err != nil {
		return ""
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return ""
	}
	f := strings.Fields(s[end+1:])
	// f[0] is field 3 (state); exit_code is field 52.
	if len(f) < 50 {
		return ""
	}
	code, err := strconv.Atoi(f[49])
	if err != nil {
		return ""
	}
	return waitText(code)
}

// waitText says an exit code as wait(2) encodes it.
func waitText(code int) string {
	if sig := code & 0x7f; sig != 0 {
		name := unix.SignalName(syscall.Signal(sig))
		if name == "" {
			name = strconv.Itoa(sig)
		}
		return "killed by " + name
	}
	return fmt.Sprintf("exit status %d", code>>8&0xff)
}

// blockedFile is the file a blocked thread's syscall names by its first
// argument (an fd), "" when it names none.
func blockedFile(pid uint32, taskDir string) string {
	b, err := os.ReadFile(filepath.Join(taskDir, "syscall"))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 2 || f[0] == "running" {
		return ""
	}
	fd, err := strconv.ParseInt(strings.TrimPrefix(f[1], "0x"), 16, 64)
	if err != nil || fd < 0 || fd > 1<<20 {
		return ""
	}
	return fdTarget(pid, int32(fd))
}

// fdTarget is what an fd of pid refers to (a path, "pipe:[ino]",
// "socket:[ino]"); "" when unreadable.
func fdTarget(pid uint32, fd int32) string {
	t, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(int(pid)), "fd", strconv.Itoa(int(fd))))
	if err != nil {
		return ""
	}
	return t
}

// gpuView is the latest GPU window of the process's device: GPM SM
// activity where the device has it, NVML's busy fraction beside it.
func (h *hangWatch) gpuView(pid uint32) *hang.GPUView {
	h.mu.Lock()
	defer h.mu.Unlock()
	dev, ok := h.devices[pid]
	if !ok {
		return nil
	}
	v := &hang.GPUView{Device: dev, SMActivity: -1, Utilization: -1}
	if w, ok := h.windows[windowKey{dev, event.SourceGPM}]; ok {
		v.SMActivity, v.At = w.SMActivity, w.End
	}
	if w, ok := h.windows[windowKey{dev, event.SourceNVML}]; ok {
		v.Utilization = 1 - w.IdleFraction
		v.At = max(v.At, w.End)
	}
	if v.At == 0 {
		return nil
	}
	return v
}

// allStacks takes every thread's stacks of every traced process now, with
// each thread's in-flight call.
func (h *hangWatch) allStacks(calls []hang.Call) []hang.Stacks {
	byTID := map[uint32]*hang.Call{}
	for i := range calls {
		byTID[calls[i].TID] = &calls[i]
	}
	var out []hang.Stacks
	for _, pid := range h.tr.Processes() {
		ts, err := h.tr.ThreadStacks(uint32(pid))
		st := hang.Stacks{PID: uint32(pid)}
		if err != nil {
			st.State = hang.StateExited
			out = append(out, st)
			continue
		}
		p := h.procState(uint32(pid))
		st.Comm, st.State = p.Comm, p.State
		for _, t := range ts {
			th := hang.Thread{TID: t.TID, Comm: t.Comm, State: t.State, WChan: t.WChan, Syscall: t.Syscall, Err: t.Err,
				InFlight: byTID[t.TID], Native: frames(t.Native), Python: frames(t.Python)}
			st.Threads = append(st.Threads, th)
		}
		out = append(out, st)
	}
	return out
}

func frames(fs []event.Frame) []hang.Frame {
	if len(fs) == 0 {
		return nil
	}
	out := make([]hang.Frame, len(fs))
	for i, f := range fs {
		out[i] = hang.Frame{Function: f.Function, File: f.File, Line: f.Line}
		if f.Source != "" {
			out[i].File = f.Source
		}
	}
	return out
}
