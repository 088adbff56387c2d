package tracer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/internal/hostproc"
)

// checkEnvironment turns the usual setup problems into errors that say what
// to fix, before the verifier or perf_event_open say it less clearly.
func checkEnvironment() error {
	if os.Geteuid() != 0 {
		caps, err := hostproc.EffectiveCaps()
		if err != nil {
			return fmt.Errorf("tracer needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE): %w", err)
		}
		if missing := hostproc.MissingBPFCaps(caps); len(missing) > 0 {
			return fmt.Errorf("tracer needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE): not permitted, missing %s", strings.Join(missing, ", "))
		}
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("kernel BTF missing (/sys/kernel/btf/vmlinux; needs CONFIG_DEBUG_INFO_BTF=y): %w", err)
	}
	return ensureTracefs(os.Stat)
}

// ensureTracefs mounts tracefs when neither usual mount point has it: uprobes
// and tracepoints are created through it on kernels without the PMU path.
// One that is mounted but closed to this user (mode 0700, root's: a
// non-root user holding the capabilities) is said as such, as check says
// it, not as a failed mount.
func ensureTracefs(stat func(string) (os.FileInfo, error)) error {
	var denied error
	for _, p := range []string{"/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"} {
		_, err := stat(p)
		if err == nil {
			return nil
		}
		if denied == nil && errors.Is(err, os.ErrPermission) {
			denied = fmt.Errorf("%s is mounted but not readable by this user (%w): run as root, or as UID 0 with the capabilities (tracefs is usually mode 0700)", filepath.Dir(p), err)
		}
	}
	if denied != nil {
		return denied
	}
	if err := unix.Mount("nodev", "/sys/kernel/tracing", "tracefs", 0, ""); err != nil {
		return fmt.Errorf("tracefs not mounted and mounting it on /sys/kernel/tracing failed: %w", err)
	}
	return nil
}

// disableUprobeMulti forces one perf-event uprobe per function, the path
// taken on kernels without uprobe_multi (tests exercise it here).
var disableUprobeMulti bool

// sharedMaps are declared by every object (bpf/common.h), or by those
// that use them (py_procs: bpf/python.h; faults: bpf/fault.h), and created
// once, from the first object that declares each.
var sharedMaps = []string{cudaMapTracedTgids, cudaMapThreads, cudaMapEvents, cudaMapRingDrops, cudaMapShortCalls, cudaMapUserStacks, cudaMapPyProcs,
	schedMapFaults}

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
		{"profile", loadProfile, &t.prof},
		{"marker", loadMarker, &t.marker},
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
		ring, ok := spec.Maps[cudaMapEvents]
		if !ok {
			return fmt.Errorf("%s object: map %s missing (stale generated object? run make generate)", s.name, cudaMapEvents)
		}
		ring.MaxEntries = ringSize(t.cfg.RingBufferBytes)
		for _, v := range []struct {
			name  string
			value any
		}{
			{cudaVarThresholdNs, uint64(t.cfg.SyscallThreshold.Nanoseconds())},
			{cudaVarWakeupBytes, uint64(ringSize(t.cfg.RingBufferBytes) / 4)},
			{cudaVarNullProbes, t.cfg.Probes == ProbesNull},
			{cudaVarPidnsInum, pidns},
		} {
			if err := setVariable(spec, v.name, v.value); err != nil {
				return fmt.Errorf("%s object: %w", s.name, err)
			}
		}
		if s.name == "sched" {
			if err := t.prepareFaults(spec); err != nil {
				return fmt.Errorf("%s object: %w", s.name, err)
			}
		}
		if s.name == "cuda" {
			// Launches are counted per function where marks.go reads them.
			if err := setVariable(spec, cudaVarCountLaunches, t.cfg.Probes == ProbesFull); err != nil {
				return fmt.Errorf("%s object: %w", s.name, err)
			}
		}
		for _, name := range sharedMaps {
			ms, ok := spec.Maps[name]
			if _, made := t.shared[name]; made || !ok {
				continue
			}
			m, err := ebpf.NewMap(ms)
			if err != nil {
				return fmt.Errorf("create map %s: %w", name, explainPerm(err))
			}
			t.shared[name] = m
		}
		if _, ok := t.shared[cudaMapTracedTgids]; !ok {
			return fmt.Errorf("%s object: map %s missing (stale generated object? run make generate)", s.name, cudaMapTracedTgids)
		}
		opts := t.objectOptions(spec)
		if err := spec.LoadAndAssign(s.objs, opts); err != nil {
			var verr *ebpf.VerifierError
			if errors.As(err, &verr) {
				return fmt.Errorf("load %s programs: %w\n%s", s.name, err, fmt.Sprintf("%+v", verr))
			}
			return fmt.Errorf("load %s programs: %w", s.name, explainPerm(err))
		}
	}
	if vs := t.shared[cudaMapUserStacks].ValueSize(); vs != stackDepth*8 {
		return fmt.Errorf("map %s holds %d-byte stacks, want %d (stale generated object? run make generate)", cudaMapUserStacks, vs, stackDepth*8)
	}
	t.stacks = newStackTable(t.shared[cudaMapUserStacks], stackIdle)
	// syscall number → class; numbers not listed stay untraced.
	untraced := uint32(classUntraced)
	for nr := uint32(0); nr < t.sys.SyscallClasses.MaxEntries(); nr++ {
		if err := t.sys.SyscallClasses.Put(nr, untraced); err != nil {
			return fmt.Errorf("init syscall classes: %w", err)
		}
	}
	for _, s := range tracedSyscalls {
		if err := t.sys.SyscallClasses.Put(uint32(s.nr), s.mapValue()); err != nil {
			return fmt.Errorf("set syscall class of %s: %w", s.name, err)
		}
	}
	return nil
}

// setVariable sets a constant of bpf/common.h before load. Every object
// declares the same ones; a missing one means the object and this code are
// out of step.
func setVariable(spec *ebpf.CollectionSpec, name string, value any) error {
	v, ok := spec.Variables[name]
	if !ok {
		return fmt.Errorf("variable %s missing (stale generated object? run make generate)", name)
	}
	if err := v.Set(value); err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	return nil
}

func explainPerm(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w (run as root or with CAP_BPF and CAP_PERFMON)", err)
	}
	return err
}
