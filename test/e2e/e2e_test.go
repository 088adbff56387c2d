// Package e2e runs the gaptrace binary against the simulated trainer and a
// real Jaeger and checks, through Jaeger's HTTP API, what a user would see.
//
// Inputs (set by `make test`): GAPTRACE_BIN (bin/gaptrace),
// GAPTRACE_SIMGPU (build/simgpu: simtrain and the simulated libcuda, libnccl,
// libnvidia-ml), GAPTRACE_JAEGER (build/jaeger). Without them the binary
// and the simulated GPU are built for the run and Jaeger is looked for in
// build/. The tests attach eBPF probes,
// so they need root; they skip, saying so, when not root.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
	"github.com/gaptrace/gaptrace/test/e2e/jaegertest"
)

type setup struct {
	bin, sim string
}

func need(t *testing.T) setup {
	t.Helper()
	testutil.NeedRoot(t, "attaches eBPF probes")
	return setup{bin: testutil.Gaptrace(t), sim: testutil.SimGPU(t)}
}

func TestMain(m *testing.M) { testutil.Main(m) }

// run is one `gaptrace run` of simtrain in its own directory.
type run struct {
	dir       string
	cmd       *exec.Cmd
	out       *testutil.LockedBuffer
	done      chan struct{}
	err       error
	maxRSSKiB int64
}

// start runs gaptrace with flags, tracing simtrain with simArgs. The
// simulated GPU's timeline lives in the run's own SIMGPU_DIR so that runs
// (ranks) do not share a device.
func (s setup) start(t *testing.T, name string, flags, simArgs, env []string) *run {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(filepath.Join(dir, "simgpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"run",
		"--nvml-lib", filepath.Join(s.sim, "libnvidia-ml.so.1"),
		"--cuda-lib", filepath.Join(s.sim, "libcuda.so.1"),
		"--nccl-lib", filepath.Join(s.sim, "libnccl.so.2"),
		"--gaps-out", filepath.Join(dir, "gaps.jsonl"),
		"--summary-json", filepath.Join(dir, "summary.json"),
	}
	args = append(args, flags...)
	args = append(args, "--", filepath.Join(s.sim, "simtrain"),
		"--data-dir", filepath.Join(dir, "data"), "--truth", filepath.Join(dir, "truth.jsonl"), "--quiet")
	args = append(args, simArgs...)
	r := &run{dir: dir, out: &testutil.LockedBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(s.bin, args...)
	r.cmd.Dir = dir
	r.cmd.Env = append(cleanEnv(), "SIMGPU_DIR="+filepath.Join(dir, "simgpu"))
	r.cmd.Env = append(r.cmd.Env, env...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Logf("%s: %s %s", name, s.bin, strings.Join(args, " "))
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start gaptrace: %v", err)
	}
	go func() {
		// Track the sidecar's resident memory while it runs.
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		waited := make(chan error, 1)
		go func() { waited <- r.cmd.Wait() }()
		for {
			select {
			case err := <-waited:
				r.err = err
				close(r.done)
				return
			case <-tick.C:
				if kib := rssKiB(r.cmd.Process.Pid); kib > r.maxRSSKiB {
					r.maxRSSKiB = kib
				}
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(20 * time.Second):
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
	})
	return r
}

// cleanEnv drops the developer's OTEL_* settings: each test says exactly
// where spans go.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "TORCHELASTIC_") &&
			!strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "K8S_JOB_NAME=") {
			env = append(env, kv)
		}
	}
	return env
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

func (r *run) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("gaptrace still running after %s\n%s", timeout, r.out.String())
	}
	if r.err != nil {
		t.Fatalf("gaptrace: %v\n%s", r.err, r.out.String())
	}
}

func (r *run) summary(t *testing.T) correlate.Summary {
	t.Helper()
	var s correlate.Summary
	b, err := os.ReadFile(filepath.Join(r.dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("summary.json: %v", err)
	}
	return s
}

func (r *run) gaps(t *testing.T) []correlate.Gap {
	t.Helper()
	var out []correlate.Gap
	readLines(t, filepath.Join(r.dir, "gaps.jsonl"), func(b []byte) {
		var g correlate.Gap
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatalf("gaps.jsonl: %v", err)
		}
		out = append(out, g)
	})
	return out
}

// truth is what simtrain says it did, in Unix nanoseconds.
type truth struct {
	pid    int
	server string
	steps  map[int64][2]int64
	stalls []stall
}

