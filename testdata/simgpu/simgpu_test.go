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
	"slices"
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

// TestStallCauses injects every cause and checks that each stall lasted M
// ms on the main thread: none shorter than 80% of M, and the median within
// ±20% of M once overshoot explained by run-queue wait (recorded from
// schedstat for the main thread and the serving worker) is excused. On a
// loaded machine a thread whose blocking call finished may wait
// milliseconds for a CPU; that time is real (the truth interval includes
// it) but it is the machine's load, not the simulator.
func TestStallCauses(t *testing.T) {
	const ms, steps, every = 40, 6, 1
	causes := []string{
		"io.read", "io.write", "net", "net:via=poll", "loader.wait", "loader.wait.io", "loader.wait.cpu",
		"comm", "cuda.memcpy", "cuda.alloc", "cpu", "cpu.contention", "sleep",
	}
	for _, spec := range causes {
		cause, opts, _ := strings.Cut(spec, ":")
		if opts != "" {
			opts = ":" + opts
		}
		t.Run(spec, func(t *testing.T) {
			if cause == "cpu.contention" && os.Geteuid() != 0 {
				t.Skip("cpu.contention needs SCHED_FIFO: run as root")
			}
			tr := runSimtrain(t, "--steps", strconv.Itoa(steps), "--kernels-per-step", "2",
				"--kernel-us", "50", "--stall", fmt.Sprintf("%s:every=%d:ms=%d%s", cause, every, ms, opts))
			if len(tr.stalls) != steps/every {
				t.Fatalf("got %d stalls, want %d", len(tr.stalls), steps/every)
			}
			var durs []float64
			for i, s := range tr.stalls {
				if s.Cause != cause || s.Step != every*(i+1) || s.Tid != tr.meta.Tid || s.Ms != ms {
					t.Errorf("bad stall record %+v (main tid %d)", s, tr.meta.Tid)
				}
				d := float64(s.End-s.Start) / 1e6
				eff := d
				if cause != "cpu.contention" {
					waited := float64(s.RunDelayNs+s.WorkerRunDelayNs) / 1e6
					eff -= min(waited, max(0, d-ms))
				}
				durs = append(durs, eff)
				// Too long only past what the run queue explains. A stall
				// that ends in a write's fsync ends when the disk says:
				// the median below judges its length.
				disk := cause == "io.write"
				if d < 0.8*ms || eff > 3*ms && !disk {
					t.Errorf("stall %d of %s lasted %.1f ms (%.1f ms not waiting for a CPU), want about %d", i, cause, d, eff, ms)
				}
				// The stall precedes its step (comm: it is the end of its step).
				st := tr.steps[s.Step-1]
				if cause == "comm" {
					if s.End != st.End || s.Start < st.Start {
						t.Errorf("comm stall [%d,%d] not at the end of step [%d,%d]", s.Start, s.End, st.Start, st.End)
					}
				} else if s.End > st.Start {
					t.Errorf("stall ends at %d after its step starts at %d", s.End, st.Start)
				}
			}
			slices.Sort(durs)
			if med := durs[len(durs)/2]; med < 0.8*ms || med > 1.2*ms {
				t.Errorf("median %s stall %.1f ms, want %d ±20%%: %v", cause, med, ms, durs)
			}
			checkCauseEvidence(t, spec, tr)
		})
	}
}

