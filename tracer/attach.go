package tracer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

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
		// Which fault an off-CPU block was in, and faults that read
		// mapped files (bpf/sched.c, bpf/fault.h).
		{"page_fault_user", t.sched.OnPageFaultUser},
	} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p.prog})
		if err != nil {
			return fmt.Errorf("attach tp_btf/%s: %w", p.name, err)
		}
		t.tps = append(t.tps, l)
		t.tpInfo = append(t.tpInfo, ProbeInfo{Library: "sched", Symbol: p.name, Kind: "tp_btf"})
	}
	return t.attachFilemap()
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

// attachLibrary attaches the probe table to one library for one process.
// Failures are warnings: tracing goes on with what attached.
func (t *Tracer) attachLibrary(pid uint32, path string, lib library) *libAttach {
	la := &libAttach{lib: lib, path: path}
	start := time.Now()
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
	if t.cfg.Probes == ProbesAuto && lib == libCUDA {
		// The per-launch probes first, where a window wants them now:
		// attached after the copies' and syncs', the copies enqueued
		// meanwhile would come inside the window (LaunchToggle.At)
		// with no launch seen between them, and the step clock would
		// take them for steps that launch nothing.
		la.file = file
		t.mu.Lock()
		on := t.launchOn
		t.mu.Unlock()
		if on {
			t.attachLaunch(la, pid)
		}
	}
	la.links, la.info = t.attachPlanned(ex, pid, path, lib, planned)
	t.log.Info("uprobes attached", "library", path, "pid", pid, "probes", len(la.info), "links", len(la.links), "missing", len(missing), "took", time.Since(start).Round(time.Millisecond))
	return la
}

// attachPlanned attaches planned probes of one library for one process.
func (t *Tracer) attachPlanned(ex *link.Executable, pid uint32, path string, lib library, planned []plannedProbe) (links []link.Link, info []ProbeInfo) {
	if t.multi {
		return t.attachMulti(ex, pid, path, lib, planned)
	}
	for _, pp := range planned {
		opts := &link.UprobeOptions{PID: int(pid), Cookie: pp.spec.cookie, Address: pp.off}
		if pp.spec.entry != nil {
			l, err := ex.Uprobe(pp.symbol, pp.spec.entry(t), opts)
			if err != nil {
				t.log.Warn("attach uprobe", "symbol", pp.symbol, "library", path, "pid", pid, "error", err)
				t.warnMissing(fmt.Sprintf("%s %s: uprobe %s: %v", lib, path, pp.symbol, err), nil)
				continue
			}
			links = append(links, l)
			info = append(info, ProbeInfo{Library: path, Symbol: pp.symbol, Kind: "uprobe", PID: int(pid)})
		}
		if pp.spec.ret != nil {
			l, err := ex.Uretprobe(pp.symbol, pp.spec.ret(t), opts)
			if err != nil {
				t.log.Warn("attach uretprobe", "symbol", pp.symbol, "library", path, "pid", pid, "error", err)
				t.warnMissing(fmt.Sprintf("%s %s: uretprobe %s: %v", lib, path, pp.symbol, err), nil)
				continue
			}
			links = append(links, l)
			info = append(info, ProbeInfo{Library: path, Symbol: pp.symbol, Kind: "uretprobe", PID: int(pid)})
		}
	}
	return links, info
}

// attachMulti attaches every planned probe of one library for one process
// with one uprobe_multi link per program (the cookie array carries what
// single uprobes carry in their own cookie).
func (t *Tracer) attachMulti(ex *link.Executable, pid uint32, path string, lib library, planned []plannedProbe) (links []link.Link, info []ProbeInfo) {
	type group struct {
		prog    *ebpf.Program
		ret     bool
		symbols []string
		cookies []uint64
		offs    []uint64 // every probe's file offset, or nil: by symbol
	}
	var order []*group
	groups := make(map[*ebpf.Program]*group)
	add := func(prog *ebpf.Program, ret bool, pp plannedProbe) {
		g, ok := groups[prog]
		if !ok {
			g = &group{prog: prog, ret: ret}
			groups[prog] = g
			order = append(order, g)
		}
		if pp.off != 0 && len(g.offs) == len(g.symbols) {
			g.offs = append(g.offs, pp.off)
		} else {
			g.offs = nil
		}
		g.symbols = append(g.symbols, pp.symbol)
		g.cookies = append(g.cookies, pp.spec.cookie)
	}
	for _, pp := range planned {
		if pp.spec.entry != nil {
			add(pp.spec.entry(t), false, pp)
		}
		if pp.spec.ret != nil {
			add(pp.spec.ret(t), true, pp)
		}
	}
	for _, g := range order {
		opts := &link.UprobeMultiOptions{PID: pid, Cookies: g.cookies}
		kind, attach := "uprobe", ex.UprobeMulti
		if g.ret {
			kind, attach = "uretprobe", ex.UretprobeMulti
		}
		syms := g.symbols
		if len(g.offs) == len(g.symbols) {
			// Offsets the plan resolved: the attach reads no symbols.
			syms, opts.Addresses = nil, g.offs
		}
		l, err := attach(syms, g.prog, opts)
		if err != nil {
			t.log.Warn("attach "+kind+"s", "symbols", g.symbols, "library", path, "pid", pid, "error", err)
			t.warnMissing(fmt.Sprintf("%s %s: %s %s: %v", lib, path, kind, strings.Join(g.symbols, ","), err), nil)
			continue
		}
		links = append(links, l)
		for _, sym := range g.symbols {
			info = append(info, ProbeInfo{Library: path, Symbol: sym, Kind: kind, PID: int(pid)})
		}
	}
	return links, info
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
