package tracer

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/prometheus/procfs"

	"github.com/gaptrace/gaptrace/internal/hostproc"
	"github.com/gaptrace/gaptrace/internal/wake"
)

// Trace starts tracing pid, its existing descendants and, from now on, every
// process they fork. Uprobes are attached to the CUDA/NCCL libraries each
// process maps, now and whenever it maps them later.
func (t *Tracer) Trace(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("trace pid %d: invalid pid", pid)
	}
	tgid, err := hostproc.ThreadGroup(pid)
	if err != nil {
		return fmt.Errorf("trace pid %d: %w", pid, err)
	}
	if tgid != pid {
		t.log.Info("tracing the process of the given thread", "tid", pid, "pid", tgid)
		pid = tgid
	}
	t.mu.Lock()
	t.roots[uint32(pid)] = true
	t.mu.Unlock()
	pids := []uint32{uint32(pid)}
	for _, d := range hostproc.Descendants(pid) {
		pids = append(pids, uint32(d))
	}
	for i, p := range pids {
		// The process the user named is the job itself: it takes stacks
		// from its first event. Its running descendants start as the ones
		// it forks later do: a data-loader worker (forked from a CUDA
		// process, so it maps libcuda too) never feeds the GPU, and a rank
		// under a launcher is marked by its next CUDA call.
		flags := tgidTraced
		if i == 0 {
			flags |= tgidGPU
		}
		if err := t.addProcess(p, flags); err != nil {
			return fmt.Errorf("trace pid %d: %w", p, err)
		}
	}
	for _, p := range pids {
		t.scanProcess(p)
	}
	return nil
}

// traced_tgids values (TGID_* in bpf/common.h).
const (
	tgidTraced uint32 = 1
	// tgidGPU: the process feeds the GPU (made a probed CUDA or NCCL call,
	// or was named): its long syscalls take stacks. A child forked by a
	// traced process starts without it, and so does a descendant already
	// running when the named one is attached to.
	tgidGPU uint32 = 2
)

// addProcess tracks pid in user space and, with flags (tgid*), in
// traced_tgids; flags 0: the kernel already did (forked children are
// added by the fork program).
func (t *Tracer) addProcess(pid uint32, flags uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("tracer closed")
	}
	if flags != 0 {
		if err := t.shared[cudaMapTracedTgids].Put(pid, flags); err != nil {
			return fmt.Errorf("add to traced_tgids: %w", err)
		}
	}
	if _, ok := t.procs[pid]; !ok {
		t.procs[pid] = &procState{libs: make(map[string]*libAttach)}
	}
	return nil
}

// libraryOf says whether a mapped file is one of the libraries we probe.
func (t *Tracer) libraryOf(path string) (library, bool) {
	base := filepath.Base(path)
	switch {
	case t.cfg.LibCUDA != "" && path == t.cfg.LibCUDA, t.cfg.LibCUDA == "" && strings.HasPrefix(base, "libcuda.so"):
		return libCUDA, true
	case t.cfg.LibNCCL != "" && path == t.cfg.LibNCCL, t.cfg.LibNCCL == "" && strings.HasPrefix(base, "libnccl.so"):
		return libNCCL, true
	}
	return 0, false
}

// scanProcess reads /proc/PID/maps and attaches uprobes to probed libraries
// the process maps and that are not attached for it yet.
//
// It returns a signature of the process's executable file mappings (their
// paths): the periodic rescan backs off while it stays the same.
func (t *Tracer) scanProcess(pid uint32) uint64 {
	// One scan at a time: Trace and the rescanner may look at the same
	// process at once, and attaching a library twice would count every
	// call twice.
	t.scanMu.Lock()
	defer t.scanMu.Unlock()
	t.mu.Lock()
	ps, ok := t.procs[pid]
	closed := t.closed
	t.mu.Unlock()
	if !ok || closed {
		return 0
	}
	libs := make(map[string]library)
	var sig uint64
	if t.cfg.LibCUDA != "" {
		libs[t.cfg.LibCUDA] = libCUDA
	}
	if t.cfg.LibNCCL != "" {
		libs[t.cfg.LibNCCL] = libNCCL
	}
	var maps []*procfs.ProcMap
	if proc, err := procfs.NewProc(int(pid)); err == nil {
		if maps, err = proc.ProcMaps(); err != nil {
			t.log.Debug("read maps", "pid", pid, "error", err)
		}
		for _, m := range maps {
			if m.Pathname == "" || !strings.HasPrefix(m.Pathname, "/") {
				continue
			}
			if m.Perms != nil && m.Perms.Execute {
				sig += pathSig(m.Pathname, m.StartAddr)
			}
			if lib, ok := t.libraryOf(m.Pathname); ok {
				libs[m.Pathname] = lib
			} else if _, ok := libs[m.Pathname]; !ok && m.Perms != nil && m.Perms.Execute &&
				definesMarker.addr(filepath.Join(procRoot, strconv.Itoa(int(pid)), "root", m.Pathname)) != 0 {
				libs[m.Pathname] = libMarker
			}
		}
	}
	// Apart from the scan: a loop that starts right after loading libcuda
	// runs unseen until the libraries' probes attach, while reading the
	// interpreter's symbols for its stacks takes tens of milliseconds
	// (60-75 ms on the 2-core VM), and a scan after the exec read them
	// while libcuda's scan waited.
	if maps != nil {
		select {
		case t.pyReq <- pyRequest{pid: pid, maps: maps}:
		default: // a later scan asks again: the process is not marked tried
		}
	}
	t.noteUnmapped(pid, libs)
	paths := make([]string, 0, len(libs))
	for p := range libs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		t.mu.Lock()
		_, done := ps.libs[p]
		t.mu.Unlock()
		if done {
			continue
		}
		la := t.attachLibrary(pid, p, libs[p])
		t.mu.Lock()
		if t.closed || t.procs[pid] != ps {
			t.mu.Unlock()
			if err := closeLinks(la.allLinks()); err != nil {
				t.log.Debug("detach uprobes of a process gone while attaching", "pid", pid, "error", err)
			}
			return sig
		}
		ps.libs[p] = la
		t.mu.Unlock()
	}
	return sig
}

