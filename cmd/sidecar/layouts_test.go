package main_test

// Where gaptrace runs relative to the job: the PID-namespace layouts of
// deploy/ (host, DaemonSet with hostPID, Kubernetes sidecar with a shared
// process namespace, compose's pid: service:trainer) built with unshare and
// nsenter, plus attach to a job that already runs CUDA and kill -9 of
// gaptrace while its live view is on a terminal.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
	"github.com/gaptrace/gaptrace/test/accuracy"
)

// The same job in every layout: two host stalls of known cause, a truth
// file written by the job itself.
func layoutJob(truth string, steps int) []string {
	return simtrain("--steps", strconv.Itoa(steps), "--kernel-us", "2000",
		"--stall", "io.read:every=4:ms=25", "--stall", "sleep:every=5:ms=20", "--truth", truth, "--quiet")
}

// startTrainerInChildNS starts the job as pid 1 of a new PID namespace and
// returns the unshare process and the job's pid as this test sees it.
func startTrainerInChildNS(t *testing.T, environ, job []string) (*gtProc, int) {
	t.Helper()
	u := startArgv(t, environ, append([]string{"unshare", "--pid", "--fork", "--mount-proc"}, job...)...)
	return u, findJob(t, u)
}

// findJob returns the pid, as this test sees it, of the descendant of p
// that maps libcuda: the trainer.
func findJob(t *testing.T, p *gtProc) int {
	t.Helper()
	var job int
	if !testutil.Poll(30*time.Second, 20*time.Millisecond, func() bool {
		for _, d := range proc.Descendants(p.cmd.Process.Pid) {
			if libs, err := proc.Libraries(d, "libcuda.so"); err == nil && len(libs["libcuda.so"]) > 0 {
				job = d
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the job never mapped libcuda\n%s", p.stderr)
	}
	return job
}

// untilStopped is a job's step count when the test, not the count, ends
// it: far more steps than any test waits for.
const untilStopped = 1_000_000

// stopAfterTracedSteps lets an attached job run until its truth shows n
// steps that began a second or more after gaptrace said it had attached
// (the scoring skips that second), then interrupts it: simtrain ends its
// step and writes its end record. A fixed step count would race against
// attaching, which on a loaded machine takes seconds.
func stopAfterTracedSteps(t *testing.T, gt *gtProc, truth string, job, n int) {
	t.Helper()
	gt.waitFor(t, attached, time.Minute)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	from := ts.Nano() + int64(time.Second)
	var seen int
	if !testutil.Poll(3*time.Minute, 100*time.Millisecond, func() bool {
		seen = truthStepsFrom(truth, from)
		return seen >= n
	}) {
		t.Fatalf("the job ran %d steps past the first traced second, want %d\n%s", seen, n, gt.stderr)
	}
	if err := syscall.Kill(job, syscall.SIGINT); err != nil {
		t.Fatalf("interrupt the job: %v", err)
	}
}

// truthStepsFrom counts the steps of a truth file being written that began
// at or after from (CLOCK_MONOTONIC ns); a line still being written is not
// a step yet.
func truthStepsFrom(truth string, from int64) int {
	b, err := os.ReadFile(truth)
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		var r struct {
			Type  string `json:"type"`
			Start int64  `json:"start"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Type == "step" && r.Start >= from {
			n++
		}
	}
	return n
}

type layoutResult struct {
	name   string
	right  map[string]float64 // per injected cause: right-cause share of its idle
	pidOK  string             // "" when every gap named the job as expected
	steps  int64
	scored int
}

func TestNamespaceLayouts(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	nvml := filepath.Join(simgpuDir, "libnvidia-ml.so.1")
	outFlags := func(dir string) []string {
		return []string{"--live", "off", "--nvml-lib", nvml, "--gaps-out", filepath.Join(dir, "gaps.jsonl"),
			"--summary-json", filepath.Join(dir, "summary.json"), "--spans-out", filepath.Join(dir, "spans.jsonl")}
	}
	// steps is the length of a job gaptrace runs or attaches to at once;
	// scoredSteps is what an attached job must run while traced.
	const steps, scoredSteps = 120, 60
	var compose int // the compose layout's job, which outlives gaptrace
	layouts := []nsLayout{
		{"host-run", func(t *testing.T, environ []string, dir, truth string) (*gtProc, func() (int, int)) {
			gt := start(t, environ, append(append([]string{"run"}, outFlags(dir)...), append([]string{"--"}, layoutJob(truth, steps)...)...)...)
			return gt, nil
		}, nil},
		{"daemonset-hostpid-job-in-child-ns", func(t *testing.T, environ []string, dir, truth string) (*gtProc, func() (int, int)) {
			_, pid := startTrainerInChildNS(t, environ, layoutJob(truth, untilStopped))
			gt := start(t, environ, append([]string{"attach", "--pid", strconv.Itoa(pid)}, outFlags(dir)...)...)
			stopAfterTracedSteps(t, gt, truth, pid, scoredSteps)
			return gt, func() (int, int) { return pid, 1 }
		}, nil},
		{"sidecar-shared-ns", func(t *testing.T, environ []string, dir, truth string) (*gtProc, func() (int, int)) {
			// sh stands for the pod's pause process (pid 1); the job and
			// gaptrace are its children.
			script := `"$@" & job=$!; echo $job > ` + filepath.Join(dir, "jobpid") + `; ` + gaptraceBin + ` attach --pid $job ` +
				strings.Join(outFlags(dir), " ") + `; wait`
			gt := startArgv(t, environ, append([]string{"unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script, "sh"},
				layoutJob(truth, untilStopped)...)...)
			stopAfterTracedSteps(t, gt, truth, findJob(t, gt), scoredSteps)
			return gt, func() (int, int) {
				b, _ := os.ReadFile(filepath.Join(dir, "jobpid"))
				n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return n, 0
			}
		}, nil},
		{"compose-joins-ns-job-is-pid1", func(t *testing.T, environ []string, dir, truth string) (*gtProc, func() (int, int)) {
			// The namespace ends with its pid 1, and everything in it
			// with it: gaptrace stops first (--duration), as a compose
			// user's would be stopped before the trainer.
			// The job runs until gaptrace is done: a fixed step count
			// could end it first on a loaded machine.
			_, pid := startTrainerInChildNS(t, environ, layoutJob(truth, untilStopped))
			compose = pid
			gt := startArgv(t, environ, append([]string{"nsenter", "--target", strconv.Itoa(pid), "--pid", "--mount", "--",
				gaptraceBin, "attach", "--pid", "1", "--duration", "4s"}, outFlags(dir)...)...)
			return gt, func() (int, int) { return 1, 0 }
		}, func(t *testing.T) {
			if err := syscall.Kill(compose, syscall.SIGINT); err != nil {
				t.Fatalf("interrupt the job: %v", err)
			}
		}},
		{"nested-own-ns-job-in-child-ns", func(t *testing.T, environ []string, dir, truth string) (*gtProc, func() (int, int)) {
			argv := append([]string{"unshare", "--pid", "--fork", "--mount-proc", gaptraceBin, "run"}, outFlags(dir)...)
			argv = append(argv, "--", "unshare", "--pid", "--fork", "--mount-proc")
			gt := startArgv(t, environ, append(argv, layoutJob(truth, steps)...)...)
			return gt, nil // checked below from the gaps: one process, ns pid 1
		}, nil},
	}

	var results []layoutResult
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			results = append(results, runLayout(t, l))
		})
	}
	if len(results) != len(layouts) {
		return
	}
	t.Logf("%-70s %8s %8s %6s", "layout", "io.read", "sleep", "steps")
	for _, r := range results {
		t.Logf("%-70s %8.3f %8.3f %6d", r.name, r.right["io.read"], r.right["sleep"], r.scored)
	}
	for _, r := range results[1:] {
		for c, v := range r.right {
			if d := math.Abs(v - results[0].right[c]); d > 0.05 {
				t.Errorf("%s: %s %.3f differs from the host's %.3f by more than 0.05", r.name, c, v, results[0].right[c])
			}
		}
	}
}

// nsLayout is one deployment layout of the job and gaptrace.
type nsLayout struct {
	name string
	// run starts the job and gaptrace; it returns gaptrace and the
	// pids expected in the gaps: as gaptrace's namespace numbers the
	// job, and as the job's own does (0: the same).
	run func(t *testing.T, environ []string, dir, truth string) (gt *gtProc, pid func() (int, int))
	// afterExit, when set, runs once gaptrace has exited: it ends a
	// job that outlives gaptrace.
	afterExit func(t *testing.T)
}

// runLayout runs one layout and scores gaptrace's gaps against the job's
// truth: the pids as the layout expects them and the share of each
// injected cause labelled right.
func runLayout(t *testing.T, l nsLayout) layoutResult {
	t.Helper()
	dir := t.TempDir()
	truth := filepath.Join(dir, "truth.jsonl")
	gt, pids := l.run(t, env(t), dir, truth)
	code := gt.wait(t, 3*time.Minute)
	if l.afterExit != nil {
		l.afterExit(t)
	}
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, gt.stdout, gt.stderr)
	}
	// The trainer may outlive gaptrace (compose): its truth is
	// complete once it exits.
	deadline := time.Now().Add(time.Minute)
	var tr *accuracy.Truth
	for {
		var err error
		tr, err = accuracy.ReadTruth(truth)
		if err == nil && tr.Ended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("truth never completed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gaps, err := accuracy.ReadGaps(filepath.Join(dir, "gaps.jsonl"))
	if err != nil || len(gaps) == 0 {
		t.Fatalf("no gaps (%v)\nstderr:\n%s", err, gt.stderr)
	}
	res := layoutResult{name: l.name, right: map[string]float64{}}
	res.pidOK = checkGapPids(gaps, tr.PID, pids)
	if res.pidOK != "" {
		t.Error(res.pidOK)
	}
	// Score what was traced: from a second after the first gap
	// (probes attached, step pattern found) to the last gap.
	first, last := gaps[0].Start, gaps[0].End
	for _, g := range gaps {
		first, last = min(first, g.Start), max(last, g.End)
	}
	tr.TracedFrom(first + int64(time.Second))
	tr.Until(last)
	res.scored = len(tr.Steps)
	if res.scored < 40 {
		t.Fatalf("only %d steps scored", res.scored)
	}
	ev := accuracy.Evaluate(tr, gaps, int64(time.Millisecond))
	for _, c := range []string{"io.read", "sleep"} {
		cr := ev.Causes[c]
		if cr == nil || cr.TruthNS == 0 {
			t.Errorf("%s: no injected stalls scored", c)
			continue
		}
		res.right[c] = rightShare(tr, gaps, c)
		if res.right[c] < 0.85 {
			t.Errorf("%s: %.3f of its stalls' time labelled %s (confusion %v)", c, res.right[c], c, cr.Confusion)
		}
	}
	var sum struct {
		Steps int64 `json:"steps"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "summary.json")); err == nil {
		json.Unmarshal(b, &sum) //nolint:errcheck // checked below
	}
	res.steps = sum.Steps
	if sum.Steps == 0 {
		t.Errorf("summary counts no steps")
	}
	return res
}

// rightShare is the share of cause's injected stall time that the gaps
// covering it attribute to it, through each gap's breakdown: a stall that
// runs right after another one shares its gap, whose breakdown gives each
// its time. On a loaded machine, cpu.contention up to the stall's own
// run-queue wait (the job's schedstat) counts as right.
func rightShare(tr *accuracy.Truth, gaps []correlate.Gap, cause string) float64 {
	var right, total float64
	for _, s := range tr.Stalls {
		if s.Cause != cause {
			continue
		}
		total += float64(s.Len())
		// The trainer measured how long it waited for a CPU during the
		// stall (schedstat): that much cpu.contention is the machine's
		// load, truly, not a wrong label.
		contended := s.RunDelayNS
		for _, g := range gaps {
			ov := min(s.End, g.End) - max(s.Start, g.Start)
			if ov <= 0 {
				continue
			}
			ok := g.Breakdown[correlate.Cause(cause)]
			if c := min(g.Breakdown[correlate.CauseCPUContention], contended); c > 0 {
				ok += c
				contended -= c
			}
			right += float64(min(ov, ok))
		}
	}
	if total == 0 {
		return 0
	}
	return min(1, right/total)
}

// checkGapPids returns "" when every gap names the job as expected: by the
// pid gaptrace's namespace gives it and, when the job's own namespace
// numbers it differently, that number as workload.ns_pid.
func checkGapPids(gaps []correlate.Gap, truthPID int, pids func() (int, int)) string {
	wantPID, wantNS := truthPID, 0
	if pids != nil {
		wantPID, wantNS = pids()
	}
	for _, g := range gaps {
		ns := 0
		if g.Workload != nil {
			ns = int(g.Workload.NSPID)
		}
		if pids == nil && wantPID != truthPID {
			continue
		}
		if pids == nil && ns != 0 {
			// run: the job may sit in a namespace below gaptrace's
			// (nested); its own pid is then the truth's.
			if ns != truthPID {
				return fmt.Sprintf("gap of pid %d: ns_pid %d, want the job's own %d", g.PID, ns, truthPID)
			}
			continue
		}
		if pids == nil {
			if int(g.PID) != truthPID {
				return fmt.Sprintf("gap of pid %d, want the job's %d", g.PID, truthPID)
			}
			continue
		}
		if int(g.PID) != wantPID || ns != wantNS {
			return fmt.Sprintf("gap names pid %d (ns_pid %d), want pid %d (ns_pid %d)", g.PID, ns, wantPID, wantNS)
		}
	}
	return ""
}

var stepsRe = regexp.MustCompile(`steps (\d+)`)

// TestAttachToRunningCUDAJob attaches to a trainer that mapped libcuda
// before gaptrace started, as a user does to a job already training.
func TestAttachToRunningCUDAJob(t *testing.T) {
	need(t)
	nvml := filepath.Join(simgpuDir, "libnvidia-ml.so.1")
	// untilExit attaches to a job started with many steps, lets it run
	// 100 steps past gaptrace's first traced second (attaching takes
	// seconds on a loaded machine: a job of a fixed length raced it) and
	// interrupts it; simtrain ends its step and exits, and gaptrace with it.
	untilExit := func(t *testing.T, job *exec.Cmd, truth string, flags ...string) {
		sum := filepath.Join(t.TempDir(), "summary.json")
		gt := start(t, env(t), append([]string{"attach", "--pid", strconv.Itoa(job.Process.Pid), "--live", "off", "--nvml-lib", nvml, "--summary-json", sum}, flags...)...)
		const traced = 100
		stopAfterTracedSteps(t, gt, truth, job.Process.Pid, traced)
		code := gt.wait(t, 3*time.Minute)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, gt.stderr)
		}
		// gaptrace ended because the job did, not before.
		if err := job.Process.Signal(syscall.Signal(0)); err == nil {
			if st, _ := proc.State(job.Process.Pid); st != 'Z' {
				t.Fatalf("gaptrace exited while the job still runs\n%s", gt.stderr)
			}
		}
		job.Wait() //nolint:errcheck // exit status is the truth's business
		tr, err := accuracy.ReadTruth(truth)
		if err != nil || !tr.Ended {
			t.Fatalf("truth: %v", err)
		}
		s, b := readSummary(t, sum)
		// The job had started before gaptrace, so its first steps are not
		// seen; the ones after the first traced second all are.
		if s.Steps < traced*9/10 || s.ByCause["io.read"] == 0 {
			t.Errorf("summary after attaching to a running job: %s\nstderr:\n%s", b, gt.stderr)
		}
		if !strings.Contains(gt.stderr.String(), "traced process exited") {
			t.Errorf("no word of the job's exit:\n%s", gt.stderr)
		}
	}
	t.Run("until the job exits", func(t *testing.T) {
		job, truth := startCUDAJob(t, 100000)
		untilExit(t, job, truth)
	})
	// PyTorch on CUDA 13: torch.cuda.synchronize() is cudaDeviceSynchronize,
	// which the runtime implements with cuCtxSynchronize_v2. lite sees
	// nothing but syncs and copies (this job copies nothing, as a launch-bound
	// PyTorch loop), so without that probe it saw no step.
	t.Run("a job that syncs with cuCtxSynchronize_v2, lite", func(t *testing.T) {
		job, truth := startCUDAJob(t, 100000, "--ctx-sync-v2", "--batch-bytes", "0")
		untilExit(t, job, truth, "--probes", "lite")
	})
	// A launcher (torchrun, a shell script) that starts the job after
	// gaptrace attached and exits at once: the job is reparented away from
	// it, so only the tracer's own record of the fork says it was the
	// launcher's. gaptrace follows it to its end and sees all its steps.
	t.Run("a launcher that starts the job and exits", func(t *testing.T) {
		dir := t.TempDir()
		truth, goFile, sum := filepath.Join(dir, "truth.jsonl"), filepath.Join(dir, "go"), filepath.Join(dir, "summary.json")
		argv := simtrain("--steps", "150", "--kernel-us", "2000", "--stall", "io.read:every=4:ms=20", "--truth", truth, "--quiet")
		script := fmt.Sprintf(`while [ ! -e %q ]; do sleep 0.05; done; "$@" </dev/null >/dev/null 2>&1 &`, goFile)
		launcher := exec.Command("sh", append([]string{"-c", script, "launcher"}, argv...)...)
		launcher.Env = env(t)
		if err := launcher.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { launcher.Process.Kill(); launcher.Wait() }) //nolint:errcheck // has exited
		gt := start(t, env(t), "attach", "--pid", strconv.Itoa(launcher.Process.Pid), "--live", "off", "--nvml-lib", nvml,
			"--cuda-wait", "2m", "--summary-json", sum)
		gt.waitFor(t, regexp.MustCompile(`msg=tracing`), 2*time.Minute)
		if err := os.WriteFile(goFile, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if code := gt.wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("exit %d\n%s", code, gt.stderr)
		}
		tr, err := accuracy.ReadTruth(truth)
		if err != nil || !tr.Ended {
			t.Fatalf("gaptrace ended before the job did (truth: %v, ended %v)\n%s", err, tr != nil && tr.Ended, gt.stderr)
		}
		s, b := readSummary(t, sum)
		if s.Steps < int64(len(tr.Steps))*9/10 || s.ByCause["io.read"] == 0 {
			t.Errorf("summary of a job started by a launcher: %s (the job ran %d steps)\nstderr:\n%s", b, len(tr.Steps), gt.stderr)
		}
		if !strings.Contains(gt.stderr.String(), "following its descendants") {
			t.Errorf("no word of following the launcher's job:\n%s", gt.stderr)
		}
	})
	t.Run("with --duration", func(t *testing.T) {
		job, _ := startCUDAJob(t, 100000)
		began := time.Now()
		gt := start(t, env(t), "attach", "--pid", strconv.Itoa(job.Process.Pid), "--duration", "4s", "--live", "off", "--nvml-lib", nvml)
		code := gt.wait(t, 2*time.Minute)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, gt.stderr)
		}
		if el := time.Since(began); el < 4*time.Second {
			t.Errorf("stopped after %v, before --duration 4s", el)
		}
		if m := stepsRe.FindStringSubmatch(gt.stdout.String()); len(m) < 2 || m[1] == "0" {
			t.Errorf("no steps traced in 4 s:\n%s", gt.stdout)
		}
		if st, err := proc.State(job.Process.Pid); err != nil || st == 'Z' {
			t.Errorf("the job did not survive gaptrace's --duration (state %c, %v)", st, err)
		}
	})
}

