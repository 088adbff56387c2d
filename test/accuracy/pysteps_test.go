package accuracy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// TestPythonStepSources traces testdata/simgpu/pysteps.py's loops under
// `gaptrace run` in each probe set and under `gaptrace attach --pid` a few
// iterations into the run: a CUDA-graph loop with a background saver
// thread, a checkpoint copying each tensor to the host (the loss read's
// direction), an evaluation phase, a loss read every 10th iteration, and
// four micro-batches an iteration. Every iteration must be one step (the
// count within ±2% of the job's own, nine in ten iterations holding one
// step end), and where the loop reads its loss every iteration under full
// probes, steps must come from that call site (the summary's step_clock).
// The graph loop runs once more under full with host stalls (CPU work, a
// sleep, a pageable copy): the work pattern, clocked by the saver
// thread's copies, counted 150 steps for its 300 iterations.
func TestPythonStepSources(t *testing.T) {
	s := need(t)
	const steps, attachSteps = 300, 1000
	for _, job := range []string{"graph", "ckpt", "eval", "logevery", "accum"} {
		for _, mode := range []string{correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto, "attach"} {
			t.Run(job+"/"+mode, func(t *testing.T) {
				name := "pysteps-" + job
				var dir string
				if mode == "attach" {
					// Attached once 10 iterations ran: half the run at
					// least must be seen.
					dir = attachPython(t, s, name, "pysteps.py", correlate.ProbesFull, "--job", job, "--steps", fmt.Sprint(attachSteps))
					checkPyStepsSeen(t, dir, job+"/"+mode, attachSteps, 0.5)
				} else {
					dir = runPython(t, s, name, "pysteps.py", mode, func(string) []string {
						return []string{"--job", job, "--steps", fmt.Sprint(steps)}
					})
					if job == "accum" && mode == correlate.ProbesLite {
						// Lite sees no launch and no framework marker: it
						// counts the micro-batches, four an iteration, as
						// the recordings of accumulation do (microSteps).
						checkMicroSteps(t, dir, 4*steps)
						return
					}
					checkPySteps(t, dir, job+"/"+mode, steps)
				}
				clock := readStepClock(t, dir)
				t.Logf("%s/%s: step_clock %+v", job, mode, clock)
				if clock.Source == "" || clock.Steps == 0 {
					t.Errorf("summary names no step clock (outputs in %s)", dir)
				}
				if mode == correlate.ProbesFull && (job == "graph" || job == "ckpt") && clock.Source != "call_site" {
					t.Errorf("steps counted by %s (%s), want the loss read's call site (outputs in %s)", clock.Source, clock.Site, dir)
				}
			})
		}
	}
	t.Run("graph-stalls/full", func(t *testing.T) {
		dir := runPython(t, s, "pysteps-graph-stalls", "pysteps.py", correlate.ProbesFull, func(string) []string {
			return []string{"--job", "graph", "--stalls", "--steps", fmt.Sprint(steps)}
		})
		checkPySteps(t, dir, "graph-stalls/full", steps)
		if clock := readStepClock(t, dir); clock.Source != "call_site" {
			t.Errorf("steps counted by %s (%s), want the loss read's call site (outputs in %s)", clock.Source, clock.Site, dir)
		}
	})
}

// TestPythonEvalAttach attaches `gaptrace attach --pid` to the evaluation
// loop of pysteps.py once it has run 24 iterations, as the 25th's
// evaluation begins: the loss read every iteration (30 launches), every
// 25th iteration an evaluation of 25 batches (10 launches and a read
// each). Attached during an evaluation, the first call site the stream
// shows recurring is the evaluation's; it kept the steps (on a GPU, 0.80
// of an eval loop's iterations counted), and the training's site, whose
// iterations launch three times as much, must take over once the stream
// holds both. Every iteration seen must be one step, as in
// TestPythonRoutedSteps (the evaluation's batches ended as steps before
// the first training iteration are within the 2%), and the summary must
// name the loss read's site.
func TestPythonEvalAttach(t *testing.T) {
	s := need(t)
	const steps = 1500
	dir := attachPythonAfter(t, s, "pysteps-eval-mid", "pysteps.py", correlate.ProbesFull, 24,
		"--job", "eval", "--eval-batches", "25", "--steps", fmt.Sprint(steps))
	checkPyStepsSeen(t, dir, "eval-mid/attach", steps, 0.5)
	clock := readStepClock(t, dir)
	t.Logf("step_clock %+v", clock)
	line := lineOf(t, filepath.Join(s.root, "testdata", "simgpu", "pysteps.py"), "loop.read()  # loss.item(), the step site")
	if site := fmt.Sprintf("pysteps.py:%d main", line); clock.Source != "call_site" || clock.Site != site {
		t.Errorf("steps counted by %s (%s), want the loss read's call site %s (outputs in %s)", clock.Source, clock.Site, site, dir)
	}
}