// pathSig is one executable mapping's share of a scan's signature: a sum
// over the mappings, so their order in the maps does not count.
func pathSig(path string, start uintptr) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(path))
	return h.Sum64() ^ uint64(start)*0x9e3779b97f4a7c15
}

// noteUnmapped keeps a warning in Stats.Missing while a traced root process
// maps no CUDA driver (not loaded yet, or not a CUDA process at all); it
// goes away once the library shows up and its probes attach.
func (t *Tracer) noteUnmapped(pid uint32, libs map[string]library) {
	hasCUDA := false
	for _, lib := range libs {
		hasCUDA = hasCUDA || lib == libCUDA
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.roots[pid] {
		return
	}
	if hasCUDA {
		delete(t.unmapped, pid)
		return
	}
	if _, ok := t.unmapped[pid]; !ok {
		msg := fmt.Sprintf("libcuda.so.1: not mapped by pid %d (yet); CUDA probes attach when it is", pid)
		t.unmapped[pid] = msg
		// Debug: every command started under tracing and every Python
		// trainer is here before it loads the driver. One that never
		// does is said in the summary (Stats.Missing, no GPU activity).
		t.log.Debug("CUDA driver library not mapped by the traced process (yet)", "pid", pid)
	}
}

// dropProcess detaches a process's uprobes and forgets its state (it exited).
func (t *Tracer) dropProcess(pid uint32) {
	t.mu.Lock()
	ps, ok := t.procs[pid]
	if ok {
		delete(t.procs, pid)
	}
	delete(t.roots, pid)
	delete(t.unmapped, pid)
	if ok && len(ps.libs) > 0 {
		// Unregistering a uprobe waits for an RCU grace period (tens of
		// ms each here): never on the decode path, or the ring buffer
		// fills while a process with many probes exits.
		var ls []link.Link
		for _, la := range ps.libs {
			ls = append(ls, la.allLinks()...)
		}
		t.detaching.Add(1)
		go func() {
			defer t.detaching.Done()
			if err := closeLinksParallel(ls); err != nil {
				t.log.Debug("detach uprobes", "pid", pid, "error", err)
			}
		}()
	}
	t.mu.Unlock()
	t.fds.forgetProcess(pid)
}

func (t *Tracer) requestRescan(pid uint32) {
	select {
	case t.rescan <- pid:
	default: // the periodic rescan catches up
	}
}

// rescanDebounce batches mmap bursts (a dlopen maps several segments;
// only the executable one is reported). Short: a loop that starts right
// after loading libcuda (a ctypes trainer) runs unseen until the scan
// attaches its probes, and a scan costs well under a millisecond.
const rescanDebounce = 2 * time.Millisecond

// rescanBackoff bounds how far the periodic rescan of a process backs off
// while its executable mappings stay the same. The rescan is a fallback:
// an executable mmap asks for a scan at once (requestRescan), and reading
// a PyTorch process's maps (thousands of lines) costs milliseconds of the
// kernel's time, which at one a second per process was 0.6-1% of a core
// on an H100 job with two loader workers.
const rescanBackoff = 8 * time.Second

// rescanState is one process's periodic rescan: the last signature and
// how long until the next.
type rescanState struct {
	sig   uint64
	every time.Duration
	due   time.Time
}

// next records a scan's signature at now: the interval doubles while
// nothing changed (up to rescanBackoff) and starts over when it did.
func (r *rescanState) next(sig uint64, now time.Time, base time.Duration) {
	if sig == r.sig && r.every > 0 {
		r.every = min(2*r.every, max(base, rescanBackoff))
	} else {
		r.every = base
	}
	r.sig, r.due = sig, now.Add(r.every)
}

func (t *Tracer) rescanLoop() {
	defer t.wg.Done()
	periodic := wake.NewTicker(t.cfg.RescanInterval)
	defer periodic.Stop()
	clock := time.NewTicker(clockRemeasure)
	defer clock.Stop()
	pending := make(map[uint32]bool)
	state := make(map[uint32]*rescanState)
	var debounce <-chan time.Time
	for {
		select {
		case <-t.done:
			return
		case pid := <-t.rescan:
			pending[pid] = true
			if debounce == nil {
				debounce = time.After(rescanDebounce)
			}
		case <-debounce:
			debounce = nil
			for pid := range pending {
				delete(pending, pid)
				sig := t.scanProcess(pid)
				if r := state[pid]; r != nil {
					r.sig, r.every = sig, 0 // changed: the periodic scan starts over
				}
			}
		case now := <-periodic.C:
			periodic.Next()
			t.mu.Lock()
			pids := make([]uint32, 0, len(t.procs))
			for pid := range t.procs {
				pids = append(pids, pid)
			}
			t.mu.Unlock()
			for pid := range state {
				if !slices.Contains(pids, pid) {
					delete(state, pid)
				}
			}
			for _, pid := range pids {
				if _, err := os.Stat(fmt.Sprintf("%s/%d", procRoot, pid)); err != nil {
					t.dropProcess(pid)
					delete(state, pid)
					continue
				}
				r := state[pid]
				if r == nil {
					r = &rescanState{}
					state[pid] = r
				}
				if now.Before(r.due) {
					continue
				}
				r.next(t.scanProcess(pid), now, t.cfg.RescanInterval)
			}
		case <-clock.C:
			remeasureClockOffset()
		}
	}
}