func checkCauseEvidence(t *testing.T, cause string, tr truth) {
	t.Helper()
	switch cause {
	case "io.read", "io.write":
		for _, s := range tr.stalls {
			if s.Bytes <= 0 {
				t.Errorf("%s stall moved no bytes: %+v", cause, s)
			}
		}
	case "net", "net:via=poll":
		want := "recv"
		if cause == "net:via=poll" {
			want = "poll"
		}
		if tr.stalls[0].ServerPid <= 0 || tr.stalls[0].Via != want {
			t.Errorf("net stall names no server pid or not via %s: %+v", want, tr.stalls[0])
		}
	case "loader.wait", "loader.wait.io", "loader.wait.cpu":
		for _, s := range tr.stalls {
			if !slices.Contains(tr.meta.Workers, s.Worker) {
				t.Errorf("stall names worker %d, not one of %v", s.Worker, tr.meta.Workers)
			}
		}
	case "comm":
		// No --collectives: each stalled step still runs exactly one.
		if n := len(tr.callsOf("collective")); n != len(tr.stalls) {
			t.Errorf("got %d collectives, want %d", n, len(tr.stalls))
		}
	case "cuda.memcpy":
		if n := len(tr.callsOf("memcpy")); n != len(tr.stalls) {
			t.Errorf("got %d memcpy calls, want %d", n, len(tr.stalls))
		}
	case "cuda.alloc":
		if a, f := len(tr.callsOf("alloc")), len(tr.callsOf("free")); a != len(tr.stalls) || f != a {
			t.Errorf("got %d alloc and %d free calls, want %d each", a, f, len(tr.stalls))
		}
	case "cpu.contention":
		// The kernel's own accounting: the main thread waited on a run
		// queue for (almost) the whole stall.
		for _, s := range tr.stalls {
			if d := s.End - s.Start; s.RunDelayNs < d*7/10 {
				t.Errorf("run-queue delay %.1f ms in a %.1f ms contention stall", float64(s.RunDelayNs)/1e6, float64(d)/1e6)
			}
		}
	}
}

// TestPageableAndCheckpointStalls: an async copy from pageable memory keeps
// the host for its bytes at SIMGPU_PAGEABLE_GBPS, one from pinned memory
// (the batch) does not; a checkpoint writes its tensors to a file; each
// truth record names the cause gaptrace should report.
func TestPageableAndCheckpointStalls(t *testing.T) {
	t.Setenv("SIMGPU_PAGEABLE_GBPS", "3")
	const ms, steps = 20, 4
	tr := runSimtrain(t, "--steps", strconv.Itoa(steps), "--kernels-per-step", "2", "--kernel-us", "50",
		"--batch-bytes", strconv.Itoa(64<<20), "--batch-copies", "1",
		"--stall", fmt.Sprintf("pageable:every=1:ms=%d", ms), "--stall", fmt.Sprintf("checkpoint:every=2:ms=%d", ms))
	var pageable, ckpt []record
	for _, s := range tr.stalls {
		switch s.Kind {
		case "pageable":
			pageable = append(pageable, s)
		case "checkpoint":
			ckpt = append(ckpt, s)
		default:
			t.Errorf("stall of kind %q: %+v", s.Kind, s)
		}
	}
	if len(pageable) != steps || len(ckpt) != steps/2 {
		t.Fatalf("%d pageable and %d checkpoint stalls, want %d and %d", len(pageable), len(ckpt), steps, steps/2)
	}
	for _, s := range pageable {
		d := float64(s.End-s.Start) / 1e6
		if s.Cause != "cuda.memcpy" || s.Direction != "htod" || s.Bytes != ms*3e6 || d < 0.8*ms || d > 3*ms {
			t.Errorf("pageable stall %+v lasted %.1f ms, want cuda.memcpy, htod, %d bytes, about %d ms", s, d, ms*3000000, ms)
		}
	}
	for _, s := range ckpt {
		d := float64(s.End-s.Start) / 1e6
		if s.Cause != "io.write" || s.Tensors != 12 || s.Bytes != 12*(2<<20) || !strings.HasSuffix(s.Path, "/simtrain-state.pt") || d < 0.8*ms {
			t.Errorf("checkpoint stall %+v lasted %.1f ms, want io.write, 12 tensors to simtrain-state.pt, at least %d ms", s, d, ms)
		}
	}
	// The batch comes from pinned memory: its 64 MiB copy returns at once
	// (staged at 3 GB/s it would keep the host 22 ms).
	var batch int
	for _, c := range tr.callsOf("copy") {
		if c.Bytes == 64<<20 {
			batch++
			if d := c.End - c.Start; d > 2e6 {
				t.Errorf("pinned batch copy kept the host %.1f ms", float64(d)/1e6)
			}
		}
	}
	if batch != steps {
		t.Errorf("%d batch copies, want %d", batch, steps)
	}
}

