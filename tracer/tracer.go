// Package tracer attaches gaptrace's BPF programs to a training process and
// its descendants and delivers a stream of event.Event.
//
// Lifecycle: New loads every BPF object (the four objects built from
// bpf/{cuda,nccl,syscalls,sched}.c share their maps: traced processes,
// per-thread state, the ring buffer, the drop and short-syscall counters) and
// attaches the tracepoints, which cost nothing until a process is traced.
// Trace adds a process: its tgid goes into traced_tgids (every program checks
// that map first), and uprobes are attached, filtered to that process, on
// the libcuda/libnccl it maps. From then on the kernel adds forked children
// to traced_tgids itself, so no child runs untraced while user space catches
// up; user space then attaches the children's uprobes. Libraries mapped later
// (dlopen) are noticed through executable-mapping events and a periodic
// /proc/PID/maps rescan. Run reads the ring buffer, decodes, resolves fds and
// converts clocks. Close detaches everything in reverse order; nothing is
// pinned, so a killed tracer leaves no probe behind either (every uprobe and
// link lives as long as the process's file descriptors).
//
// Invariants: no cilium/ebpf type leaves this package; all times leaving it
// are Unix ns (MonotonicToUnix is the one conversion); a record is only cast
// after its size matched its type.
package tracer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// ProbeInfo describes one attached probe.
type ProbeInfo struct {
	Library string // library path for uprobes, "syscalls"/"sched" for tracepoints
	Symbol  string // function or tracepoint name
	Kind    string // "uprobe", "uretprobe", "tracepoint" or "tp_btf"
	PID     int    // process the uprobe is filtered to; 0 for tracepoints
}

// Stats is a snapshot of what the tracer attached and saw.
type Stats struct {
	Attached      []ProbeInfo
	Missing       []string // warnings: library or symbol not found, tracepoint absent
	RingDrops     uint64   // records lost because the ring buffer was full
	EventsRead    uint64   // records read from the ring buffer
	DecodeErrors  uint64   // records that did not decode (never expected)
	ShortSyscalls map[event.SyscallClass]uint64
	Processes     int // processes currently traced
}

// recordReader is the ring buffer as Run sees it; tests feed recorded
// records through a fake. Read returns a record valid until the next Read
// and an error wrapping os.ErrClosed once closed.
type recordReader interface {
	Read() ([]byte, error)
	Close() error
}

type ringReader struct {
	rd  *ringbuf.Reader
	rec ringbuf.Record
}

// ringPoll bounds how long a record waits in the ring buffer: the programs
// wake the reader only when a quarter of the ring is pending (see
// wakeup_bytes in bpf/common.h), so the reader looks on its own this often.
const ringPoll = 5 * time.Millisecond

