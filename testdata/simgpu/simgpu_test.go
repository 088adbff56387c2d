// Package simgpu_test checks the simulated GPU (libcuda, libnccl and the
// simtrain trainer) against its own contract: the libraries export the
// symbols the tracer attaches to, simtrain's ground truth is well formed,
// every injected stall really happens for the requested time on the
// recorded thread, and the shared timeline the simulated NVML reads agrees
// with the busy intervals simtrain records.
//
// The libraries are built once per test binary with the directory's
// Makefile; the tests skip only when gcc is missing. Each simtrain run gets
// its own SIMGPU_DIR so that concurrent test binaries never share a
// timeline.
package simgpu_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var (
	buildDir string
	buildErr error
	dataDir  string // shared so the I/O stall data file is written once
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "simgpu-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create temp dir:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	buildDir = filepath.Join(tmp, "build")
	dataDir = filepath.Join(tmp, "data")
	if _, err := exec.LookPath("gcc"); err != nil {
		buildErr = fmt.Errorf("gcc not found: %w", err)
	} else {
		cmd := exec.Command("make", "-s", "OUT="+buildDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "make failed: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

func needBuild(t *testing.T) {
	t.Helper()
	if buildErr != nil {
		t.Skipf("simulated GPU not built: %v", buildErr)
	}
}

// record is one line of simtrain's truth file; fields are a union over types.
type record struct {
	Type             string           `json:"type"`
	Clock            string           `json:"clock"`
	Pid              int              `json:"pid"`
	Tid              int              `json:"tid"`
	Step             int              `json:"step"`
	Cause            string           `json:"cause"`
	Start            uint64           `json:"start"`
	End              uint64           `json:"end"`
	Kind             string           `json:"kind"`
	What             string           `json:"what"`
	API              string           `json:"api"`
	Op               string           `json:"op"`
	Count            int64            `json:"count"`
	Bytes            int64            `json:"bytes"`
	Stream           uint64           `json:"stream"`
	Ms               int64            `json:"ms"`
	Steps            int              `json:"steps"`
	Workers          []int            `json:"workers"`
	Worker           int              `json:"worker"`
	ServerPid        int              `json:"server_pid"`
	Via              string           `json:"via"`
	RunDelayNs       uint64           `json:"run_delay_ns"`
	At               string           `json:"at"`
	WorkerRunDelayNs uint64           `json:"worker_run_delay_ns"`
	KernelUs         int64            `json:"kernel_us"`
	CopyAPI          string           `json:"copy_api"`
	Stalls           []map[string]any `json:"stalls"`
	RealMinus        *uint64          `json:"realtime_minus_monotonic_ns"`
	Path             string           `json:"path"`
	Direction        string           `json:"direction"`
	Tensors          int              `json:"tensors"`
}

type truth struct {
	meta    record
	steps   []record
	stalls  []record
	busy    []record
	calls   []record
	end     *record
	timeDir string
}

// runSimtrain runs simtrain with args plus --truth and --quiet and returns
// the parsed truth. It fails the test if simtrain fails.
func runSimtrain(t *testing.T, args ...string) truth {
	t.Helper()
	needBuild(t)
	dir := t.TempDir()
	tf := filepath.Join(dir, "truth.jsonl")
	args = append([]string{"--truth", tf, "--quiet", "--data-dir", dataDir}, args...)
	cmd := exec.Command(filepath.Join(buildDir, "simtrain"), args...)
	cmd.Env = append(os.Environ(), "SIMGPU_DIR="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("simtrain %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	tr := parseTruth(t, tf)
	tr.timeDir = dir
	return tr
}

func parseTruth(t *testing.T, path string) truth {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open truth: %v", err)
	}
	defer f.Close()
	var tr truth
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		var r record
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("truth line %d is not JSON: %v: %s", line, err, sc.Text())
		}
		if line == 1 && r.Type != "meta" {
			t.Fatalf("truth line 1 has type %q, want meta", r.Type)
		}
		if tr.end != nil {
			t.Fatalf("truth line %d follows the end record", line)
		}
		switch r.Type {
		case "meta":
			if line != 1 {
				t.Fatalf("meta record on line %d", line)
			}
			tr.meta = r
		case "step":
			tr.steps = append(tr.steps, r)
		case "stall":
			tr.stalls = append(tr.stalls, r)
		case "busy":
			tr.busy = append(tr.busy, r)
		case "call":
			tr.calls = append(tr.calls, r)
		case "end":
			tr.end = &r
		default:
			t.Fatalf("truth line %d: unknown type %q", line, r.Type)
		}
		if r.Type != "meta" && r.Type != "end" && r.End < r.Start {
			t.Fatalf("truth line %d ends before it starts: %s", line, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read truth: %v", err)
	}
	if tr.end == nil {
		t.Fatalf("truth has no end record")
	}
	return tr
}

func (tr truth) callsOf(what string) []record {
	var v []record
	for _, c := range tr.calls {
		if c.What == what {
			v = append(v, c)
		}
	}
	return v
}

func TestTruthWellFormed(t *testing.T) {
	const steps, k, streams, coll = 20, 4, 2, 2
	tr := runSimtrain(t, "--steps", strconv.Itoa(steps), "--kernels-per-step", strconv.Itoa(k),
		"--kernel-us", "100", "--launch-gap-us", "10", "--streams", strconv.Itoa(streams),
		"--collectives", strconv.Itoa(coll))

	m := tr.meta
	if m.Clock != "monotonic" || m.Pid == 0 || m.Tid != m.Pid || m.RealMinus == nil || m.KernelUs != 100 ||
		m.CopyAPI != "cuMemcpyHtoDAsync_v2" {
		t.Errorf("bad meta record: %+v", m)
	}
	if len(tr.steps) != steps || tr.end.Steps != steps {
		t.Fatalf("got %d step records, end says %d, want %d", len(tr.steps), tr.end.Steps, steps)
	}
	for i, s := range tr.steps {
		if s.Step != i+1 {
			t.Errorf("step record %d has step %d", i, s.Step)
		}
		if i > 0 && s.Start < tr.steps[i-1].End {
			t.Errorf("step %d starts before step %d ends", s.Step, i)
		}
	}
	if got := len(tr.callsOf("sync")); got != steps*streams {
		t.Errorf("got %d sync calls, want %d", got, steps*streams)
	}
	cs := tr.callsOf("collective")
	if len(cs) != steps*coll {
		t.Errorf("got %d collective calls, want %d", len(cs), steps*coll)
	}
	for _, c := range cs {
		if c.API != "ncclAllReduce" || c.Op != "AllReduce" || c.Count <= 0 || c.Bytes != 4*c.Count {
			t.Errorf("bad collective record %+v", c)
			break
		}
	}
	lc := tr.callsOf("launch_count")
	if len(lc) != steps {
		t.Fatalf("got %d launch_count records, want %d", len(lc), steps)
	}
	for _, c := range lc {
		if c.Count != k || c.API != "cuLaunchKernel" {
			t.Errorf("bad launch_count record %+v", c)
		}
	}
	// Every step's compute ran: the kernel busy time inside the run is at
	// least steps*k*kernel_us (two streams may overlap, so not more).
	kinds := map[string]uint64{}
	for _, b := range tr.busy {
		kinds[b.Kind] += b.End - b.Start
	}
	if kinds["kernel"] < steps*k*100_000/streams || kinds["collective"] == 0 || kinds["copy"] == 0 {
		t.Errorf("busy totals by kind look wrong: %v", kinds)
	}
	if len(tr.stalls) != 0 {
		t.Errorf("got %d stalls without --stall", len(tr.stalls))
	}
	// Without --copy-api the batch copy is not recorded as a call.
	if n := len(tr.callsOf("copy")); n != 0 {
		t.Errorf("got %d copy calls without --copy-api", n)
	}
}

// TestCopyAPIs checks --copy-api: all takes every asynchronous copy and
// memset entry point in turn, one per step, steps alternate between the
// streams, and each record carries the bytes a tracer should decode.
func TestCopyAPIs(t *testing.T) {
	apis := []string{
		"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync", "cuMemcpyDtoDAsync_v2",
		"cuMemcpyPeerAsync", "cuMemcpy2DAsync_v2", "cuMemcpy3DAsync_v2", "cuMemsetD8Async",
		"cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
		"cuMemsetD2D32Async",
	}
	// 1 MiB: 64 rows of 16 KiB; the 2D calls cover half of each row.
	const b = 1 << 20
	want := map[string]int64{
		"cuMemcpy2DAsync_v2": b / 2, "cuMemcpy3DAsync_v2": 0,
		"cuMemsetD2D8Async": b / 2, "cuMemsetD2D16Async": b / 2, "cuMemsetD2D32Async": b / 2,
	}
	steps := len(apis) + 2
	tr := runSimtrain(t, "--steps", strconv.Itoa(steps), "--kernels-per-step", "1", "--kernel-us", "20",
		"--streams", "2", "--batch-bytes", strconv.Itoa(b), "--copy-api", "all")
	if tr.meta.CopyAPI != "all" {
		t.Errorf("meta copy_api %q, want all", tr.meta.CopyAPI)
	}
	cs := tr.callsOf("copy")
	if len(cs) != steps {
		t.Fatalf("got %d copy calls, want %d", len(cs), steps)
	}
	for i, c := range cs {
		api := apis[i%len(apis)]
		bytes, ok := want[api]
		if !ok {
			bytes = b
		}
		if c.API != api || c.Step != i+1 || c.Bytes != bytes || (c.Stream == 0) != (i%2 == 0) || c.Tid != tr.meta.Tid {
			t.Errorf("copy call %d: %+v; want %s at step %d, %d bytes, stream %d of 2", i, c, api, i+1, bytes, i%2)
		}
	}

	// One entry point: every step, the same size; odd sizes round down to
	// whole elements (at least one).
	tr = runSimtrain(t, "--steps", "2", "--kernels-per-step", "1", "--kernel-us", "20",
		"--batch-bytes", "7", "--copy-api", "cuMemsetD32Async")
	cs = tr.callsOf("copy")
	if tr.meta.CopyAPI != "cuMemsetD32Async" || len(cs) != 2 || cs[0].API != "cuMemsetD32Async" || cs[0].Bytes != 4 || cs[1].Bytes != 4 {
		t.Errorf("--copy-api cuMemsetD32Async --batch-bytes 7: meta %q, calls %+v", tr.meta.CopyAPI, cs)
	}
}

func TestLaunchAPIs(t *testing.T) {
	for _, api := range []string{"ex", "cooperative", "graph", "ptsz", "mix"} {
		t.Run(api, func(t *testing.T) {
			tr := runSimtrain(t, "--steps", "3", "--kernels-per-step", "5", "--kernel-us", "20",
				"--launch-api", api, "--ctx-sync")
			lc := tr.callsOf("launch_count")
			if len(lc) != 3 || lc[0].Count != 5 {
				t.Fatalf("launch counts %+v", lc)
			}
			if api == "mix" && lc[0].API != "mix" {
				t.Errorf("launch api %q, want mix", lc[0].API)
			}
			if n := len(tr.callsOf("sync")); n != 3 {
				t.Errorf("got %d cuCtxSynchronize calls, want 3", n)
			}
		})
	}
}

func TestBadArguments(t *testing.T) {
	needBuild(t)
	for _, args := range [][]string{
		{"--steps", "1", "--stall", "disk:every=1:ms=1"},
		{"--steps", "1", "--stall", "sleep:every=0:ms=1"},
		{"--steps", "1", "--stall", "sleep:ms=1"},
		{"--steps", "1", "--stall", "sleep:every=1:ms=1:at=after"},
		{"--steps", "1", "--stall", "comm:every=1:ms=1:at=ahead"},
		{"--steps", "1", "--stall", "cuda.memcpy:every=1:ms=1:at=ahead"},
		{"--steps", "1", "--stall", "sleep:every=1:ms=1:via=poll"},
		{"--steps", "1", "--stall", "net:every=1:ms=1:via=select"},
		{"--steps", "x"},
		{"--steps", "1", "--copy-api", "cuMemcpy2D_v2"},
		{"--bogus"},
		{},
	} {
		cmd := exec.Command(filepath.Join(buildDir, "simtrain"), args...)
		cmd.Env = append(os.Environ(), "SIMGPU_DIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "simtrain: ") {
			t.Errorf("simtrain %v: err %v, output %q; want exit 2 with a message", args, err, out)
		}
	}
}
