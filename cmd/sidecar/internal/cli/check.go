package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
)

// Level is the verdict of one check.
type Level string

const (
	OK   Level = "OK"
	Warn Level = "WARN"
	Fail Level = "FAIL"
)

// Finding is one line of `gaptrace check`.
type Finding struct {
	Level  Level
	Name   string
	Detail string
	Fix    string
}

// GPUDevice is one device NVML reports.
type GPUDevice struct {
	Index int
	Name  string
	UUID  string
}

// GPUReport is what the GPU inspector found. Err set means NVML could not
// be used; Fix says what to do about it.
type GPUReport struct {
	Lib      string
	Devices  []GPUDevice
	Findings []Finding
	Err      error
	Fix      string
}

// GPUInspector opens NVML (from libPath when set), lists the devices and
// their health findings, and closes it again.
type GPUInspector func(ctx context.Context, libPath string) GPUReport

// Host is where check looks; tests point it at a fake tree.
type Host struct {
	Root    string // prefix for /sys and /proc paths ("" = the real ones)
	Release string // kernel release; "" = uname
	Caps    func() (proc.Caps, error)
	// Features probes BPF program and map types; nil skips them.
	Features func() []Finding
	// MountTracefs tries to mount tracefs at the given path;
	// UnmountTracefs undoes it, so check leaves the system as found.
	MountTracefs   func(path string) error
	UnmountTracefs func(path string) error
	// Stat replaces os.Stat (tests: a permission error as root).
	Stat func(path string) (os.FileInfo, error)
}

func (h Host) path(p string) string { return h.Root + p }

func (h Host) stat(p string) error {
	st := os.Stat
	if h.Stat != nil {
		st = h.Stat
	}
	_, err := st(h.path(p))
	return err
}

func (h Host) exists(p string) bool { return h.stat(p) == nil }

// RealHost is the machine gaptrace runs on.
func RealHost() Host {
	return Host{
		Caps:     proc.EffectiveCaps,
		Features: bpfFeatures,
		MountTracefs: func(p string) error {
			return unix.Mount("tracefs", p, "tracefs", 0, "")
		},
		UnmountTracefs: func(p string) error { return unix.Unmount(p, 0) },
	}
}

func checkCmd(ctx context.Context, args []string, deps Deps) int {
	cfg, code, ok := load(config.CmdCheck, args, deps)
	if !ok {
		return code
	}
	findings := RunChecks(ctx, RealHost(), &cfg, deps.GPU)
	PrintFindings(deps.Stdout, findings)
	if Verdict(findings) {
		fmt.Fprintln(deps.Stdout, "\ntracing can work here")
		return ExitOK
	}
	fmt.Fprintln(deps.Stdout, "\ntracing cannot work here until the FAIL lines are fixed")
	return ExitFailure
}

// Verdict reports whether tracing can work: no FAIL.
func Verdict(fs []Finding) bool {
	for _, f := range fs {
		if f.Level == Fail {
			return false
		}
	}
	return true
}

// PrintFindings writes one line per finding: level, name, detail, fix.
func PrintFindings(w io.Writer, fs []Finding) {
	for _, f := range fs {
		// Details quote the target's command line and library paths.
		line := fmt.Sprintf("%-4s  %-20s %s", f.Level, f.Name, live.Escape(f.Detail))
		if f.Fix != "" && f.Level != OK {
			line += " — fix: " + f.Fix
		}
		fmt.Fprintln(w, line)
	}
}

// parseRelease returns major and minor of a kernel release string.
func parseRelease(rel string) (int, int, bool) {
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorStr := parts[1]
	if i := strings.IndexFunc(minorStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = minorStr[:i]
	}
	minor, err2 := strconv.Atoi(minorStr)
	return major, minor, err1 == nil && err2 == nil
}