// TestPythonDeclaredStepSite traces the checkpoint loop with --step-at at
// the loss read's line: every step ends there, and the summary says so.
func TestPythonDeclaredStepSite(t *testing.T) {
	s := need(t)
	line := lineOf(t, filepath.Join(s.root, "testdata", "simgpu", "pysteps.py"), "loop.read()  # loss.item(), the step site")
	site := fmt.Sprintf("pysteps.py:%d", line)
	dir := runPython(t, s, "pysteps-declared", "pysteps.py", correlate.ProbesLite, func(string) []string {
		return []string{"--job", "ckpt", "--steps", "200"}
	}, "GAPTRACE_STEP_AT="+site)
	checkPySteps(t, dir, "declared", 200)
	clock := readStepClock(t, dir)
	if clock.Source != "declared" || clock.Site != fmt.Sprintf("pysteps.py:%d main", line) {
		t.Fatalf("step_clock %+v, want declared at %s main (outputs in %s)", clock, site, dir)
	}
}

// checkMicroSteps holds the run's step count (summary.json) to want
// within 2%.
func checkMicroSteps(t *testing.T, dir string, want int) {
	t.Helper()
	c := readStepClock(t, dir)
	if d := int(c.Steps) - want; d*50 > want || -d*50 > want {
		t.Errorf("%d steps, want %d micro-batches within 2%% (outputs in %s)", c.Steps, want, dir)
	}
}

// lineOf is the line number at which text (possibly spanning lines)
// begins in file.
func lineOf(t *testing.T, file, text string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(text))
	if i < 0 || bytes.Count(b, []byte(text)) != 1 {
		t.Fatalf("%s holds %q %d times, want once", file, text, bytes.Count(b, []byte(text)))
	}
	return bytes.Count(b[:i], []byte("\n")) + 1
}

func readStepClock(t *testing.T, dir string) correlate.StepClock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		StepClock *correlate.StepClock `json:"step_clock"`
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("%s/summary.json: %v", dir, err)
	}
	if sum.StepClock == nil {
		return correlate.StepClock{}
	}
	return *sum.StepClock
}

// attachPython starts a Python trainer on the simulated GPU and attaches
// `gaptrace attach --pid` once it has run 10 iterations; the outputs go
// where runPython puts them (name-attach).
func attachPython(t *testing.T, s setup, name, script, probes string, args ...string) string {
	t.Helper()
	return attachPythonAfter(t, s, name, script, probes, 10, args...)
}

// attachPythonAfter is attachPython, attaching once the trainer has run
// after iterations.
func attachPythonAfter(t *testing.T, s setup, name, script, probes string, after int, args ...string) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	dir := filepath.Join(s.root, accuracyOutRoot, "runs", name+"-attach")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	sim := filepath.Join(dir, "simgpu")
	if err := os.MkdirAll(sim, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range testutil.SimFiles {
		if err := copyFile(filepath.Join(s.sim, f), filepath.Join(sim, f)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	truth := filepath.Join(dir, "truth.jsonl")
	job := exec.CommandContext(ctx, py, append([]string{filepath.Join(s.root, "testdata", "simgpu", script), "--lib", sim, "--truth", truth}, args...)...)
	job.Dir = dir
	job.Env = append(cleanEnv(), "SIMGPU_DIR="+dir)
	var jobOut bytes.Buffer
	job.Stdout, job.Stderr = &jobOut, &jobOut
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = job.Process.Kill() }()
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(truth)
		if bytes.Count(b, []byte(`"type": "step"`)) >= after {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job ran no %d iterations in a minute: %s", after, jobOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	argv := []string{"attach", "--pid", fmt.Sprint(job.Process.Pid), "--probes", probes, "--live", "off", "--log-level", "debug",
		"--gaps-out", filepath.Join(dir, "gaps.jsonl"), "--spans-out", filepath.Join(dir, "spans.jsonl"),
		"--summary-json", filepath.Join(dir, "summary.json"), "--nvml-lib", filepath.Join(sim, "libnvidia-ml.so.1"),
		"--record", filepath.Join(dir, "run.rec.gz")}
	cmd := exec.CommandContext(ctx, s.bin, argv...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "SIMGPU_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(filepath.Join(dir, "gaptrace.log"), out, 0o644); werr != nil {
		t.Log(werr)
	}
	if err != nil {
		t.Fatalf("gaptrace attach: %v (log in %s)", err, dir)
	}
	if err := job.Wait(); err != nil {
		t.Fatalf("the job: %v: %s", err, jobOut.String())
	}
	return dir
}
