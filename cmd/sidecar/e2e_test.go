package main_test

// End-to-end tests of the gaptrace binary against the simulated trainer.
// They load real probes, so they need root (or CAP_BPF+CAP_PERFMON+
// CAP_SYS_PTRACE) and skip with the reason otherwise. The binary is
// $GAPTRACE_BIN or built here; the simulated GPU is $GAPTRACE_SIMGPU or
// built here with make.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// gaptraceBin and simgpuDir are set by need: absolute, since the binary
// runs in a scratch directory so that its default outputs
// (gaptrace-spans.jsonl) never land in the tree.
var (
	gaptraceBin string
	simgpuDir   string
)

func TestMain(m *testing.M) { testutil.Main(m) }

func need(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t, "loads BPF programs")
	gaptraceBin = testutil.Gaptrace(t)
	simgpuDir = testutil.SimGPU(t)
}

// ourProgramNames lists the BPF program names of the tracer's objects, as
// the kernel reports them (truncated to 15 bytes).
func ourProgramNames(t *testing.T) map[string]bool {
	t.Helper()
	objs, _ := filepath.Glob("../../tracer/*_bpfel.o")
	if len(objs) == 0 {
		t.Fatal("no BPF objects in tracer/")
	}
	names := map[string]bool{}
	for _, o := range objs {
		spec, err := ebpf.LoadCollectionSpec(o)
		if err != nil {
			t.Fatalf("load %s: %v", o, err)
		}
		for name := range spec.Programs {
			if len(name) > 15 {
				name = name[:15]
			}
			names[name] = true
		}
	}
	return names
}

// loadedPrograms returns the IDs of loaded BPF programs whose names are
// ours.
func loadedPrograms(t *testing.T, ours map[string]bool) []ebpf.ProgramID {
	t.Helper()
	var ids []ebpf.ProgramID
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err == nil && ours[info.Name] {
			ids = append(ids, id)
		}
	}
	return ids
}

// heldPrograms returns the IDs of BPF programs some live process holds
// through a program or link fd. Other tests (the tracer's) may load the
// same programs concurrently; those are held by their test process, while
// anything gaptrace left behind is held by nobody.
func heldPrograms() map[ebpf.ProgramID]bool {
	held := map[ebpf.ProgramID]bool{}
	infos, _ := filepath.Glob("/proc/[0-9]*/fdinfo/*")
	for _, f := range infos {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "prog_id:"); ok {
				if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
					held[ebpf.ProgramID(n)] = true
				}
			}
		}
	}
	return held
}

// assertNothingLeft checks that none of our programs loaded after before
// is still loaded without an owner. Program teardown after the last fd
// closes is asynchronous (RCU), so it polls with a deadline.
func assertNothingLeft(t *testing.T, ours map[string]bool, before []ebpf.ProgramID) {
	t.Helper()
	var left []ebpf.ProgramID
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		left = left[:0]
		held := heldPrograms()
		for _, id := range loadedPrograms(t, ours) {
			if !slices.Contains(before, id) && !held[id] {
				left = append(left, id)
			}
		}
		if len(left) == 0 {
			return
		}
	}
	t.Errorf("BPF programs of ours still loaded after gaptrace exited: ids %v", left)
}

// proc is a running gaptrace with its output captured.
type gtProc struct {
	cmd            *exec.Cmd
	stdout, stderr *testutil.LockedBuffer
	done           chan struct{}
	err            error
}

// reap kills cmd and waits for it. Wait's error is the kill's signal, so
// only a failed kill of a live process is a problem.
func reap(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("kill %d: %v", cmd.Process.Pid, err)
	}
	_ = cmd.Wait()
}

// exitStatusOnly reports whether err, from cmd.Wait, says no more than the
// command's exit status (which the tests read from ProcessState), rather
// than that waiting for it or copying its output failed.
func exitStatusOnly(err error) bool {
	var ee *exec.ExitError
	return err == nil || errors.As(err, &ee)
}

func env(t *testing.T) []string {
	return append(os.Environ(), "SIMGPU_DIR="+t.TempDir())
}

func start(t *testing.T, environ []string, args ...string) *gtProc {
	t.Helper()
	return startArgv(t, environ, append([]string{gaptraceBin}, args...)...)
}

