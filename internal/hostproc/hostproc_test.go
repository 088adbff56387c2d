package hostproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestMissingCaps(t *testing.T) {
	var none Caps
	if got := MissingTracingCaps(none); !slices.Equal(got, []string{"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"}) {
		t.Errorf("none: %v", got)
	}
	if got := MissingBPFCaps(none); !slices.Equal(got, []string{"CAP_BPF", "CAP_PERFMON"}) {
		t.Errorf("bpf, none: %v", got)
	}
	minimal := Caps(1<<CapBPF | 1<<CapPerfmon | 1<<CapSysPtrace)
	if got := MissingTracingCaps(minimal); len(got) != 0 {
		t.Errorf("bpf+perfmon+ptrace: %v", got)
	}
	admin := Caps(1 << CapSysAdmin)
	if got := MissingBPFCaps(admin); len(got) != 0 {
		t.Errorf("sys_admin implies bpf and perfmon: %v", got)
	}
	if got := MissingTracingCaps(admin); !slices.Equal(got, []string{"CAP_SYS_PTRACE"}) {
		t.Errorf("sys_admin alone: %v", got)
	}
}

func TestEffectiveCapsOfRoot(t *testing.T) {
	c, err := EffectiveCaps()
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && !c.Has(CapSysAdmin) {
		t.Skip("root without CAP_SYS_ADMIN (a restricted container)")
	}
	if os.Geteuid() == 0 && len(MissingTracingCaps(c)) != 0 {
		t.Errorf("root lacks %v", MissingTracingCaps(c))
	}
}

// TestDescendantsAndThreadGroup starts a shell whose child sleeps: both are
// descendants of the test, the grandchild after its parent.
func TestDescendantsAndThreadGroup(t *testing.T) {
	// The child's name has a space and parentheses, which stat shows as is
	// ("pid (a) 1 (b) S ppid ...").
	dir := t.TempDir()
	odd := filepath.Join(dir, "a) 1 (b")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(sleep); err != nil || os.WriteFile(odd, b, 0o755) != nil {
		t.Fatal("copy sleep", err)
	}
	cmd := exec.Command("sh", "-c", "'"+odd+"' 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sh := cmd.Process.Pid
	var d, grand []int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		grand = Descendants(sh)
		d = Descendants(os.Getpid())
		if len(grand) > 0 && slices.Contains(d, grand[0]) {
			break
		}
	}
	i := slices.Index(d, sh)
	if i < 0 || len(grand) != 1 {
		t.Fatalf("descendants of the test %v, of the shell %v; want the shell %d and its sleep", d, grand, sh)
	}
	if j := slices.Index(d, grand[0]); j <= i {
		t.Errorf("grandchild %d at %d, its parent at %d in %v", grand[0], j, i, d)
	}
	if g, err := ThreadGroup(sh); err != nil || g != sh {
		t.Errorf("thread group of %d: %d, %v", sh, g, err)
	}
	// Any thread names its process: the Go runtime has several.
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		var tid int
		if _, err := fmt.Sscan(task.Name(), &tid); err != nil {
			t.Fatal(err)
		}
		if g, err := ThreadGroup(tid); err != nil || g != os.Getpid() {
			t.Errorf("thread group of thread %d: %d, %v; want %d", tid, g, err, os.Getpid())
		}
	}
	if _, err := ThreadGroup(1 << 22); err == nil {
		t.Error("thread group of a pid that does not exist")
	}
}

// BenchmarkDescendants: one walk of /proc, what attach does every second.
func BenchmarkDescendants(b *testing.B) {
	for b.Loop() {
		Descendants(1)
	}
}
