package accuracy

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// TestPythonRoutedSteps traces testdata/simgpu/pyroute.py under `gaptrace
// run` in each probe set: a ctypes loop whose data picks its kernels, 3 to
// 24 a step among five functions and a last of its own, on a compute
// stream that waits for the batch's copy stream through an event, the loss
// read with a stream sync, a 20 ms sleep every 7th step and an uncached
// read every 11th. Its launch counts spread over an eightfold range, so no
// count is the step's. Every iteration must be one step: the count within
// ±2% and nine in ten iterations holding exactly one step end. Lite runs
// once more where NVML cannot be opened (the driver refuses its init, as
// in a container without the NVIDIA runtime's permissions): no GPU window
// comes, and lite must not wait for GPM's verdict on the loop's first
// syncs (it lost the first 160 iterations to fixed windows).
func TestPythonRoutedSteps(t *testing.T) {
	s := need(t)
	for _, c := range []struct {
		name, probes string
		env          []string
	}{
		{correlate.ProbesFull, correlate.ProbesFull, nil},
		{correlate.ProbesLite, correlate.ProbesLite, nil},
		{correlate.ProbesAuto, correlate.ProbesAuto, nil},
		{"lite without NVML", correlate.ProbesLite, []string{"SIMGPU_NVML_INIT_RETURN=4"}}, // NVML_ERROR_NO_PERMISSION
	} {
		probes := c.probes
		t.Run(c.name, func(t *testing.T) {
			name := "pyroute"
			if c.env != nil {
				name = "pyroute-no-nvml"
			}
			dir := runPython(t, s, name, "pyroute.py", probes, func(dir string) []string {
				return []string{"--steps", "300", "--kmin", "3", "--kmax", "24", "--style", "stream", "--seed", "2", "--data-dir", dir}
			}, c.env...)
			if c.env != nil {
				log, err := os.ReadFile(filepath.Join(dir, "gaptrace.log"))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(log), "GPU's own view unavailable") {
					t.Fatalf("NVML was opened after all (log in %s)", dir)
				}
			}
			iters, err := readJSONL[pyrouteStep](filepath.Join(dir, "truth.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			iters = slices.DeleteFunc(iters, func(r pyrouteStep) bool { return r.Type != "step" })
			spans, err := readStepSpans(filepath.Join(dir, "spans.jsonl"), func(name string) bool { return name == "train.step" })
			if err != nil {
				t.Fatal(err)
			}
			if len(iters) != 300 {
				t.Fatalf("the job recorded %d iterations, want 300 (outputs in %s)", len(iters), dir)
			}
			var ends []int64
			steps, windows := 0, 0
			for _, sp := range spans {
				if sp.Window {
					windows++
					continue
				}
				steps++
				ends = append(ends, sp.End)
			}
			sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
			exact := 0
			for i, it := range iters {
				next := it.End + 1
				if i+1 < len(iters) {
					next = iters[i+1].Start
				}
				a := sort.Search(len(ends), func(k int) bool { return ends[k] > it.Start })
				b := sort.Search(len(ends), func(k int) bool { return ends[k] >= next })
				if b-a == 1 {
					exact++
				}
			}
			t.Logf("%s: %d steps and %d fixed windows for %d iterations, %d with exactly one step end", c.name, steps, windows, len(iters), exact)
			if d := steps - len(iters); d*50 > len(iters) || -d*50 > len(iters) {
				t.Errorf("%d steps for %d iterations: off by more than 2%% (outputs in %s)", steps, len(iters), dir)
			}
			if exact*10 < len(iters)*9 {
				t.Errorf("only %d of %d iterations hold exactly one step end (outputs in %s)", exact, len(iters), dir)
			}
		})
	}
}

// pyrouteStep is a line of pyroute.py's truth (Unix ns).
type pyrouteStep struct {
	Type  string `json:"type"`
	Start int64  `json:"start_unix_nano"`
	End   int64  `json:"end_unix_nano"`
}