// RunChecks runs every readiness check in a fixed order.
func RunChecks(ctx context.Context, h Host, cfg *config.Config, gpu GPUInspector) (fs []Finding) {
	add := func(l Level, name, detail, fix string) {
		fs = append(fs, Finding{Level: l, Name: name, Detail: detail, Fix: fix})
	}

	rel, kfs := kernelChecks(h)
	fs = append(fs, kfs...)

	if h.exists("/sys/kernel/btf/vmlinux") {
		add(OK, "BTF", "/sys/kernel/btf/vmlinux present", "")
	} else {
		add(Fail, "BTF", "/sys/kernel/btf/vmlinux missing: probes cannot be relocated for this kernel", "use a kernel built with CONFIG_DEBUG_INFO_BTF=y")
	}

	fs = append(fs, privilegeChecks(h, rel)...)

	tracefs := "/sys/kernel/tracing"
	mountedHere := false
	var denied error
	if err := h.stat(tracefs + "/events"); err != nil {
		switch {
		case h.exists("/sys/kernel/debug/tracing/events"):
			tracefs = "/sys/kernel/debug/tracing"
		case errors.Is(err, os.ErrPermission):
			// Mounted, but this user may not look: not the same fix.
			denied = err
		case h.MountTracefs != nil && h.MountTracefs(h.path(tracefs)) == nil:
			// Mounted only to look inside; unmounted again below.
			mountedHere = true
		}
	}
	if mountedHere {
		defer func() {
			if h.UnmountTracefs != nil {
				if err := h.UnmountTracefs(h.path(tracefs)); err != nil {
					fs = append(fs, Finding{Level: Warn, Name: "tracefs", Detail: fmt.Sprintf("mounted by check and could not be unmounted: %v", err),
						Fix: "umount " + tracefs})
				}
			}
		}()
	}
	tracefsOK := h.exists(tracefs + "/events")
	switch {
	case denied != nil:
		add(Fail, "tracefs", fmt.Sprintf("%s is mounted but not readable by this user (%v)", tracefs, denied),
			"run as root, or as UID 0 with the capabilities (tracefs is usually mode 0700)")
	case tracefsOK && mountedHere:
		add(OK, "tracefs", "not mounted; it can be, and gaptrace mounts it at "+tracefs+" when it traces (check left it unmounted)", "")
	case tracefsOK:
		add(OK, "tracefs", tracefs, "")
	default:
		add(Fail, "tracefs", "not mounted and could not be mounted", "mount -t tracefs nodev /sys/kernel/tracing (in a container: mount the host's /sys/kernel/tracing)")
	}

	if h.exists("/sys/bus/event_source/devices/uprobe") {
		add(OK, "uprobes", "uprobe PMU present", "")
	} else {
		add(Fail, "uprobes", "no uprobe PMU (/sys/bus/event_source/devices/uprobe): CUDA and NCCL calls cannot be traced", "use a kernel with CONFIG_UPROBE_EVENTS=y")
	}

	if tracefsOK {
		var missing []string
		for _, tp := range []string{"syscalls/sys_enter_read", "syscalls/sys_exit_read", "syscalls/sys_enter_futex", "sched/sched_switch", "sched/sched_process_fork"} {
			if !h.exists(tracefs + "/events/" + tp) {
				missing = append(missing, tp)
			}
		}
		if len(missing) == 0 {
			add(OK, "tracepoints", "syscall and sched tracepoints present", "")
		} else {
			add(Fail, "tracepoints", "missing "+strings.Join(missing, ", "), "use a kernel with CONFIG_FTRACE_SYSCALLS=y")
		}
	}

	if h.exists("/sys/bus/event_source/devices/kprobe") {
		add(OK, "kprobes", "available (not required)", "")
	} else {
		add(OK, "kprobes", "not available — not required: syscalls are traced with tracepoints", "")
	}

	fs = append(fs, gpuChecks(ctx, cfg, gpu)...)

	if cfg.PID != 0 {
		fs = append(fs, targetChecks(cfg, cfg.PID)...)
	}
	return fs
}

// targetChecks looks at the libraries a target (and its children) mapped.
func targetChecks(cfg *config.Config, pid int) []Finding {
	if !proc.Exists(pid) {
		return []Finding{{Level: Fail, Name: "target", Detail: fmt.Sprintf("no such process: pid %d", pid), Fix: "check the PID (ps -ef), or use attach --match"}}
	}
	// The whole command line, as far as --command-line and --redact
	// allow: check is where the operator confirms which process it is.
	detail := strings.TrimSpace(fmt.Sprintf("pid %d %s", pid, cmdText(targetCmdline(cfg, pid), checkCmdWidth)))
	fs := []Finding{{Level: OK, Name: "target", Detail: detail}}
	found := map[string][]string{}
	for _, p := range append([]int{pid}, proc.Descendants(pid)...) {
		libs, err := proc.Libraries(p, "libcuda.so", "libnccl.so")
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				return append(fs, Finding{Level: Fail, Name: "target libraries", Detail: fmt.Sprintf("cannot read /proc/%d/maps: %v", p, err), Fix: "grant CAP_SYS_PTRACE or run as root"})
			}
			continue
		}
		for k, v := range libs {
			found[k] = append(found[k], v...)
		}
	}
	if l := found["libcuda.so"]; len(l) > 0 {
		fs = append(fs, Finding{Level: OK, Name: "libcuda", Detail: l[0]})
	} else {
		fs = append(fs, Finding{Level: Warn, Name: "libcuda", Detail: "not mapped by the target or its children (yet): no GPU calls to trace",
			Fix: "PyTorch loads it at the first CUDA call; if it never does, this is not the training process, or pass --cuda-lib"})
	}
	if l := found["libnccl.so"]; len(l) > 0 {
		fs = append(fs, Finding{Level: OK, Name: "libnccl", Detail: l[0]})
	} else {
		fs = append(fs, Finding{Level: OK, Name: "libnccl", Detail: "not mapped (single-GPU job, or NCCL not initialised yet): comm gaps need it"})
	}
	return fs
}