// TestCombinedStalls checks that several --stall flags apply in order.
func TestCombinedStalls(t *testing.T) {
	tr := runSimtrain(t, "--steps", "6", "--kernel-us", "50",
		"--stall", "sleep:every=2:ms=10", "--stall", "cpu:every=3:ms=10")
	var got []string
	for _, s := range tr.stalls {
		got = append(got, fmt.Sprintf("%d:%s", s.Step, s.Cause))
	}
	want := []string{"2:sleep", "3:cpu", "4:sleep", "6:sleep", "6:cpu"}
	if !slices.Equal(got, want) {
		t.Errorf("stalls %v, want %v", got, want)
	}
}

// TestStallAhead checks at=ahead: the stall runs inside its step, after
// every launch and before the sync, while the GPU drains the queue and then
// idles with no sync to tell the host.
func TestStallAhead(t *testing.T) {
	const kernels, kernelUS, ms = 4, 2000, 20
	tr := runSimtrain(t, "--steps", "10", "--kernels-per-step", fmt.Sprint(kernels),
		"--kernel-us", fmt.Sprint(kernelUS), "--launch-gap-us", "0",
		"--stall", fmt.Sprintf("sleep:every=5:ms=%d:at=ahead", ms), "--stall", "cpu:every=4:ms=5")
	if len(tr.meta.Stalls) != 2 || tr.meta.Stalls[0]["at"] != "ahead" || tr.meta.Stalls[1]["at"] != nil {
		t.Errorf("meta stalls %v: want at=ahead on the first only", tr.meta.Stalls)
	}
	var ahead []record
	for _, s := range tr.stalls {
		switch s.Cause {
		case "sleep":
			if s.At != "ahead" {
				t.Errorf("sleep stall without at=ahead: %+v", s)
			}
			ahead = append(ahead, s)
		case "cpu":
			if s.At != "" {
				t.Errorf("before-step stall carries at=%q", s.At)
			}
		}
	}
	if len(ahead) != 2 || ahead[0].Step != 5 || ahead[1].Step != 10 {
		t.Fatalf("ahead stalls %+v, want steps 5 and 10", ahead)
	}
	stepOf := map[int]record{}
	for _, st := range tr.steps {
		stepOf[st.Step] = st
	}
	launchEnd, syncStart := map[int]uint64{}, map[int]uint64{}
	for _, c := range tr.calls {
		switch c.What {
		case "launch_count":
			launchEnd[c.Step] = c.End
		case "sync":
			syncStart[c.Step] = c.Start
		}
	}
	for _, s := range ahead {
		st := stepOf[s.Step]
		if s.Start < launchEnd[s.Step] || s.End > syncStart[s.Step] || s.Start < st.Start || s.End > st.End {
			t.Errorf("ahead stall [%d,%d] not between the launches (end %d) and the sync (start %d) of step [%d,%d]",
				s.Start, s.End, launchEnd[s.Step], syncStart[s.Step], st.Start, st.End)
		}
		// The queue holds ~8 ms of kernels when the stall begins: the GPU
		// stays busy into the stall, then idles until it ends.
		var busyEnd uint64
		for _, b := range tr.busy {
			if b.Kind == "kernel" && b.Start < s.End && b.End > s.Start && b.End > busyEnd {
				busyEnd = b.End
			}
		}
		queued := uint64(kernels * kernelUS * 1000)
		if busyEnd <= s.Start || busyEnd > s.Start+queued {
			t.Errorf("stall [%d,%d]: kernels run until %d, want within %d ns of its start", s.Start, s.End, busyEnd, queued)
		}
		if idle := float64(s.End-busyEnd) / 1e6; idle < float64(ms)-float64(queued)/1e6-2 {
			t.Errorf("stall [%d,%d]: GPU idle only %.1f ms of it", s.Start, s.End, idle)
		}
	}
}

