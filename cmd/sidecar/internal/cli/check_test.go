package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
)

// fakeRoot builds a /sys tree with the given paths.
func fakeRoot(t *testing.T, paths ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

var goodTree = []string{
	"/sys/kernel/btf/vmlinux",
	"/sys/kernel/tracing/events/syscalls/sys_enter_read",
	"/sys/kernel/tracing/events/syscalls/sys_exit_read",
	"/sys/kernel/tracing/events/syscalls/sys_enter_futex",
	"/sys/kernel/tracing/events/sched/sched_switch",
	"/sys/kernel/tracing/events/sched/sched_process_fork",
	"/sys/bus/event_source/devices/uprobe",
}

const rootCaps = proc.Caps(1<<41 - 1)

func findingsByName(fs []Finding) map[string]Finding {
	m := map[string]Finding{}
	for _, f := range fs {
		m[f.Name] = f
	}
	return m
}

func TestCheckHealthyHost(t *testing.T) {
	h := Host{Root: fakeRoot(t, goodTree...), Release: "6.18.44-fc", Caps: func() (proc.Caps, error) { return rootCaps, nil }}
	gpu := func(context.Context, string) GPUReport {
		return GPUReport{Devices: []GPUDevice{{Index: 0, Name: "NVIDIA H200"}},
			Findings: []Finding{{Level: Warn, Name: "gpu0 pcie_link", Detail: "Gen4 x16, max Gen5 x16", Fix: "reseat"}}}
	}
	cfg := config.Defaults(config.CmdCheck)
	fs := RunChecks(context.Background(), h, &cfg, gpu)
	m := findingsByName(fs)
	for name, want := range map[string]Level{
		"kernel": OK, "BTF": OK, "privileges": OK, "tracefs": OK, "uprobes": OK, "tracepoints": OK,
		"kprobes": OK, "NVML": OK, "gpu0 pcie_link": Warn,
	} {
		if m[name].Level != want {
			t.Errorf("%s: %s (%s), want %s", name, m[name].Level, m[name].Detail, want)
		}
	}
	if !strings.Contains(m["kprobes"].Detail, "not required") {
		t.Errorf("kprobes line %q should say it is not required", m["kprobes"].Detail)
	}
	if !Verdict(fs) {
		t.Error("a host with only WARNs must pass")
	}
	var b bytes.Buffer
	PrintFindings(&b, fs)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != len(fs) {
		t.Errorf("%d lines for %d findings: one line each", len(lines), len(fs))
	}
	if !strings.Contains(b.String(), "WARN  gpu0 pcie_link       Gen4 x16, max Gen5 x16 — fix: reseat") {
		t.Errorf("output:\n%s", b.String())
	}
}

func TestCheckBrokenHost(t *testing.T) {
	h := Host{Root: fakeRoot(t), Release: "5.4.0-150-generic",
		Caps:         func() (proc.Caps, error) { return 0, nil },
		Features:     func() []Finding { t.Error("BPF features probed without privileges"); return nil },
		MountTracefs: func(string) error { return errors.New("EPERM") },
	}
	gpu := func(context.Context, string) GPUReport {
		return GPUReport{Err: errors.New("nvml library not available"), Fix: "install the driver"}
	}
	cfg := config.Defaults(config.CmdCheck)
	fs := RunChecks(context.Background(), h, &cfg, gpu)
	m := findingsByName(fs)
	for name, want := range map[string]Level{
		"kernel": Fail, "BTF": Fail, "privileges": Fail, "tracefs": Fail, "uprobes": Fail, "NVML": Warn,
	} {
		if m[name].Level != want {
			t.Errorf("%s: %s (%s), want %s", name, m[name].Level, m[name].Detail, want)
		}
		if want != OK && m[name].Fix == "" {
			t.Errorf("%s: no fix given", name)
		}
	}
	if !strings.Contains(m["privileges"].Detail, "CAP_BPF") {
		t.Errorf("privileges detail %q should name the missing capability", m["privileges"].Detail)
	}
	if Verdict(fs) {
		t.Error("verdict must fail")
	}
}

func TestCheckMountsTracefs(t *testing.T) {
	tree := []string{"/sys/kernel/btf/vmlinux", "/sys/bus/event_source/devices/uprobe"}
	root := fakeRoot(t, tree...)
	mounted, unmounted := "", ""
	h := Host{Root: root, Release: "6.1.0", Caps: func() (proc.Caps, error) { return rootCaps, nil },
		MountTracefs: func(p string) error {
			mounted = p
			for _, tp := range goodTree[1:6] {
				if err := os.MkdirAll(filepath.Join(root, tp), 0o755); err != nil {
					return err
				}
			}
			return nil
		},
		UnmountTracefs: func(p string) error { unmounted = p; return nil }}
	cfg := config.Defaults(config.CmdCheck)
	fs := RunChecks(context.Background(), h, &cfg, nil)
	m := findingsByName(fs)
	if mounted != root+"/sys/kernel/tracing" {
		t.Errorf("mounted at %q", mounted)
	}
	if unmounted != mounted {
		t.Errorf("check mounted tracefs at %q and unmounted %q: the system must be left as found", mounted, unmounted)
	}
	if m["tracefs"].Level != OK || !strings.Contains(m["tracefs"].Detail, "gaptrace mounts it") || m["tracepoints"].Level != OK {
		t.Errorf("tracefs %+v tracepoints %+v", m["tracefs"], m["tracepoints"])
	}
	n := 0
	for _, f := range fs {
		if f.Name == "tracefs" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d tracefs lines, want 1", n)
	}
}

func TestCheckTarget(t *testing.T) {
	cmd := startSleep(t, "30")
	h := Host{Root: fakeRoot(t, goodTree...), Release: "6.18.0", Caps: func() (proc.Caps, error) { return rootCaps, nil }}
	cfg := config.Defaults(config.CmdCheck)
	cfg.PID = cmd.Process.Pid
	m := findingsByName(RunChecks(context.Background(), h, &cfg, nil))
	if m["target"].Level != OK || !strings.Contains(m["target"].Detail, "sleep 30") {
		t.Errorf("target %+v", m["target"])
	}
	if m["libcuda"].Level != Warn || m["libcuda"].Fix == "" {
		t.Errorf("libcuda %+v: sleep maps no libcuda, want a WARN with a fix", m["libcuda"])
	}
	cfg.PID = unusedPID(t)
	m = findingsByName(RunChecks(context.Background(), h, &cfg, nil))
	if m["target"].Level != Fail || !strings.Contains(m["target"].Detail, "no such process") {
		t.Errorf("target %+v", m["target"])
	}
}

func TestParseRelease(t *testing.T) {
	for rel, want := range map[string][2]int{"6.18.44-fc-v782": {6, 18}, "5.8.0": {5, 8}, "4.19.0-26-amd64": {4, 19}, "6.1": {6, 1}, "5.15rc1": {5, 15}} {
		ma, mi, ok := parseRelease(rel)
		if !ok || ma != want[0] || mi != want[1] {
			t.Errorf("parseRelease(%q) = %d.%d %v", rel, ma, mi, ok)
		}
	}
	if _, _, ok := parseRelease("garbage"); ok {
		t.Error("parsed garbage")
	}
}

// A tracefs this user may not read is not "not mounted", and check must
// not try to mount over it.
func TestCheckTracefsPermissionDenied(t *testing.T) {
	root := fakeRoot(t, goodTree...)
	h := Host{Root: root, Release: "6.1.0", Caps: func() (proc.Caps, error) { return rootCaps, nil },
		MountTracefs: func(string) error { t.Error("tried to mount over a mounted tracefs"); return nil },
		Stat: func(p string) (os.FileInfo, error) {
			if strings.HasPrefix(p, root+"/sys/kernel/tracing/") {
				return nil, &os.PathError{Op: "stat", Path: p, Err: os.ErrPermission}
			}
			return os.Stat(p)
		}}
	cfg := config.Defaults(config.CmdCheck)
	m := findingsByName(RunChecks(context.Background(), h, &cfg, nil))
	if f := m["tracefs"]; f.Level != Fail || !strings.Contains(f.Detail, "not readable") || strings.Contains(f.Detail, "not mounted") {
		t.Errorf("tracefs %+v, want a permission failure", f)
	}
}