// bpfFeatures probes what the probes need from the BPF subsystem.
func bpfFeatures() []Finding {
	var fs []Finding
	probe := func(name string, err error, fix string) {
		switch {
		case err == nil:
			fs = append(fs, Finding{Level: OK, Name: name, Detail: "supported"})
		case errors.Is(err, ebpf.ErrNotSupported):
			fs = append(fs, Finding{Level: Fail, Name: name, Detail: "not supported by this kernel", Fix: fix})
		default:
			fs = append(fs, Finding{Level: Fail, Name: name, Detail: err.Error(), Fix: fix})
		}
	}
	probe("bpf ring buffer", features.HaveMapType(ebpf.RingBuf), "Linux 5.8+")
	probe("bpf uprobe programs", features.HaveProgramType(ebpf.Kprobe), "CONFIG_BPF_EVENTS=y")
	probe("bpf tracepoints", features.HaveProgramType(ebpf.TracePoint), "CONFIG_BPF_EVENTS=y")
	return fs
}

// kernelChecks finds the kernel release (h.Release, else uname) and checks
// it against the oldest kernel gaptrace runs on.
func kernelChecks(h Host) (rel string, fs []Finding) {
	add := func(l Level, name, detail, fix string) {
		fs = append(fs, Finding{Level: l, Name: name, Detail: detail, Fix: fix})
	}

	rel = h.Release
	if rel == "" {
		var u unix.Utsname
		if err := unix.Uname(&u); err == nil {
			rel = unix.ByteSliceToString(u.Release[:])
		}
	}
	// The BPF ring buffer (5.8) is the floor; CAP_BPF/CAP_PERFMON also
	// arrived in 5.8.
	if major, minor, ok := parseRelease(rel); !ok {
		add(Warn, "kernel", fmt.Sprintf("cannot parse release %q", rel), "")
	} else if major < 5 || (major == 5 && minor < 8) {
		add(Fail, "kernel", fmt.Sprintf("Linux %s is older than 5.8 (BPF ring buffer, CAP_BPF)", rel), "run on Linux 5.8 or newer")
	} else {
		add(OK, "kernel", "Linux "+rel, "")
	}
	return rel, fs
}

// privilegeChecks checks the capabilities gaptrace needs to trace and,
// when they are there, the BPF features the host reports.
func privilegeChecks(h Host, rel string) (fs []Finding) {
	add := func(l Level, detail, fix string) {
		fs = append(fs, Finding{Level: l, Name: "privileges", Detail: detail, Fix: fix})
	}

	privileged := true
	if h.Caps != nil {
		caps, err := h.Caps()
		switch {
		case err != nil:
			add(Warn, fmt.Sprintf("cannot read capabilities: %v", err), "")
		case len(proc.MissingTracingCaps(caps)) > 0:
			privileged = false
			add(Fail, "missing "+strings.Join(proc.MissingTracingCaps(caps), ", "),
				"run as root, or grant CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_SYS_RESOURCE (docker --cap-add, Kubernetes securityContext.capabilities.add)")
		default:
			detail := "CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE"
			if caps.Has(proc.CapSysAdmin) {
				detail = "CAP_SYS_ADMIN (root)"
			}
			// Before 5.11 BPF memory counts against RLIMIT_MEMLOCK, which
			// only CAP_SYS_RESOURCE may raise; later kernels charge the
			// memory cgroup instead.
			if major, minor, ok := parseRelease(rel); !caps.Has(proc.CapSysResource) && ok && (major < 5 || major == 5 && minor < 11) {
				add(Warn, detail+"; CAP_SYS_RESOURCE missing", "grant CAP_SYS_RESOURCE: before Linux 5.11 BPF maps need a raised memlock limit")
			} else {
				add(OK, detail, "")
			}
		}
	}
	if privileged && h.Features != nil {
		fs = append(fs, h.Features()...)
	}
	return fs
}

// gpuChecks reports what NVML sees of the GPUs.
func gpuChecks(ctx context.Context, cfg *config.Config, gpu GPUInspector) (fs []Finding) {
	add := func(l Level, detail, fix string) {
		fs = append(fs, Finding{Level: l, Name: "NVML", Detail: detail, Fix: fix})
	}

	if gpu == nil {
		add(Warn, "not built in", "")
	} else {
		r := gpu(ctx, cfg.NVMLLib)
		switch {
		case r.Err != nil:
			add(Warn, fmt.Sprintf("%v — idle windows will come from host events only", r.Err), r.Fix)
		case len(r.Devices) == 0:
			add(Warn, "no GPU devices", r.Fix)
		default:
			var names []string
			for _, d := range r.Devices {
				names = append(names, fmt.Sprintf("%d:%s", d.Index, d.Name))
			}
			lib := ""
			if r.Lib != "" {
				lib = " (" + r.Lib + ")"
			}
			add(OK, fmt.Sprintf("%d device(s): %s%s", len(r.Devices), strings.Join(names, ", "), lib), "")
		}
		fs = append(fs, r.Findings...)
	}
	return fs
}
