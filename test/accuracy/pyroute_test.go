package accuracy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

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
			checkPySteps(t, dir, c.name, 300)
		})
	}
}

// TestPythonEvalSteps traces testdata/simgpu/pyeval.py under `gaptrace run`
// in each probe set: a ctypes loop of synchronous copies (cuMemcpyHtoD of
// the batch from pageable memory, cuMemcpyDtoH of the loss), with a
// context sync and a metric read every 5th step, that evaluates 60
// batches of another size every 40 steps, at the end of a step. The
// synchronous batch copy clocks the steps (async copies alone did: full
// counted 13 steps an iteration by the marked launches, lite 40 of 300);
// an evaluation pauses the loop's clock and must not replace it (its
// batches would be steps, and the loop's first after it lost). Every
// iteration must be one step, as in TestPythonRoutedSteps.
func TestPythonEvalSteps(t *testing.T) {
	s := need(t)
	for _, probes := range []string{correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto} {
		t.Run(probes, func(t *testing.T) {
			dir := runPython(t, s, "pyeval", "pyeval.py", probes, func(string) []string {
				return []string{"--steps", "300", "--eval-every", "40", "--eval-batches", "60"}
			})
			checkPySteps(t, dir, probes, 300)
		})
	}
}

// TestPythonPrefetchSteps traces testdata/simgpu/pyprefetch.py under
// `gaptrace run` in each probe set: a ctypes loop on one thread that copies
// the next batch on a copy stream every iteration and reads its loss only
// every 10th. The sync flushes that iteration's launches early, so counted
// by flush the step holding it launched twice the others, as an
// accumulation loop's optimizer step does: full grouped ten iterations
// into one step (29 steps for 300 iterations). The loop loads libcuda
// with ctypes and starts at once: its probes must attach within an
// iteration or two. Every iteration must be one step, as in
// TestPythonRoutedSteps; with --accum 4 (and the loss read once an
// iteration) under full, every iteration of four micro-batches is.
func TestPythonPrefetchSteps(t *testing.T) {
	s := need(t)
	for _, c := range []struct {
		name, probes    string
		accum, logEvery string
	}{
		{correlate.ProbesFull, correlate.ProbesFull, "1", "10"},
		{correlate.ProbesLite, correlate.ProbesLite, "1", "10"},
		{correlate.ProbesAuto, correlate.ProbesAuto, "1", "10"},
		{"full accumulating", correlate.ProbesFull, "4", "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, steps := "pyprefetch", "300"
			if c.accum != "1" {
				name, steps = "pyprefetch-accum", "100"
			}
			dir := runPython(t, s, name, "pyprefetch.py", c.probes, func(dir string) []string {
				return []string{"--steps", steps, "--log-every", c.logEvery, "--accum", c.accum, "--data-dir", dir}
			})
			want := 300
			if c.accum != "1" {
				want = 100
			}
			checkPySteps(t, dir, c.name, want)
		})
	}
}

// checkPySteps holds the steps gaptrace wrote to dir/spans.jsonl to the
// iterations a Python trainer recorded in dir/truth.jsonl (want of them)
// that began once the libcuda probes were in (gaptrace.log: the loop may
// start before they are, on a loaded machine): the count within ±2%,
// nine in ten iterations holding exactly one step end.
func checkPySteps(t *testing.T, dir, name string, want int) {
	t.Helper()
	checkPyStepsSeen(t, dir, name, want, 0.9)
}