type dump struct {
	BusyNs  uint64 `json:"busy_ns"`
	MemUsed uint64 `json:"mem_used"`
	Pids    int    `json:"pids"`
}

func dumpTimeline(t *testing.T, dir string, from, to uint64, mask uint32) dump {
	t.Helper()
	cmd := exec.Command(filepath.Join(buildDir, "simtrain"), "--dump-timeline",
		fmt.Sprintf("%d,%d,%d", from, to, mask))
	cmd.Env = append(os.Environ(), "SIMGPU_DIR="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dump timeline: %v", err)
	}
	var d dump
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("dump timeline output %q: %v", out, err)
	}
	return d
}

// unionNs is the length of the union of the busy records of the given
// kinds, clipped to [from, to).
func unionNs(recs []record, kinds []string, from, to uint64) uint64 {
	type iv struct{ s, e uint64 }
	var v []iv
	for _, r := range recs {
		if slices.Contains(kinds, r.Kind) && r.End > from && r.Start < to {
			v = append(v, iv{max(r.Start, from), min(r.End, to)})
		}
	}
	slices.SortFunc(v, func(a, b iv) int { return int(int64(a.s - b.s)) })
	var total, cs, ce uint64
	for i, x := range v {
		if i == 0 || x.s > ce {
			total += ce - cs
			cs, ce = x.s, x.e
		} else if x.e > ce {
			ce = x.e
		}
	}
	return total + ce - cs
}