type stall struct {
	step       int64
	cause      string
	start, end int64
	ms         int64 // requested length
	path, peer string
}

func (r *run) truth(t *testing.T) truth {
	t.Helper()
	tr := truth{steps: map[int64][2]int64{}}
	var off int64
	readLines(t, filepath.Join(r.dir, "truth.jsonl"), func(b []byte) {
		var l struct {
			Type   string `json:"type"`
			Off    int64  `json:"realtime_minus_monotonic_ns"`
			PID    int    `json:"pid"`
			Server string `json:"server"`
			Step   int64  `json:"step"`
			Cause  string `json:"cause"`
			Start  int64  `json:"start"`
			End    int64  `json:"end"`
			Path   string `json:"path"`
			Peer   string `json:"peer"`
			MS     int64  `json:"ms"`
		}
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatalf("truth.jsonl: %v", err)
		}
		switch l.Type {
		case "meta":
			off, tr.pid, tr.server = l.Off, l.PID, l.Server
		case "step":
			tr.steps[l.Step] = [2]int64{l.Start + off, l.End + off}
		case "stall":
			tr.stalls = append(tr.stalls, stall{l.Step, l.Cause, l.Start + off, l.End + off, l.MS, l.Path, l.Peer})
		}
	})
	if off == 0 {
		t.Fatal("truth.jsonl has no meta line with the clock offset")
	}
	return tr
}

// attachedRE matches the sidecar's log line for probes on a library.
var attachedRE = regexp.MustCompile(`^time=(\S+) .*msg="uprobes attached" .*library=\S*libcuda\S* pid=(\d+) `)

// tracedSteps is how many of the trainer's steps began after gaptrace's
// probes were on its libcuda (the log line comes after the attach, so
// this may leave out a step that was traced), and that time.
func (r *run) tracedSteps(t *testing.T, tr truth) (int64, int64) {
	t.Helper()
	var at int64
	for _, line := range strings.Split(r.out.String(), "\n") {
		m := attachedRE.FindStringSubmatch(line)
		if len(m) < 3 || m[2] != strconv.Itoa(tr.pid) {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("attach log line %q: %v", line, err)
		}
		// The log's time is to the millisecond.
		at = max(at, ts.Add(time.Millisecond).UnixNano())
	}
	if at == 0 {
		t.Fatalf("no log line says the probes attached to pid %d's libcuda\n%s", tr.pid, r.out.String())
	}
	var n int64
	for _, se := range tr.steps {
		if se[0] >= at {
			n++
		}
	}
	return n, at
}