// checkPyStepsSeen is checkPySteps where only the share seen of the
// iterations must have begun once the probes were in (attach mid-run).
func checkPyStepsSeen(t *testing.T, dir, name string, want int, seen float64) {
	t.Helper()
	iters, err := readJSONL[pyStep](filepath.Join(dir, "truth.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	iters = slices.DeleteFunc(iters, func(r pyStep) bool { return r.Type != "step" })
	spans, err := readStepSpans(filepath.Join(dir, "spans.jsonl"), func(span string) bool { return span == "train.step" })
	if err != nil {
		t.Fatal(err)
	}
	if len(iters) != want {
		t.Fatalf("the job recorded %d iterations, want %d (outputs in %s)", len(iters), want, dir)
	}
	metas, err := readJSONL[struct {
		Type string `json:"type"`
		PID  int    `json:"pid"`
	}](filepath.Join(dir, "truth.jsonl"))
	if err != nil || len(metas) == 0 || metas[0].Type != "meta" {
		t.Fatalf("no meta record first in %s/truth.jsonl (%v)", dir, err)
	}
	log, err := os.ReadFile(filepath.Join(dir, "gaptrace.log"))
	if err != nil {
		t.Fatal(err)
	}
	at, _ := attachTime(strings.Split(string(log), "\n"), metas[0].PID)
	if at == 0 {
		t.Fatalf("no uprobes attached to pid %d (outputs in %s)", metas[0].PID, dir)
	}
	before := len(iters)
	iters = slices.DeleteFunc(iters, func(r pyStep) bool { return r.Start < at })
	before -= len(iters)
	if float64(len(iters)) < seen*float64(want) {
		t.Fatalf("%d of %d iterations began before the probes were in (outputs in %s)", before, want, dir)
	}
	var ends []int64
	steps, windows := 0, 0
	for _, sp := range spans {
		if sp.Window {
			windows++
			continue
		}
		if sp.End <= iters[0].Start {
			continue // the end of an iteration that began unseen
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
	t.Logf("%s: %d steps and %d fixed windows for the %d iterations that began once the probes were in (%d before), %d with exactly one step end",
		name, steps, windows, len(iters), before, exact)
	if d := steps - len(iters); d*50 > len(iters) || -d*50 > len(iters) {
		t.Errorf("%d steps for %d iterations: off by more than 2%% (outputs in %s)", steps, len(iters), dir)
	}
	if exact*10 < len(iters)*9 {
		t.Errorf("only %d of %d iterations hold exactly one step end (outputs in %s)", exact, len(iters), dir)
	}
}

// pyStep is a line of a Python trainer's truth (Unix ns).
type pyStep struct {
	Type  string `json:"type"`
	Start int64  `json:"start_unix_nano"`
	End   int64  `json:"end_unix_nano"`
}

// TestPythonPrefetchIdle traces pyprefetch.py reading its loss every 10th
// iteration through an event and saving a checkpoint every 25th, and holds
// the gaps to the idle the simulated GPU's own timeline recorded (the
// kernels it ran, reported to the script). The host prepares each batch
// with the previous iterations' kernels still queued: the GPU idles only
// where the queue runs dry, which an event sync (it names no stream) and
// the checkpoint's first copy reveal. Gaps must be idle (nine in ten of
// their ns), cover nine in ten ns of the idle stretches of 1 ms or more,
// and each checkpoint must be one io.write gap, the last one too, which
// the job exits after (no later work ends its gap): a window's idle that a
// still-open checkpoint gap or the job's start held was put in the sleeps
// of a queue that never ran dry (precision 0.76), and the event sync
// drained no stream, so the log iterations' idle came from the windows.
func TestPythonPrefetchIdle(t *testing.T) {
	s := need(t)
	for _, probes := range []string{correlate.ProbesFull, correlate.ProbesAuto} {
		t.Run(probes, func(t *testing.T) {
			dir := runPython(t, s, "pyprefetch-idle", "pyprefetch.py", probes, func(dir string) []string {
				return []string{"--steps", "100", "--log-every", "10", "--ckpt-every", "25", "--data-dir", dir}
			})
			checkPyIdle(t, dir, probes, 4)
		})
	}
}

// TestPythonUploadAtExit traces pyprefetch.py uploading its model after
// the loop (20 chunks over TCP, each acknowledged 10 ms late) and exiting:
// the GPU idles through the upload, which must be one net gap over nine in
// ten of it, ending with the upload, not with the interpreter's exit (a
// gap still open at exit was dropped: the job's last 200 ms went
// unreported).
func TestPythonUploadAtExit(t *testing.T) {
	s := need(t)
	for _, probes := range []string{correlate.ProbesFull, correlate.ProbesLite} {
		t.Run(probes, func(t *testing.T) {
			dir := runPython(t, s, "pyprefetch-upload", "pyprefetch.py", probes, func(dir string) []string {
				return []string{"--steps", "40", "--log-every", "10", "--upload-at-exit", "200", "--data-dir", dir}
			})
			recs, gaps := readPyRun(t, dir)
			var up Interval
			for _, r := range recs {
				if r.Type == "stall" && r.Cause == "net" {
					up = Interval{r.Start, r.End}
				}
			}
			if up.Len() <= 0 {
				t.Fatalf("the job recorded no upload (outputs in %s)", dir)
			}
			var got []string
			var covered int64
			for _, g := range gaps {
				if g.Kind != correlate.GapIdle || g.End <= up.Start || g.Start >= up.End {
					continue
				}
				got = append(got, fmt.Sprintf("%s %v ending %v after the upload", g.Cause, time.Duration(g.Duration), time.Duration(g.End-up.End)))
				if g.Cause == correlate.CauseNet && g.End-up.End < int64(5*time.Millisecond) {
					covered += Intersect(NewSet(up), NewSet(Interval{g.Start, g.End})).Total()
				}
			}
			share := Ratio{Num: covered, Den: up.Len()}
			t.Logf("%s: upload of %v: gaps %v, net over %s of it", probes, time.Duration(up.Len()), got, share)
			if len(got) != 1 || share.Value() < 0.9 {
				t.Errorf("upload at exit: gaps %v, net over %s of it; want one net gap over ≥ 0.9 ending with it (outputs in %s)", got, share, dir)
			}
		})
	}
}

// pyTruth is a record of a Python trainer's truth file: steps, stalls and
// the simulated GPU's busy intervals, in Unix ns.
type pyTruth struct {
	Type  string `json:"type"`
	Cause string `json:"cause"`
	Start int64  `json:"start_unix_nano"`
	End   int64  `json:"end_unix_nano"`
}

// readPyRun reads a Python trainer's truth and the gaps gaptrace wrote
// for it in dir.
func readPyRun(t *testing.T, dir string) ([]pyTruth, []correlate.Gap) {
	t.Helper()
	recs, err := readJSONL[pyTruth](filepath.Join(dir, "truth.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	gaps, err := readJSONL[correlate.Gap](filepath.Join(dir, "gaps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return recs, gaps
}

// checkPyIdle scores dir/gaps.jsonl against the idle of dir/truth.jsonl
// over the job's iterations, and wants ckpts checkpoints, each one
// io.write gap.
func checkPyIdle(t *testing.T, dir, name string, ckpts int) {
	t.Helper()
	recs, gaps := readPyRun(t, dir)
	var busy, stalls []Interval
	run := Interval{Start: -1}
	for _, r := range recs {
		switch r.Type {
		case "busy":
			busy = append(busy, Interval{r.Start, r.End})
		case "stall":
			stalls = append(stalls, Interval{r.Start, r.End})
		case "step":
			if run.Start < 0 {
				run.Start = r.Start
			}
			run.End = r.End
		}
	}
	if len(busy) == 0 || run.Start < 0 {
		t.Fatalf("no kernels or no iterations in the truth (outputs in %s)", dir)
	}
	if len(stalls) != ckpts {
		t.Fatalf("the job recorded %d checkpoints, want %d (outputs in %s)", len(stalls), ckpts, dir)
	}
	idle := Complement(NewSet(busy...), run)
	var long []Interval
	for _, iv := range idle {
		if iv.Len() >= int64(time.Millisecond) {
			long = append(long, iv)
		}
	}
	var ivs []Interval
	for _, g := range gaps {
		if g.Kind == correlate.GapIdle {
			ivs = append(ivs, Interval{max(g.Start, run.Start), min(g.End, run.End)})
		}
	}
	reported := NewSet(ivs...)
	precision := Ratio{Num: Intersect(reported, idle).Total(), Den: reported.Total()}
	recall := Ratio{Num: Intersect(reported, NewSet(long...)).Total(), Den: NewSet(long...).Total()}
	t.Logf("%s: %d gaps, precision %s, recall %s over %d idle stretches of 1 ms or more", name, len(ivs), precision, recall, len(long))
	if precision.Value() < 0.9 {
		t.Errorf("precision %s: gaps were reported where the GPU ran kernels (outputs in %s)", precision, dir)
	}
	if recall.Value() < 0.9 {
		t.Errorf("recall %s of the idle stretches of 1 ms or more (outputs in %s)", recall, dir)
	}
	for i, st := range stalls {
		stIdle := Intersect(idle, NewSet(st))
		var in []correlate.Gap
		var covered int64
		for _, g := range gaps {
			// A gap mostly outside the checkpoint (the next iteration's
			// sleep, split from it at the fsync's end) is not part of it.
			if o := min(g.End, st.End) - max(g.Start, st.Start); g.Kind == correlate.GapIdle && 2*o > g.End-g.Start {
				in = append(in, g)
				if g.Cause == correlate.CauseIOWrite {
					covered += Intersect(stIdle, NewSet(Interval{g.Start, g.End})).Total()
				}
			}
		}
		share := Ratio{Num: covered, Den: stIdle.Total()}
		if len(in) != 1 || in[0].Cause != correlate.CauseIOWrite || in[0].Evidence.Episode == nil ||
			in[0].Evidence.Episode.Kind != "checkpoint" || share.Value() < 0.9 {
			var got []string
			for _, g := range in {
				got = append(got, string(g.Cause)+" "+time.Duration(g.Duration).String())
			}
			t.Errorf("checkpoint %d: gaps %v, io.write over %s of its idle; want one checkpoint gap over ≥ 0.9 (outputs in %s)", i, got, share, dir)
		}
	}
}