// TestTimelineMatchesTruth checks that the shared timeline, read the way the
// simulated NVML reads it, holds exactly the busy time simtrain recorded, and
// that it forgets the trainer once it exited.
func TestTimelineMatchesTruth(t *testing.T) {
	tr := runSimtrain(t, "--steps", "40", "--kernels-per-step", "6", "--kernel-us", "80",
		"--launch-gap-us", "120", "--streams", "2", "--collectives", "1",
		"--stall", "sleep:every=10:ms=15")
	from, to := tr.steps[0].Start, tr.steps[len(tr.steps)-1].End
	cases := []struct {
		mask  uint32
		kinds []string
	}{
		{1 | 2, []string{"kernel", "collective"}}, // what utilization.gpu counts
		{1, []string{"kernel"}},
		{4, []string{"copy"}},
	}
	for _, c := range cases {
		want := unionNs(tr.busy, c.kinds, from, to)
		// Also a window ending mid-run, to exercise clipping.
		mid := from + (to-from)/3
		wantMid := unionNs(tr.busy, c.kinds, from, mid)
		got := dumpTimeline(t, tr.timeDir, from, to, c.mask)
		gotMid := dumpTimeline(t, tr.timeDir, from, mid, c.mask)
		if got.BusyNs != want || gotMid.BusyNs != wantMid || want == 0 {
			t.Errorf("mask %d: timeline busy %d / %d ns, truth %d / %d ns", c.mask, got.BusyNs, gotMid.BusyNs, want, wantMid)
		}
		if frac := float64(want) / float64(to-from); frac <= 0 || frac >= 1 {
			t.Errorf("mask %d: busy fraction %.3f out of (0,1)", c.mask, frac)
		}
		if got.Pids != 0 || got.MemUsed != 0 {
			t.Errorf("exited trainer still registered: %+v", got)
		}
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

// nmSymbols returns the dynamic symbols defined by lib: name -> (type, address).
func nmSymbols(t *testing.T, lib string) map[string][2]string {
	t.Helper()
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	if err != nil {
		t.Skipf("nm -D %s: %v", lib, err)
	}
	syms := map[string][2]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 {
			syms[f[2]] = [2]string{f[1], f[0]}
		}
	}
	return syms
}

func TestNCCLWeakAliases(t *testing.T) {
	needBuild(t)
	syms := nmSymbols(t, filepath.Join(buildDir, "libnccl.so.2"))
	for _, name := range []string{
		"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send", "Recv",
		"GroupStart", "GroupEnd", "CommInitRank", "CommDestroy", "CommCount", "CommUserRank",
		"CommGetAsyncError", "GetVersion", "GetUniqueId",
	} {
		pub, priv := syms["nccl"+name], syms["pnccl"+name]
		if pub[0] != "W" || priv[0] != "T" || pub[1] != priv[1] {
			t.Errorf("nccl%s %v and pnccl%s %v: want a weak alias at the same address", name, pub, name, priv)
		}
	}
}

// TestCUDAExports checks that every driver entry point the tracer probes is
// a real function of its own: a folded or aliased entry point would make
// one call hit two uprobes.
func TestCUDAExports(t *testing.T) {
	needBuild(t)
	syms := nmSymbols(t, filepath.Join(buildDir, "libcuda.so.1"))
	want := []string{
		"cuInit", "cuDeviceGet", "cuDeviceGetCount", "cuCtxCreate_v2", "cuDevicePrimaryCtxRetain",
		"cuCtxSetCurrent", "cuStreamCreate", "cuModuleLoadData", "cuModuleGetFunction",
		"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
		"cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel_ptsz",
		"cuGraphLaunch_ptsz", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync",
		"cuMemsetD8Async", "cuMemsetD32Async", "cuMemcpyHtoDAsync_v2_ptsz",
		"cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyAsync_ptsz", "cuMemsetD8Async_ptsz",
		"cuMemsetD32Async_ptsz", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz",
		"cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz", "cuMemcpy2DAsync_v2",
		"cuMemcpy2DAsync_v2_ptsz", "cuMemcpy3DAsync_v2", "cuMemcpy3DAsync_v2_ptsz",
		"cuMemsetD16Async", "cuMemsetD16Async_ptsz", "cuMemsetD2D8Async",
		"cuMemsetD2D8Async_ptsz", "cuMemsetD2D16Async", "cuMemsetD2D16Async_ptsz",
		"cuMemsetD2D32Async", "cuMemsetD2D32Async_ptsz", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
		"cuMemcpyDtoD_v2", "cuMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventRecord",
		"cuEventSynchronize", "cuEventCreate", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync",
		"cuMemFreeAsync", "cuGetErrorString", "cuDriverGetVersion",
	}
	addrs := map[string]string{}
	for _, name := range want {
		s, ok := syms[name]
		if !ok || s[0] != "T" {
			t.Errorf("%s: %v, want a defined function (T)", name, s)
			continue
		}
		if other, dup := addrs[s[1]]; dup {
			t.Errorf("%s and %s share address %s", name, other, s[1])
		}
		addrs[s[1]] = name
	}
}

// TestTimelineConcurrentWraparound runs tlstress: two writer processes
// append far more intervals than the ring holds while a reader checks that
// recent windows are exact and lost history never inflates a window.
func TestTimelineConcurrentWraparound(t *testing.T) {
	needBuild(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tlstress")
	if out, err := exec.Command("gcc", "-O2", "-g", "-Wall", "-Wextra", "-pthread", "-o", bin,
		"tlstress.c", "timeline.c").CombinedOutput(); err != nil {
		t.Fatalf("build tlstress: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "2", "300000")
	cmd.Env = append(os.Environ(), "SIMGPU_DIR="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tlstress: %v\n%s%s", err, out, stderr.String())
	}
	var res struct {
		Checks       int    `json:"checks"`
		Failures     int    `json:"failures"`
		OldestBusyNs uint64 `json:"oldest_busy_ns"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("tlstress output %q: %v", out, err)
	}
	if res.Checks == 0 {
		t.Errorf("reader made no concurrent checks: %s", out)
	}
	if res.OldestBusyNs >= 25000 {
		t.Errorf("oldest window still complete (%d ns): the ring never wrapped", res.OldestBusyNs)
	}
}