func readLines(t *testing.T, path string, fn func([]byte)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			fn(sc.Bytes())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestJaegerRanksOneTrace: two sidecars of one job (ID from the flag),
// endpoint and service name only from the standard OTEL_* variables. The
// ranks are those of a data-parallel job: they share a communicator (one
// simulated machine of two GPUs, where their all-reduces meet) and each
// step all-reduces its gradients; each sidecar sees its own rank only.
func TestJaegerRanksOneTrace(t *testing.T) {
	s := need(t)
	j := jaegertest.Start(t)
	const service, job, steps = "e2e-ranks", "e2e-job-1", 30
	machine := filepath.Join(t.TempDir(), "machine")
	if err := os.MkdirAll(machine, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLPHTTPURL(), "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_SERVICE_NAME=" + service, "SIMGPU_DIR=" + machine, "SIMGPU_DEVICES=2"}
	// --await-probes: the communicator is created at once, where a
	// trainer does so seconds in; each rank waits for its sidecar's probe.
	commID := fmt.Sprintf("e2e-ranks-%d", time.Now().UnixNano())
	var runs []*run
	for rank := range 2 {
		runs = append(runs, s.start(t, fmt.Sprintf("rank%d", rank),
			[]string{"--job-id", job, "--rank", strconv.Itoa(rank)},
			append([]string{"--steps", strconv.Itoa(steps), "--rank", strconv.Itoa(rank), "--nranks", "2",
				"--device", strconv.Itoa(rank), "--collectives", "1", "--comm-id", commID, "--await-probes", "20"},
				stallArgs...), env))
	}
	for _, r := range runs {
		r.wait(t, 3*time.Minute)
	}
	var full int
	traces, err := j.WaitTraces(service, 1000, 30*time.Second, func(ts []jaegertest.Trace) bool {
		full = 0
		for i := range ts {
			if len(ts[i].ByName("train.step")) == 1 && len(ts[i].ByNamePrefix("rank ")) == 2 {
				full++
			}
		}
		return full >= steps
	})
	if err != nil {
		t.Fatalf("%v: %d traces, %d with a root and both ranks (want %d)\n%s\n%s", err, len(traces), full, steps,
			runs[0].out.String(), runs[1].out.String())
	}
	for i := range traces {
		tr := &traces[i]
		roots, ranks := tr.ByName("train.step"), tr.ByNamePrefix("rank ")
		if len(roots) > 1 {
			t.Errorf("trace %s: %d train.step roots", tr.TraceID, len(roots))
		}
		names := map[string]int{}
		for _, rk := range ranks {
			names[rk.OperationName]++
			if len(roots) == 1 && rk.ParentID() != roots[0].SpanID {
				t.Errorf("trace %s: %s is not under train.step", tr.TraceID, rk.OperationName)
			}
		}
		for nm, c := range names {
			if c > 1 {
				t.Errorf("trace %s: %d spans named %s", tr.TraceID, c, nm)
			}
		}
		// Rank 0 emits the root: where its rank span is, the root is.
		if names["rank 0"] == 1 && len(roots) != 1 {
			t.Errorf("trace %s: rank 0 present without the train.step root", tr.TraceID)
		}
		for k := range tr.Spans {
			sp := &tr.Spans[k]
			if sp.OperationName == "gpu.idle" {
				if p := tr.Span(sp.ParentID()); p == nil || !strings.HasPrefix(p.OperationName, "rank ") {
					t.Errorf("trace %s: gpu.idle not under a rank span", tr.TraceID)
				}
			}
		}
	}
	t.Logf("%d traces, %d with a root and both ranks", len(traces), full)
}

var droppedRE = regexp.MustCompile(`spans_dropped=(\d+)`)

// TestJaegerStoppedMidRun: Jaeger dies while the trainer runs. gaptrace
// keeps tracing to the end (the gaps file covers the whole run), its memory
// stays bounded, it exits on its own, and it reports the spans it dropped.
func TestJaegerStoppedMidRun(t *testing.T) {
	s := need(t)
	j := jaegertest.Start(t)
	const service, steps = "e2e-outage", 300
	r := s.start(t, "outage", []string{"--otlp-endpoint", j.OTLPHTTPURL(), "--service-name", service},
		append([]string{"--steps", strconv.Itoa(steps)}, stallArgs...), nil)
	if _, err := j.WaitTraces(service, 1000, 60*time.Second, func(ts []jaegertest.Trace) bool { return len(ts) >= 5 }); err != nil {
		t.Fatalf("no traces before the outage: %v\n%s", err, r.out.String())
	}
	j.Stop()
	stoppedAt := time.Now().UnixNano()
	select {
	case <-r.done:
		t.Fatalf("the run ended before Jaeger was stopped; make it longer\n%s", r.out.String())
	default:
	}
	r.wait(t, 4*time.Minute)

	sum, gaps, tr := r.summary(t), r.gaps(t), r.truth(t)
	// Steps that began before the probes were on libcuda (a busy host
	// attaches a few steps into the run) cannot be counted.
	traced, at := r.tracedSteps(t, tr)
	if sum.Steps < traced {
		t.Errorf("summary: %d steps, simtrain ran %d, %d of them after the probes attached at +%v: tracing stopped with the collector",
			sum.Steps, len(tr.steps), traced, time.Duration(at-tr.steps[1][0]))
	}
	after := 0
	for _, g := range gaps {
		if g.Start > stoppedAt {
			after++
		}
	}
	if after == 0 {
		t.Errorf("no gaps after Jaeger stopped (of %d): tracing was blocked", len(gaps))
	}
	m := droppedRE.FindStringSubmatch(r.out.String())
	if len(m) < 2 || m[1] == "0" {
		t.Errorf("gaptrace did not report dropped spans\n%s", r.out.String())
	}
	// The queue holds at most a few thousand spans; the sidecar's whole
	// footprint (Go runtime, BPF maps' user-space side, NVML) stays small.
	if r.maxRSSKiB > 256<<10 {
		t.Errorf("gaptrace peaked at %d MiB resident during the outage", r.maxRSSKiB>>10)
	}
	t.Logf("outage: %d steps (%d of %d began traced), %d gaps (%d after the stop), spans dropped %s, peak RSS %d MiB",
		sum.Steps, traced, len(tr.steps), len(gaps), after, m, r.maxRSSKiB>>10)
}