// startCUDAJob starts simtrain for steps steps with an io.read stall every
// fourth and returns it, and its truth file, once it has mapped libcuda.
func startCUDAJob(t *testing.T, steps int, extra ...string) (*exec.Cmd, string) {
	t.Helper()
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	argv := simtrain(append([]string{"--steps", strconv.Itoa(steps), "--kernel-us", "2000", "--stall", "io.read:every=4:ms=20", "--truth", truth, "--quiet"}, extra...)...)
	job := exec.Command(argv[0], argv[1:]...)
	job.Env = env(t)
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Process.Kill(); job.Wait() }) //nolint:errcheck // may have exited
	deadline := time.Now().Add(30 * time.Second)
	for {
		if libs, err := proc.Libraries(job.Process.Pid, "libcuda.so"); err == nil && len(libs["libcuda.so"]) > 0 {
			return job, truth
		}
		if time.Now().After(deadline) {
			t.Fatal("simtrain never mapped libcuda")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKill9WithLiveView kills gaptrace while its live view is drawn on a
// terminal: the job keeps writing to that terminal and finishes.
func TestKill9WithLiveView(t *testing.T) {
	need(t)
	status := filepath.Join(t.TempDir(), "status")
	// The job prints a line per step, slowly, long after gaptrace dies.
	job := fmt.Sprintf(`%s --steps 300 --kernel-us 2000 --quiet & pid=$!; i=0; while kill -0 $pid 2>/dev/null; do i=$((i+1)); echo "job line $i"; sleep 0.1; done; wait $pid; st=$?; echo "job exit $st"; echo $st > %s`,
		strings.Join(simtrain(), " "), status)
	// A shell leads the terminal's session, as for a user: gaptrace is
	// its foreground job, not the session leader whose death hangs up the
	// terminal.
	// 40 rows: room for the frame and the job's lines.
	cmd, out, _ := onTerminal(t, 40, "sh", "-c", `"$@"; echo gaptrace-gone; sleep 300`, "sh",
		gaptraceBin, "run", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"), "--", "sh", "-c", job)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "idle by cause") {
		if time.Now().After(deadline) {
			t.Fatalf("no live view drawn:\n%q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "\x1b[1;") {
		t.Errorf("the live view set no scroll region:\n%q", out.String())
	}
	gt := 0
	for _, d := range proc.Descendants(cmd.Process.Pid) {
		if cl, _ := proc.Cmdline(d); strings.HasPrefix(cl, gaptraceBin+" run") {
			gt = d
			break
		}
	}
	if gt == 0 {
		t.Fatal("gaptrace not found under the shell")
	}
	killedAt := len(out.String())
	if err := syscall.Kill(gt, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(out.String(), "gaptrace-gone") {
		if time.Now().After(deadline) {
			t.Fatalf("gaptrace did not die:\n%q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	deadline = time.Now().Add(2 * time.Minute)
	var b []byte
	for time.Now().Before(deadline) {
		var err error
		if b, err = os.ReadFile(status); err == nil && len(b) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := strings.TrimSpace(string(b)); got != "0" {
		t.Fatalf("job status %q after gaptrace was killed, want 0\n%q", got, out.String())
	}
	// The job's last words reach the terminal after its status file: wait
	// for them as a user watching the screen would.
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String()[killedAt:], "job exit 0") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	after := out.String()[killedAt:]
	if !strings.Contains(after, "job line") || !strings.Contains(after, "job exit 0") {
		t.Errorf("the job's output stopped reaching the terminal after gaptrace died:\n%q", after)
	}
}

// stepSummary is what the attach tests read of --summary-json.
type stepSummary struct {
	Steps   int64            `json:"steps"`
	ByCause map[string]int64 `json:"by_cause"`
}

// readSummary reads a --summary-json file; b is its text, for messages.
func readSummary(t *testing.T, path string) (s stepSummary, b []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s, b
}