func (r *ringReader) Read() ([]byte, error) {
	for {
		r.rd.SetDeadline(time.Now().Add(ringPoll))
		err := r.rd.ReadInto(&r.rec)
		if err == nil {
			return r.rec.RawSample, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
	}
}

func (r *ringReader) Close() error { return r.rd.Close() }

// Tracer traces processes. Create it with New; it is safe for concurrent use.
type Tracer struct {
	cfg Config
	log *slog.Logger

	shared map[string]*ebpf.Map
	cuda   cudaObjects
	nccl   ncclObjects
	sys    syscallsObjects
	sched  schedObjects
	tps    []link.Link // tracepoints, in attach order
	reader recordReader

	fds   *fdResolver
	comms *taskComms
	// multi: uprobes are attached as one uprobe_multi link per program and
	// process instead of one perf-event link per function. Decided once at
	// load; it matters because every single uprobe costs an RCU grace
	// period to detach (~0.3s each measured here), multi links one each.
	multi bool
	// pidns is the inode of the PID namespace whose pids /proc shows; the
	// BPF programs number every process in it (see bpf/common.h).
	pidns uint32

	scanMu      sync.Mutex // serializes scanProcess
	mu          sync.Mutex
	procs       map[uint32]*procState
	tpInfo      []ProbeInfo
	missing     []string
	missingSeen map[string]bool
	roots       map[uint32]bool   // pids passed to Trace
	unmapped    map[uint32]string // root pid → warning while it maps no libcuda
	closed      bool

	eventsRead   atomic.Uint64
	decodeErrors atomic.Uint64

	rescan    chan uint32
	done      chan struct{}
	wg        sync.WaitGroup
	detaching sync.WaitGroup // uprobes of exited processes being closed
	closeOnce sync.Once
	closeErr  error
}

type procState struct {
	libs map[string]*libAttach // by library path as mapped by the process
}

type libAttach struct {
	lib   library
	path  string
	links []link.Link
	info  []ProbeInfo
}

const procRoot = "/proc"

// disableUprobeMulti forces one perf-event uprobe per function, the path
// taken on kernels without uprobe_multi (tests exercise it here).
var disableUprobeMulti bool

// New loads the BPF objects and attaches the tracepoints. It fails with a
// clear error when not privileged, when the kernel has no BTF or when tracefs
// is unavailable.
func New(cfg Config) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tracer config: %w", err)
	}
	cfg = cfg.withDefaults()
	if err := checkEnvironment(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit (needs root or CAP_SYS_RESOURCE): %w", err)
	}
	t := &Tracer{
		cfg:         cfg,
		log:         cfg.Logger,
		fds:         newFDResolver(procRoot),
		comms:       &taskComms{procRoot: procRoot},
		procs:       make(map[uint32]*procState),
		missingSeen: make(map[string]bool),
		roots:       make(map[uint32]bool),
		unmapped:    make(map[uint32]string),
		rescan:      make(chan uint32, 1024),
		done:        make(chan struct{}),
	}
	if err := t.load(); err != nil {
		t.closeObjects()
		return nil, err
	}
	if err := t.attachTracepoints(); err != nil {
		_ = closeLinksParallel(t.tps)
		t.closeObjects()
		return nil, err
	}
	rd, err := ringbuf.NewReader(t.shared["events"])
	if err != nil {
		_ = closeLinksParallel(t.tps)
		t.closeObjects()
		return nil, fmt.Errorf("open ring buffer reader: %w", err)
	}
	t.reader = &ringReader{rd: rd}
	t.wg.Add(1)
	go t.rescanLoop()
	uprobeMode := "uprobe_multi links"
	if !t.multi {
		uprobeMode = "one perf-event uprobe per function (no uprobe_multi)"
	}
	t.log.Info("tracer loaded", "probes", string(cfg.Probes), "syscall_threshold", cfg.SyscallThreshold,
		"ring_buffer_bytes", ringSize(cfg.RingBufferBytes), "tracepoints", len(t.tpInfo), "uprobes", uprobeMode,
		"pid_namespace", pidnsName(t.pidns))
	return t, nil
}

// checkEnvironment turns the usual setup problems into errors that say what
// to fix, before the verifier or perf_event_open say it less clearly.
func checkEnvironment() error {
	if os.Geteuid() != 0 && !hasTracingCaps() {
		return errors.New("tracer needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE): not permitted")
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("kernel BTF missing (/sys/kernel/btf/vmlinux; needs CONFIG_DEBUG_INFO_BTF=y): %w", err)
	}
	return ensureTracefs()
}

// hasTracingCaps reports whether the effective capabilities allow loading
// and attaching tracing programs without root.
func hasTracingCaps() bool {
	const capSysAdmin, capPerfmon, capBPF = 21, 38, 39
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData // version 3 fills two words
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	return has(capSysAdmin) || (has(capBPF) && has(capPerfmon))
}

// ensureTracefs mounts tracefs when neither usual mount point has it: uprobes
// and tracepoints are created through it on kernels without the PMU path.
func ensureTracefs() error {
	for _, p := range []string{"/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	if err := unix.Mount("nodev", "/sys/kernel/tracing", "tracefs", 0, ""); err != nil {
		return fmt.Errorf("tracefs not mounted and mounting it on /sys/kernel/tracing failed: %w", err)
	}
	return nil
}

var sharedMaps = []string{"traced_tgids", "threads", "events", "ring_drops", "short_calls"}

