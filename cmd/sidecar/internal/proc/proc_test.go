package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMissingTracingCaps(t *testing.T) {
	var none Caps
	if got := MissingTracingCaps(none); !slices.Equal(got, []string{"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"}) {
		t.Errorf("none: %v", got)
	}
	minimal := Caps(1<<CapBPF | 1<<CapPerfmon | 1<<CapSysPtrace)
	if got := MissingTracingCaps(minimal); len(got) != 0 {
		t.Errorf("bpf+perfmon+ptrace: %v", got)
	}
	admin := Caps(1<<CapSysAdmin | 1<<CapSysPtrace)
	if got := MissingTracingCaps(admin); len(got) != 0 {
		t.Errorf("sys_admin implies bpf and perfmon: %v", got)
	}
}

func TestWatchAndLibraries(t *testing.T) {
	cmd := exec.Command("sleep", "0.3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cmd.Wait(); err != nil {
			t.Errorf("sleep 0.3: %v", err)
		}
	}()
	w, err := Open(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Exited() {
		t.Fatal("exited too early")
	}
	// The dynamic loader maps libc shortly after exec: poll for it.
	var libs map[string][]string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		libs, err = Libraries(cmd.Process.Pid, "libc.so", "libcuda.so")
		if err != nil {
			t.Fatal(err)
		}
		if len(libs["libc.so"]) > 0 {
			break
		}
	}
	if len(libs["libc.so"]) == 0 || len(libs["libcuda.so"]) != 0 {
		t.Errorf("libraries of sleep: %v", libs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !w.Wait(ctx) {
		t.Fatal("exit not seen")
	}
	// Not reaped yet (a zombie): still counts as exited.
	if !w.Exited() {
		t.Error("Exited false after exit")
	}
}

func TestOpenNoProcess(t *testing.T) {
	_, err := Open(1 << 22)
	if !errors.Is(err, ErrNoProcess) {
		t.Errorf("err %v, want ErrNoProcess", err)
	}
	if Exists(1 << 22) {
		t.Error("exists")
	}
}

func TestFindMatchingSkipsSelfAndAncestors(t *testing.T) {
	cmd := exec.Command("sleep", "7.654321")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cmd.Process.Kill(); err != nil {
			t.Errorf("kill sleep: %v", err)
		}
		_ = cmd.Wait() // the kill's signal
	}()
	// Until the child has exec'd sleep its command line is empty (or the
	// test binary's); on a loaded machine that lasts a while.
	deadline := time.Now().Add(10 * time.Second)
	for cl, _ := Cmdline(cmd.Process.Pid); !strings.HasSuffix(cl, "sleep 7.654321"); cl, _ = Cmdline(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("sleep never exec'd: cmdline %q", cl)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := FindMatching(regexp.MustCompile(`sleep 7\.654321`))
	if !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("matches %v, want [%d]", got, cmd.Process.Pid)
	}
	// The test binary's own command line matches its own name but must be
	// left out.
	self, _ := os.Executable()
	for _, p := range FindMatching(regexp.MustCompile(regexp.QuoteMeta(self))) {
		if p == os.Getpid() {
			t.Error("matched itself")
		}
	}
	if d := Descendants(os.Getpid()); !slices.Contains(d, cmd.Process.Pid) {
		t.Errorf("descendants %v lack %d", d, cmd.Process.Pid)
	}
	if cl, _ := Cmdline(cmd.Process.Pid); !strings.HasSuffix(cl, "sleep 7.654321") {
		t.Errorf("cmdline %q", cl)
	}
}
