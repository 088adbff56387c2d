package accuracy

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// TestPythonOptimizerSteps traces testdata/simgpu/pyoptim.py, a gradient
// accumulation loop (four micro-batches, each ending in a loss read) that
// enters the simulated libtorch's record_function_enter_new as PyTorch
// does: "Optimizer.step#SGD.step" once per optimizer step, and regions
// that are no step marker around it. In every probe set and under
// `gaptrace attach --pid` mid-run, a step is one optimizer step (within
// ±2% of the job's count, nine in ten holding one step end) and the
// summary says the framework counted them, at the marker's name. The loss
// read's call site alone counts four steps an optimizer step. Once more
// under full with the profiler's ProfilerStep#N marker instead.
func TestPythonOptimizerSteps(t *testing.T) {
	s := need(t)
	const steps, attachSteps = 200, 600
	lib := filepath.Join(s.sim, "libsimtorch.so")
	for _, mode := range []string{correlate.ProbesFull, correlate.ProbesAuto, correlate.ProbesLite, "attach"} {
		t.Run(mode, func(t *testing.T) {
			var dir string
			if mode == "attach" {
				dir = attachPython(t, s, "pyoptim", "pyoptim.py", correlate.ProbesFull, "--torch", lib, "--steps", fmt.Sprint(attachSteps))
				checkPyStepsSeen(t, dir, "pyoptim/"+mode, attachSteps, 0.5)
			} else {
				dir = runPython(t, s, "pyoptim", "pyoptim.py", mode, func(string) []string {
					return []string{"--torch", lib, "--steps", fmt.Sprint(steps)}
				})
				checkPySteps(t, dir, "pyoptim/"+mode, steps)
			}
			clock := readStepClock(t, dir)
			t.Logf("pyoptim/%s: step_clock %+v", mode, clock)
			if clock.Source != "framework" || clock.Site != "Optimizer.step#SGD.step" {
				t.Errorf("step_clock %+v, want the framework at Optimizer.step#SGD.step (outputs in %s)", clock, dir)
			}
		})
	}
	// A CUDA-graph loop: markers in its 4 warm-up and capture
	// iterations only, then replays with a loss read each: the call site
	// takes the steps over.
	t.Run("capture/full", func(t *testing.T) {
		dir := runPython(t, s, "pyoptim-capture", "pyoptim.py", correlate.ProbesFull, func(string) []string {
			return []string{"--torch", lib, "--capture", "4", "--steps", "300"}
		})
		checkPySteps(t, dir, "pyoptim-capture/full", 300)
		if clock := readStepClock(t, dir); clock.Source != "call_site" {
			t.Errorf("step_clock %+v, want the loss read's call site (outputs in %s)", clock, dir)
		}
	})
	// The same with a graph's static inputs filled by blocking copies
	// before each replay, and none in the warm-up: the markers come with
	// no sited call between them, then each replay makes three.
	t.Run("capture-copies/full", func(t *testing.T) {
		dir := runPython(t, s, "pyoptim-capture-copies", "pyoptim.py", correlate.ProbesFull, func(string) []string {
			return []string{"--torch", lib, "--capture", "4", "--replay-copies", "2", "--steps", "300"}
		})
		checkPySteps(t, dir, "pyoptim-capture-copies/full", 300)
	})
	// The profiler's step marker, where no optimizer step comes: its
	// names ("ProfilerStep#12") fit std::string's inline buffer.
	t.Run("profiler/full", func(t *testing.T) {
		dir := runPython(t, s, "pyoptim-profiler", "pyoptim.py", correlate.ProbesFull, func(string) []string {
			return []string{"--torch", lib, "--marker", "profiler", "--steps", fmt.Sprint(steps)}
		})
		checkPySteps(t, dir, "pyoptim-profiler/full", steps)
		if clock := readStepClock(t, dir); clock.Source != "framework" || clock.Site != "ProfilerStep#N" {
			t.Errorf("step_clock %+v, want the framework at ProfilerStep#N (outputs in %s)", clock, dir)
		}
	})
}