func (t *Tracer) load() error {
	specs := []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
		objs any
	}{
		{"cuda", loadCuda, &t.cuda},
		{"nccl", loadNccl, &t.nccl},
		{"syscalls", loadSyscalls, &t.sys},
		{"sched", loadSched, &t.sched},
	}
	pidns, err := pidNamespace(procRoot)
	if err != nil {
		return err
	}
	t.pidns = pidns
	t.shared = make(map[string]*ebpf.Map)
	t.multi = !disableUprobeMulti && features.HaveBPFLinkUprobeMulti() == nil
	for _, s := range specs {
		spec, err := s.load()
		if err != nil {
			return fmt.Errorf("load %s object spec: %w", s.name, err)
		}
		if t.multi {
			for _, p := range spec.Programs {
				if p.Type == ebpf.Kprobe && strings.HasPrefix(p.SectionName, "uprobe") || strings.HasPrefix(p.SectionName, "uretprobe") {
					p.AttachType = ebpf.AttachTraceUprobeMulti
				}
			}
		}
		spec.Maps["events"].MaxEntries = ringSize(t.cfg.RingBufferBytes)
		v, ok := spec.Variables["threshold_ns"]
		if !ok {
			return fmt.Errorf("%s object: variable threshold_ns missing", s.name)
		}
		if err := v.Set(uint64(t.cfg.SyscallThreshold.Nanoseconds())); err != nil {
			return fmt.Errorf("%s object: set threshold_ns: %w", s.name, err)
		}
		if err := spec.Variables["wakeup_bytes"].Set(uint64(ringSize(t.cfg.RingBufferBytes) / 4)); err != nil {
			return fmt.Errorf("%s object: set wakeup_bytes: %w", s.name, err)
		}
		if err := spec.Variables["null_probes"].Set(t.cfg.Probes == ProbesNull); err != nil {
			return fmt.Errorf("%s object: set null_probes: %w", s.name, err)
		}
		if err := spec.Variables["pidns_inum"].Set(pidns); err != nil {
			return fmt.Errorf("%s object: set pidns_inum: %w", s.name, err)
		}
		if len(t.shared) == 0 {
			for _, name := range sharedMaps {
				m, err := ebpf.NewMap(spec.Maps[name])
				if err != nil {
					return fmt.Errorf("create map %s: %w", name, explainPerm(err))
				}
				t.shared[name] = m
			}
		}
		opts := &ebpf.CollectionOptions{MapReplacements: t.shared}
		if err := spec.LoadAndAssign(s.objs, opts); err != nil {
			var verr *ebpf.VerifierError
			if errors.As(err, &verr) {
				return fmt.Errorf("load %s programs: %w\n%+v", s.name, err, verr)
			}
			return fmt.Errorf("load %s programs: %w", s.name, explainPerm(err))
		}
	}
	// syscall number → class; numbers not listed stay untraced.
	untraced := uint32(classUntraced)
	for nr := uint32(0); nr < t.sys.SyscallClasses.MaxEntries(); nr++ {
		if err := t.sys.SyscallClasses.Put(nr, untraced); err != nil {
			return fmt.Errorf("init syscall classes: %w", err)
		}
	}
	for _, s := range tracedSyscalls {
		if err := t.sys.SyscallClasses.Put(uint32(s.nr), s.class); err != nil {
			return fmt.Errorf("set syscall class of %s: %w", s.name, err)
		}
	}
	return nil
}

func explainPerm(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w (run as root or with CAP_BPF and CAP_PERFMON)", err)
	}
	return err
}

func (t *Tracer) attachTracepoints() error {
	for _, s := range tracedSyscalls {
		for _, dir := range []struct {
			prefix string
			prog   *ebpf.Program
		}{{"sys_enter_", t.sys.SysEnter}, {"sys_exit_", t.sys.SysExit}} {
			name := dir.prefix + s.name
			l, err := link.Tracepoint("syscalls", name, dir.prog, nil)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					t.warnMissing("tracepoint syscalls/"+name, err)
					continue
				}
				return fmt.Errorf("attach tracepoint syscalls/%s: %w", name, err)
			}
			t.tps = append(t.tps, l)
			t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "syscalls", Symbol: name, Kind: "tracepoint"})
		}
	}
	for _, p := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"sched_switch", t.sched.OnSchedSwitch},
		{"sched_waking", t.sched.OnSchedWaking},
		{"sched_wakeup_new", t.sched.OnSchedWakeupNew},
		{"sched_process_fork", t.sched.OnSchedProcessFork},
		{"sched_process_exec", t.sched.OnSchedProcessExec},
		{"sched_process_exit", t.sched.OnSchedProcessExit},
	} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p.prog})
		if err != nil {
			return fmt.Errorf("attach tp_btf/%s: %w", p.name, err)
		}
		t.tps = append(t.tps, l)
		t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "sched", Symbol: p.name, Kind: "tp_btf"})
	}
	return nil
}