// startArgv starts any command line (gaptrace behind unshare or nsenter).
func startArgv(t *testing.T, environ []string, argv ...string) *gtProc {
	t.Helper()
	p := &gtProc{stdout: &testutil.LockedBuffer{}, stderr: &testutil.LockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Dir = t.TempDir()
	p.cmd.Env = environ
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// Its own process group, like a job started by a shell, so signals
	// sent to it do not reach the test.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			testutil.KillGroup(t, p.cmd.Process.Pid)
			<-p.done
		}
	})
	return p
}

func (p *gtProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("gaptrace did not exit within %v\nstdout:\n%s\nstderr:\n%s", d, p.stdout, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *gtProc) waitFor(t *testing.T, re *regexp.Regexp, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if re.MatchString(p.stderr.String()) {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("gaptrace exited before %q\nstderr:\n%s", re, p.stderr)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no %q within %v\nstderr:\n%s", re, d, p.stderr)
}

func runGaptrace(t *testing.T, environ []string, args ...string) (int, string, string) {
	t.Helper()
	p := start(t, environ, args...)
	code := p.wait(t, 3*time.Minute)
	return code, p.stdout.String(), p.stderr.String()
}

var attached = regexp.MustCompile(`uprobes attached.*libcuda`)

func simtrain(args ...string) []string {
	return append([]string{filepath.Join(simgpuDir, "simtrain")}, args...)
}

func TestRunSimtrainAndExitCodes(t *testing.T) {
	need(t)
	dir := t.TempDir()
	sum := filepath.Join(dir, "summary.json")
	gaps := filepath.Join(dir, "gaps.jsonl")
	args := append([]string{"run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--summary-json", sum, "--gaps-out", gaps, "--spans-out", filepath.Join(dir, "spans.jsonl"), "--"},
		simtrain("--steps", "40", "--kernel-us", "1000", "--stall", "io.read:every=4:ms=20", "--quiet")...)
	code, stdout, stderr := runGaptrace(t, env(t), args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	b, err := os.ReadFile(sum)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		WallNS  int64            `json:"wall_ns"`
		Steps   int64            `json:"steps"`
		Gaps    int64            `json:"gaps"`
		ByCause map[string]int64 `json:"by_cause"`
		Sidecar struct {
			CPUNS        int64             `json:"cpu_ns"`
			Events       uint64            `json:"events"`
			EventsByKind map[string]uint64 `json:"events_by_kind"`
		} `json:"sidecar"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.WallNS <= 0 || s.ByCause["io.read"] <= 0 {
		t.Errorf("summary shows no traced io.read stalls: %s", b)
	}
	// Its own cost: the records it read, by kind, add up; the stalls'
	// reads and the step syncs are among them.
	var byKind uint64
	for _, n := range s.Sidecar.EventsByKind {
		byKind += n
	}
	if s.Sidecar.CPUNS <= 0 || s.Sidecar.Events == 0 || byKind != s.Sidecar.Events ||
		s.Sidecar.EventsByKind["syscall"] == 0 || s.Sidecar.EventsByKind["cuda.call"] == 0 {
		t.Errorf("summary's sidecar cost: %+v", s.Sidecar)
	}
	if !strings.Contains(stdout, "gaptrace itself: ") || !strings.Contains(stdout, "% of a core") {
		t.Errorf("the summary does not say what gaptrace itself cost:\n%s", stdout)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"wall_ns", "gpu_idle_ns", "by_cause", "steps", "gaps", "dropped_events",
		"late_events", "forced_events", "dropped_intervals", "incomplete_steps", "gaps_after_step"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("summary lacks %q: %s", k, b)
		}
	}
	if !strings.Contains(stdout, "summary") || !strings.Contains(stdout, "io.read") {
		t.Errorf("no summary on stdout:\n%s", stdout)
	}
	f, err := os.Open(gaps)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		var g map[string]any
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("gap line %d: %v", n+1, err)
		}
		n++
	}
	if n == 0 {
		t.Error("no gaps written")
	}

	for _, tc := range []struct {
		script string
		want   int
	}{{"exit 3", 3}, {"kill -KILL $$", 137}} {
		code, _, stderr := runGaptrace(t, env(t), "run", "--live", "off", "--", "sh", "-c", tc.script)
		if code != tc.want {
			t.Errorf("run sh -c %q: exit %d, want %d\n%s", tc.script, code, tc.want, stderr)
		}
	}
}

func TestSIGINTDetachesAndLeavesNothing(t *testing.T) {
	need(t)
	ours := ourProgramNames(t)
	before := loadedPrograms(t, ours)
	p := start(t, env(t), append([]string{"run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--"},
		simtrain("--steps", "100000", "--quiet")...)...)
	p.waitFor(t, attached, time.Minute)
	if len(loadedPrograms(t, ours)) == len(before) {
		t.Fatal("no programs of ours loaded while tracing: the check below would prove nothing")
	}
	// Not a terminal's Ctrl-C: gaptrace forwards SIGINT, the trainer
	// exits, gaptrace detaches and prints the summary.
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("interrupt gaptrace: %v", err)
	}
	code := p.wait(t, 2*time.Minute)
	// simtrain finishes its step and exits 0 on SIGINT, like a trainer
	// with a KeyboardInterrupt handler; 130 would mean it died of it.
	if code != 0 && code != 128+int(syscall.SIGINT) {
		t.Errorf("exit %d, want the trainer's own (0 or 130)\n%s", code, p.stderr)
	}
	if !strings.Contains(p.stdout.String(), "summary") {
		t.Errorf("no summary after SIGINT:\n%s", p.stdout)
	}
	assertNothingLeft(t, ours, before)
}

func TestKill9LeavesTargetRunning(t *testing.T) {
	need(t)
	ours := ourProgramNames(t)
	before := loadedPrograms(t, ours)
	status := filepath.Join(t.TempDir(), "status")
	// sh records the trainer's exit status, which only its parent can see.
	script := fmt.Sprintf("%s --steps 150 --kernel-us 2000 --quiet; echo $? > %s", strings.Join(simtrain(), " "), status)
	p := start(t, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--", "sh", "-c", script)
	p.waitFor(t, attached, time.Minute)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	deadline := time.Now().Add(2 * time.Minute)
	var b []byte
	for time.Now().Before(deadline) {
		var err error
		if b, err = os.ReadFile(status); err == nil && len(b) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := strings.TrimSpace(string(b)); got != "0" {
		t.Errorf("trainer exit status %q after gaptrace was killed, want 0", got)
	}
	assertNothingLeft(t, ours, before)
	if ue, err := os.ReadFile("/sys/kernel/tracing/uprobe_events"); err == nil && strings.Contains(string(ue), simgpuDir) {
		t.Errorf("uprobe events on the simulated libraries remain:\n%s", ue)
	}
}

func TestFailuresAreClear(t *testing.T) {
	need(t)
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, sleeper)

	t.Run("no such pid", func(t *testing.T) {
		pid := 4_194_000
		for ; pid > 4_000_000; pid-- {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				break
			}
		}
		code, _, stderr := runGaptrace(t, os.Environ(), "attach", "--pid", strconv.Itoa(pid))
		if code != 1 || stderr != fmt.Sprintf("gaptrace attach: no such process: pid %d\n", pid) {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("no CUDA library in the target", func(t *testing.T) {
		code, _, stderr := runGaptrace(t, os.Environ(), "attach", "--live", "off", "--cuda-wait", "1s", "--pid", strconv.Itoa(sleeper.Process.Pid))
		if code != 1 || !strings.Contains(stderr, "gaptrace attach: no CUDA library in the target") {
			t.Errorf("exit %d, stderr:\n%s", code, stderr)
		}
	})
	t.Run("process exits while attaching", func(t *testing.T) {
		// Probes take far longer to load than this process lives.
		short := exec.Command("sleep", "0.02")
		if err := short.Start(); err != nil {
			t.Fatal(err)
		}
		pid := short.Process.Pid
		// Reaped in the background so that it does not linger as a zombie;
		// it is a target, its exit status tells nothing.
		go func() { _ = short.Wait() }()
		code, _, stderr := runGaptrace(t, os.Environ(), "attach", "--live", "off", "--pid", strconv.Itoa(pid))
		// Either it died while probes loaded (the usual case) or before
		// gaptrace looked: one clear line either way.
		// Probe loading may log before; the verdict is the last line.
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		last := lines[len(lines)-1]
		ok := last == fmt.Sprintf("gaptrace attach: process %d exited while attaching", pid) ||
			last == fmt.Sprintf("gaptrace attach: no such process: pid %d", pid)
		if code != 1 || !ok || strings.Contains(stderr, "level=ERROR") {
			t.Errorf("exit %d, stderr:\n%s", code, stderr)
		}
	})
	t.Run("bad flag values", func(t *testing.T) {
		code, _, stderr := runGaptrace(t, os.Environ(), "run", "--probes", "most", "--duration", "ten", "--otlp-protocol", "smoke", "--", "true")
		if code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
		for _, w := range []string{"--probes", "--duration", "--otlp-protocol"} {
			if !strings.Contains(stderr, w) {
				t.Errorf("stderr lacks %s:\n%s", w, stderr)
			}
		}
	})
	t.Run("not root", func(t *testing.T) {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("setpriv (util-linux) not installed: cannot drop capabilities")
		}
		// Still uid 0, but with an empty capability set: exactly what a
		// container without the capabilities looks like.
		cmd := exec.Command(setpriv, "--inh-caps=-all", "--bounding-set=-all", gaptraceBin, "run", "--", "true")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err = cmd.Run()
		code := cmd.ProcessState.ExitCode()
		if code != 1 || !strings.Contains(stderr.String(), "cannot trace: missing capabilities CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE") ||
			strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("exit %d (%v), stderr:\n%s", code, err, stderr.String())
		}
	})
}

func TestCheck(t *testing.T) {
	need(t)
	sim := exec.Command(filepath.Join(simgpuDir, "simtrain"), "--steps", "400", "--kernel-us", "5000", "--quiet")
	sim.Env = env(t)
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, sim)
	code, stdout, stderr := runGaptrace(t, sim.Env, "check", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--pid", strconv.Itoa(sim.Process.Pid))
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, re := range []string{`(?m)^OK\s+uprobes`, `(?m)^OK\s+tracepoints`, `(?m)^OK\s+NVML\s+1 device`, `(?m)^OK\s+libcuda\s+.*libcuda\.so\.1`, `(?m)^OK\s+libnccl\s+.*libnccl\.so\.2`, `tracing can work here`} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("check output lacks %s:\n%s", re, stdout)
		}
	}
}

func TestDemo(t *testing.T) {
	need(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gaptraceBin, "demo", "--demo-duration", "8s", "--out", out)
	cmd.Env = append(os.Environ(), "GAPTRACE_SIMGPU="+simgpuDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	startAt := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("demo took %v", time.Since(startAt).Round(time.Second))
	for _, f := range []string{"gaptrace-gaps.jsonl", "gaptrace-spans.jsonl", "gaptrace-summary.json"} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty: %v", f, err)
		}
	}
	// The mix's main causes show up in the summary.
	for _, c := range []string{"io.read", "loader.wait", "io.write", "net"} {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(c) + ` `).MatchString(stdout.String()) {
			t.Errorf("summary lacks cause %s:\n%s", c, stdout.String())
		}
	}
}

func TestAttachGPUProcs(t *testing.T) {
	need(t)
	environ := env(t)
	sim := exec.Command(filepath.Join(simgpuDir, "simtrain"), "--steps", "100000", "--quiet")
	sim.Env = environ
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, sim)
	// A process without libcuda whose command line also matches must be
	// left alone.
	decoy := exec.Command("sleep", "300")
	if err := decoy.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, decoy)
	sum := filepath.Join(t.TempDir(), "summary.json")
	code, _, stderr := runGaptrace(t, environ, "attach", "--gpu-procs", "--match", `simtrain|sleep 300`, "--duration", "3s", "--live", "off",
		"--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--summary-json", sum)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, fmt.Sprintf("tracing matching process\" component=cli pid=%d", sim.Process.Pid)) {
		t.Errorf("simtrain (pid %d) not traced:\n%s", sim.Process.Pid, stderr)
	}
	if strings.Contains(stderr, fmt.Sprintf("pid=%d", decoy.Process.Pid)) {
		t.Errorf("process without libcuda (pid %d) traced", decoy.Process.Pid)
	}
	if _, err := os.Stat(sum); err != nil {
		t.Errorf("no summary written: %v", err)
	}
}