// noteMissing records what in Stats.Missing; false when already known.
func (t *Tracer) noteMissing(what string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.missingSeen[what] {
		return false
	}
	t.missingSeen[what] = true
	t.missing = append(t.missing, what)
	return true
}

func (t *Tracer) warnMissing(what string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.missingSeen[what] {
		return
	}
	t.missingSeen[what] = true
	t.missing = append(t.missing, what)
	if err != nil {
		t.log.Warn("probe target not found, tracing continues without it", "target", what, "error", err)
	} else {
		t.log.Warn("probe target not found, tracing continues without it", "target", what)
	}
}

// Trace starts tracing pid, its existing descendants and, from now on, every
// process they fork. Uprobes are attached to the CUDA/NCCL libraries each
// process maps, now and whenever it maps them later.
func (t *Tracer) Trace(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("trace pid %d: invalid pid", pid)
	}
	tgid, err := threadGroup(pid)
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
	pids := append([]uint32{uint32(pid)}, descendants(uint32(pid))...)
	for _, p := range pids {
		if err := t.addProcess(p, false); err != nil {
			return fmt.Errorf("trace pid %d: %w", p, err)
		}
	}
	for _, p := range pids {
		t.scanProcess(p)
	}
	return nil
}

// addProcess tracks pid in user space and, unless the kernel already did
// (forked children are added by the fork program), in traced_tgids.
func (t *Tracer) addProcess(pid uint32, inKernel bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("tracer closed")
	}
	if !inKernel {
		if err := t.shared["traced_tgids"].Put(pid, uint32(1)); err != nil {
			return fmt.Errorf("add to traced_tgids: %w", err)
		}
	}
	if _, ok := t.procs[pid]; !ok {
		t.procs[pid] = &procState{libs: make(map[string]*libAttach)}
	}
	return nil
}

// threadGroup returns the process (thread group) id of pid, which may name
// any thread: traced_tgids holds thread group ids.
func threadGroup(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no Tgid in /proc/%d/status", pid)
}

// descendants lists the living descendants of pid (all threads' children).
func descendants(pid uint32) []uint32 {
	var out []uint32
	queue := []uint32{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := os.ReadDir(fmt.Sprintf("%s/%d/task", procRoot, p))
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("%s/%d/task/%s/children", procRoot, p, task.Name()))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.ParseUint(f, 10, 32); err == nil {
					out = append(out, uint32(c))
					queue = append(queue, uint32(c))
				}
			}
		}
	}
	return out
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
func (t *Tracer) scanProcess(pid uint32) {
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
		return
	}
	libs := make(map[string]library)
	if t.cfg.LibCUDA != "" {
		libs[t.cfg.LibCUDA] = libCUDA
	}
	if t.cfg.LibNCCL != "" {
		libs[t.cfg.LibNCCL] = libNCCL
	}
	if proc, err := procfs.NewProc(int(pid)); err == nil {
		maps, err := proc.ProcMaps()
		if err != nil {
			t.log.Debug("read maps", "pid", pid, "error", err)
		}
		for _, m := range maps {
			if m.Pathname == "" || !strings.HasPrefix(m.Pathname, "/") {
				continue
			}
			if lib, ok := t.libraryOf(m.Pathname); ok {
				libs[m.Pathname] = lib
			}
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
			closeLinks(la.links)
			return
		}
		ps.libs[p] = la
		t.mu.Unlock()
	}
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
		t.log.Warn("CUDA driver library not mapped by the traced process (yet)", "pid", pid)
	}
}

// attachLibrary attaches the probe table to one library for one process.
// Failures are warnings: tracing goes on with what attached.
func (t *Tracer) attachLibrary(pid uint32, path string, lib library) *libAttach {
	la := &libAttach{lib: lib, path: path}
	// The process may live in another mount namespace: reach its file
	// through its root.
	file := filepath.Join(procRoot, strconv.Itoa(int(pid)), "root", path)
	if _, err := os.Stat(file); err != nil {
		file = path
	}
	planned, missing, err := planProbes(file, lib, t.cfg.Probes)
	if err != nil {
		t.warnMissing(fmt.Sprintf("%s %s", lib, path), err)
		return la
	}
	// Optional entry points come and go between driver versions: one
	// line per library, not one warning per symbol.
	var fresh []string
	for _, m := range missing {
		if t.noteMissing(fmt.Sprintf("%s %s: symbol %s", lib, path, m)) {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) > 0 {
		t.log.Info("symbols absent from the library, not probed", "library", path, "count", len(fresh), "symbols", strings.Join(fresh, ","))
	}
	ex, err := link.OpenExecutable(file)
	if err != nil {
		t.warnMissing(fmt.Sprintf("%s %s", lib, path), err)
		return la
	}
	if t.multi {
		t.attachMulti(la, ex, pid, path, lib, planned)
		t.log.Info("uprobes attached", "library", path, "pid", pid, "probes", len(la.info), "links", len(la.links), "missing", len(missing))
		return la
	}
	for _, pp := range planned {
		opts := &link.UprobeOptions{PID: int(pid), Cookie: pp.spec.cookie}
		if pp.spec.entry != "" {
			l, err := ex.Uprobe(pp.symbol, t.program(pp.spec.entry), opts)
			if err != nil {
				t.log.Warn("attach uprobe", "symbol", pp.symbol, "library", path, "pid", pid, "error", err)
				t.warnMissing(fmt.Sprintf("%s %s: uprobe %s: %v", lib, path, pp.symbol, err), nil)
				continue
			}
			la.links = append(la.links, l)
			la.info = append(la.info, ProbeInfo{Library: path, Symbol: pp.symbol, Kind: "uprobe", PID: int(pid)})
		}
		if pp.spec.ret != "" {
			l, err := ex.Uretprobe(pp.symbol, t.program(pp.spec.ret), opts)
			if err != nil {
				t.log.Warn("attach uretprobe", "symbol", pp.symbol, "library", path, "pid", pid, "error", err)
				t.warnMissing(fmt.Sprintf("%s %s: uretprobe %s: %v", lib, path, pp.symbol, err), nil)
				continue
			}
			la.links = append(la.links, l)
			la.info = append(la.info, ProbeInfo{Library: path, Symbol: pp.symbol, Kind: "uretprobe", PID: int(pid)})
		}
	}
	t.log.Info("uprobes attached", "library", path, "pid", pid, "probes", len(la.links), "missing", len(missing))
	return la
}

// attachMulti attaches every planned probe of one library for one process
// with one uprobe_multi link per program (the cookie array carries what
// single uprobes carry in their own cookie).
func (t *Tracer) attachMulti(la *libAttach, ex *link.Executable, pid uint32, path string, lib library, planned []plannedProbe) {
	type group struct {
		prog    string
		ret     bool
		symbols []string
		cookies []uint64
	}
	var order []string
	groups := make(map[string]*group)
	add := func(prog string, ret bool, pp plannedProbe) {
		g, ok := groups[prog]
		if !ok {
			g = &group{prog: prog, ret: ret}
			groups[prog] = g
			order = append(order, prog)
		}
		g.symbols = append(g.symbols, pp.symbol)
		g.cookies = append(g.cookies, pp.spec.cookie)
	}
	for _, pp := range planned {
		if pp.spec.entry != "" {
			add(pp.spec.entry, false, pp)
		}
		if pp.spec.ret != "" {
			add(pp.spec.ret, true, pp)
		}
	}
	for _, name := range order {
		g := groups[name]
		opts := &link.UprobeMultiOptions{PID: pid, Cookies: g.cookies}
		kind, attach := "uprobe", ex.UprobeMulti
		if g.ret {
			kind, attach = "uretprobe", ex.UretprobeMulti
		}
		l, err := attach(g.symbols, t.program(name), opts)
		if err != nil {
			t.log.Warn("attach "+kind+"s", "symbols", g.symbols, "library", path, "pid", pid, "error", err)
			t.warnMissing(fmt.Sprintf("%s %s: %s %s: %v", lib, path, kind, strings.Join(g.symbols, ","), err), nil)
			continue
		}
		la.links = append(la.links, l)
		for _, sym := range g.symbols {
			la.info = append(la.info, ProbeInfo{Library: path, Symbol: sym, Kind: kind, PID: int(pid)})
		}
	}
}

func (t *Tracer) program(name string) *ebpf.Program {
	switch name {
	case "cuda_launch":
		return t.cuda.CudaLaunch
	case "cuda_async":
		return t.cuda.CudaAsync
	case "cuda_block_enter":
		return t.cuda.CudaBlockEnter
	case "cuda_block_exit":
		return t.cuda.CudaBlockExit
	case "nccl_coll":
		return t.nccl.NcclColl
	case "nccl_group_start":
		return t.nccl.NcclGroupStart
	case "nccl_group_end_enter":
		return t.nccl.NcclGroupEndEnter
	case "nccl_group_end_exit":
		return t.nccl.NcclGroupEndExit
	case "nccl_comm_init_enter":
		return t.nccl.NcclCommInitEnter
	case "nccl_comm_init_exit":
		return t.nccl.NcclCommInitExit
	}
	panic("tracer: unknown program " + name)
}

// closeLinksParallel closes independent uprobe links concurrently: each
// close waits for an RCU grace period, and concurrent waiters share one.
func closeLinksParallel(ls []link.Link) error {
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Close()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func closeLinks(ls []link.Link) error {
	var errs []error
	for i := len(ls) - 1; i >= 0; i-- {
		if err := ls[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
		t.detaching.Add(1)
		go func() {
			defer t.detaching.Done()
			var ls []link.Link
			for _, la := range ps.libs {
				ls = append(ls, la.links...)
			}
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

// rescanDebounce batches mmap bursts (a dlopen maps several segments).
const rescanDebounce = 10 * time.Millisecond

// clockRemeasure bounds the drift between CLOCK_MONOTONIC and
// CLOCK_REALTIME (NTP slews realtime) that conversions can accumulate.
const clockRemeasure = 10 * time.Second

func (t *Tracer) rescanLoop() {
	defer t.wg.Done()
	periodic := time.NewTicker(t.cfg.RescanInterval)
	defer periodic.Stop()
	clock := time.NewTicker(clockRemeasure)
	defer clock.Stop()
	pending := make(map[uint32]bool)
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
				t.scanProcess(pid)
			}
		case <-periodic.C:
			t.mu.Lock()
			pids := make([]uint32, 0, len(t.procs))
			for pid := range t.procs {
				pids = append(pids, pid)
			}
			t.mu.Unlock()
			for _, pid := range pids {
				if _, err := os.Stat(fmt.Sprintf("%s/%d", procRoot, pid)); err != nil {
					t.dropProcess(pid)
					continue
				}
				t.scanProcess(pid)
			}
		case <-clock.C:
			remeasureClockOffset()
		}
	}
}

// Run reads and decodes events into out until ctx is done or the tracer is
// closed. It blocks while out is full (the consumer is expected to keep up;
// the ring buffer absorbs bursts, and what it cannot hold is counted in
// Stats.RingDrops). It returns nil on a clean shutdown.
func (t *Tracer) Run(ctx context.Context, out chan<- event.Event) error {
	stop := context.AfterFunc(ctx, func() { _ = t.reader.Close() })
	defer stop()
	return t.consume(ctx, t.reader, out)
}

func (t *Tracer) consume(ctx context.Context, rd recordReader, out chan<- event.Event) error {
	var d decoded
	for {
		rec, err := rd.Read()
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read ring buffer: %w", err)
		}
		t.eventsRead.Add(1)
		if err := decodeRecord(rec, &d); err != nil {
			if t.decodeErrors.Add(1) <= 10 {
				t.log.Warn("undecodable record", "error", err)
			}
			continue
		}
		t.handle(&d)
		if !d.emit {
			continue
		}
		select {
		case out <- d.ev:
		case <-ctx.Done():
			return nil
		case <-t.done: // Close while the consumer is not reading
			return nil
		}
	}
}

// handle applies a decoded record to the tracer's own state and fills in
// what only user space knows (fd targets, thread names).
func (t *Tracer) handle(d *decoded) {
	ev := &d.ev
	switch d.ctl {
	case ctlRescan:
		t.requestRescan(ev.PID)
	case ctlNewProcess:
		if err := t.addProcess(ev.ChildPID, true); err == nil {
			t.requestRescan(ev.ChildPID)
		}
	case ctlExec:
		// Uprobes stay: they are bound to the task and the library inode,
		// so they hold across exec for a library the new image maps again.
		// Libraries it maps for the first time are picked up by the rescan.
		t.fds.forgetProcess(ev.PID)
		t.comms.set(ev.TID, ev.TaskComm)
		t.requestRescan(ev.PID)
	case ctlProcessGone:
		t.dropProcess(ev.PID)
	case ctlFDChanged:
		if ev.Kind == event.KindClose {
			if info, ok := t.fds.cached(ev.PID, ev.FD); ok {
				applyFD(ev, info)
			}
			t.fds.invalidate(ev.PID, ev.FD)
		} else if ev.Ret >= 0 {
			// Remember what was opened right away: the fd may be read and
			// closed before a lazy /proc lookup could see it.
			t.fds.opened(ev.PID, ev.FD, ev.Path)
			ev.FDKind = event.FDFile
		}
	}
	if ev.Kind == event.KindSyscall && ev.Syscall == event.SysOpen && ev.Ret >= 0 {
		// A slow open: say what was opened (its fd record came first).
		ev.FD = int32(ev.Ret)
	}
	if ev.Kind == event.KindSyscall && ev.FD >= 0 {
		if ev.Name == "connect" {
			t.fds.invalidate(ev.PID, ev.FD) // the peer changed
		}
		applyFD(ev, t.fds.resolve(ev.PID, ev.FD))
	}
	if ev.TaskComm == "" {
		ev.TaskComm = t.comms.get(ev.PID, ev.TID)
	}
	if ev.Kind == event.KindExit {
		t.comms.forget(ev.TID)
	}
}

func applyFD(ev *event.Event, info fdInfo) {
	ev.FDKind = info.kind
	ev.Path = info.path
	ev.PeerAddr = info.peerAddr
	ev.PeerPID = info.peerPID
}

// Stats returns a snapshot of attachments and counters.
func (t *Tracer) Stats() Stats {
	t.mu.Lock()
	s := Stats{
		Attached:  append([]ProbeInfo(nil), t.tpInfo...),
		Missing:   append([]string(nil), t.missing...),
		Processes: len(t.procs),
	}
	for _, msg := range t.unmapped {
		s.Missing = append(s.Missing, msg)
	}
	for _, ps := range t.procs {
		for _, la := range ps.libs {
			s.Attached = append(s.Attached, la.info...)
		}
	}
	closed := t.closed
	t.mu.Unlock()
	s.EventsRead = t.eventsRead.Load()
	s.DecodeErrors = t.decodeErrors.Load()
	s.ShortSyscalls = make(map[event.SyscallClass]uint64)
	if closed {
		return s
	}
	if m := t.shared["ring_drops"]; m != nil {
		var perCPU []uint64
		if err := m.Lookup(uint32(0), &perCPU); err == nil {
			for _, v := range perCPU {
				s.RingDrops += v
			}
		}
	}
	if m := t.shared["short_calls"]; m != nil {
		var k cudaShortKey
		var n uint64
		it := m.Iterate()
		for it.Next(&k, &n) {
			s.ShortSyscalls[event.SyscallClass(k.Class)] += n
		}
	}
	return s
}

// Close detaches every probe in reverse order of attachment and releases
// every BPF object. It is safe to call more than once.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		procs := t.procs
		t.procs = make(map[uint32]*procState)
		t.mu.Unlock()
		close(t.done)
		t.wg.Wait()
		t.detaching.Wait()

		// Uprobes first (all at once: they are independent of each other),
		// then the tracepoints in reverse order of attachment, then the
		// reader, programs and maps.
		var errs []error
		var uprobes []link.Link
		for _, ps := range procs {
			for _, la := range ps.libs {
				uprobes = append(uprobes, la.links...)
			}
		}
		start := time.Now()
		if err := closeLinksParallel(uprobes); err != nil {
			errs = append(errs, err)
		}
		t.log.Debug("uprobes detached", "links", len(uprobes), "took", time.Since(start))
		start = time.Now()
		// Each tracepoint detach also waits for a grace period: in parallel
		// too (they are independent; the order among them does not matter).
		if err := closeLinksParallel(t.tps); err != nil {
			errs = append(errs, err)
		}
		if t.reader != nil {
			if err := t.reader.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, err)
			}
		}
		t.log.Debug("tracepoints detached", "links", len(t.tps), "took", time.Since(start))
		errs = append(errs, t.closeObjects())
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

func (t *Tracer) closeObjects() error {
	errs := []error{t.sched.Close(), t.sys.Close(), t.nccl.Close(), t.cuda.Close()}
	for _, name := range sharedMaps {
		if m := t.shared[name]; m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
