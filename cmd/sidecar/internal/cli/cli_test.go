package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/correlate"
)

// The test binary doubles as gaptrace's exec helper, as the real binary
// does, so run sessions start real commands the real way.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == proc.ExecHelperArg {
		os.Exit(proc.ExecHelper(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// fakePipe stands in for the tracing machinery.
type fakePipe struct {
	mu       sync.Mutex
	pc       PipelineConfig
	traced   []int
	cmdlines []string // of each pid at Trace time
	onTrace  func(pid int) error
	gaps     []correlate.Gap
	runs     int
	closes   int
	closedAt time.Time
	detachBy time.Time
}

func (f *fakePipe) Trace(pid int) error {
	// A process reads with an empty command line only for an instant (its
	// exec in progress, on a loaded machine): wait that out, with a deadline.
	cl, err := proc.Cmdline(pid)
	for deadline := time.Now().Add(2 * time.Second); cl == "" && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		cl, err = proc.Cmdline(pid)
	}
	if cl == "" {
		cl = fmt.Sprintf("(unreadable: %v)", err)
	}
	f.mu.Lock()
	f.traced = append(f.traced, pid)
	f.cmdlines = append(f.cmdlines, cl)
	hook := f.onTrace
	f.mu.Unlock()
	if hook != nil {
		return hook(pid)
	}
	return nil
}

func (f *fakePipe) Run(ctx context.Context) error {
	f.mu.Lock()
	f.runs++
	f.mu.Unlock()
	for _, g := range f.gaps {
		f.pc.Sink.Gap(g)
	}
	f.pc.Sink.Step(correlate.StepResult{Step: correlate.Step{PID: 1, Number: 1, Start: 0, End: int64(100 * time.Millisecond), IdleNS: int64(40 * time.Millisecond),
		ByCause: map[correlate.Cause]int64{correlate.CauseIORead: int64(40 * time.Millisecond)}}})
	<-ctx.Done()
	return nil
}

func (f *fakePipe) Stats() live.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return live.Stats{Targets: append([]int(nil), f.traced...), Drops: 2}
}

func (f *fakePipe) Close(_ context.Context, detachBy time.Time) (correlate.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes++
	f.closedAt = time.Now()
	f.detachBy = detachBy
	return correlate.Summary{WallNS: int64(time.Second), GPUIdleNS: int64(400 * time.Millisecond), Steps: 10, Gaps: int64(len(f.gaps)),
		ByCause: map[correlate.Cause]int64{correlate.CauseIORead: int64(400 * time.Millisecond)},
		Losses:  correlate.Losses{LateEvents: 7, IncompleteSteps: 1}}, nil
}

func (f *fakePipe) tracedPIDs() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.traced...)
}

type harness struct {
	pipe           *fakePipe
	stdout, stderr *syncBuffer
	deps           Deps
	env            map[string]string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{pipe: &fakePipe{}, stdout: &syncBuffer{}, stderr: &syncBuffer{}, env: map[string]string{}}
	t.Chdir(t.TempDir()) // default spans file lands here
	h.deps = Deps{
		Version: "test",
		NewPipeline: func(_ context.Context, pc PipelineConfig) (Pipeline, error) {
			h.pipe.pc = pc
			return h.pipe, nil
		},
		Privileged: func() error { return nil },
		Stdout:     h.stdout,
		Stderr:     h.stderr,
		LookupEnv:  func(k string) (string, bool) { v, ok := h.env[k]; return v, ok },
	}
	return h
}

func (h *harness) main(ctx context.Context, args ...string) int {
	return Main(ctx, args, h.deps)
}

func TestRunPassesExitCodeThrough(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{{"exit 0", 0}, {"exit 7", 7}, {"kill -TERM $$", 128 + 15}, {"kill -KILL $$", 128 + 9}} {
		h := newHarness(t)
		if got := h.main(context.Background(), "run", "--live", "off", "--", "sh", "-c", tc.script); got != tc.want {
			t.Errorf("run sh -c %q: exit %d, want %d; stderr:\n%s", tc.script, got, tc.want, h.stderr)
		}
		if h.pipe.closes != 1 {
			t.Errorf("%q: pipeline closed %d times, want once", tc.script, h.pipe.closes)
		}
	}
}

func TestRunTracesBeforeTheCommandStarts(t *testing.T) {
	h := newHarness(t)
	if code := h.main(context.Background(), "run", "--live", "off", "--", "sh", "-c", "exit 0"); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr)
	}
	if len(h.pipe.traced) != 1 {
		t.Fatalf("traced %v, want one pid", h.pipe.traced)
	}
	// At Trace time the child must still be the held exec helper, not the
	// command: nothing of the command ran untraced.
	if cl := h.pipe.cmdlines[0]; !strings.Contains(cl, proc.ExecHelperArg) {
		t.Errorf("cmdline at Trace time %q: the command was already running", cl)
	}
}

func TestRunCommandNotFound(t *testing.T) {
	h := newHarness(t)
	code := h.main(context.Background(), "run", "--", "no-such-command-gaptrace")
	if code != ExitNotFound {
		t.Errorf("exit %d, want %d", code, ExitNotFound)
	}
	if !strings.Contains(h.stderr.String(), `command "no-such-command-gaptrace": not found`) {
		t.Errorf("stderr: %s", h.stderr)
	}
	if h.pipe.pc.Config != nil || h.pipe.closes != 0 {
		t.Error("pipeline built for a command that cannot start: probes load before the failure")
	}
	code = h.main(context.Background(), "run", "--", t.TempDir())
	if code != ExitNotExecutable {
		t.Errorf("run -- DIR: exit %d, want %d\n%s", code, ExitNotExecutable, h.stderr)
	}
}

func TestRunTraceFailureDoesNotRunCommand(t *testing.T) {
	h := newHarness(t)
	marker := filepath.Join(t.TempDir(), "ran")
	h.pipe.onTrace = func(int) error { return errors.New("attach uprobe cuLaunchKernel: permission denied") }
	code := h.main(context.Background(), "run", "--", "touch", marker)
	if code != ExitFailure {
		t.Errorf("exit %d, want 1", code)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran although tracing failed")
	}
	if !strings.Contains(h.stderr.String(), "permission denied") {
		t.Errorf("stderr: %s", h.stderr)
	}
}

func TestRunWritesOutputsAndSummary(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	gaps, sum := filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "summary.json")
	h.pipe.gaps = []correlate.Gap{
		{PID: 1, TID: 2, Duration: 5e6, Cause: correlate.CauseIORead, Breakdown: map[correlate.Cause]int64{correlate.CauseIORead: 5e6}},
		{PID: 1, TID: 2, Duration: 7e6, Cause: correlate.CauseNet},
	}
	code := h.main(context.Background(), "run", "--live", "off", "--gaps-out", gaps, "--summary-json", sum, "--", "sh", "-c", "sleep 0.2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr)
	}
	b, err := os.ReadFile(gaps)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("gaps file has %d lines, want 2:\n%s", len(lines), b)
	}
	var g map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &g); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pid", "tid", "device", "step", "start_unix_nano", "end_unix_nano", "duration_ns", "cause", "breakdown", "evidence"} {
		if _, ok := g[k]; !ok {
			t.Errorf("gap line lacks %q: %s", k, lines[0])
		}
	}
	b, err = os.ReadFile(sum)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"wall_ns", "gpu_idle_ns", "by_cause", "steps", "gaps", "dropped_events",
		"late_events", "forced_events", "dropped_intervals", "incomplete_steps", "gaps_after_step"} {
		if _, ok := s[k]; !ok {
			t.Errorf("summary lacks %q: %s", k, b)
		}
	}
	if s["dropped_events"].(float64) != 2 {
		t.Errorf("dropped_events %v, want the pipeline's 2", s["dropped_events"])
	}
	// The engine's losses, zeros written too.
	if s["late_events"] != 7.0 || s["incomplete_steps"] != 1.0 || s["forced_events"] != 0.0 {
		t.Errorf("late_events %v, incomplete_steps %v, forced_events %v: want the engine's 7, 1, 0",
			s["late_events"], s["incomplete_steps"], s["forced_events"])
	}
	// The fake's one step: 100 ms with 40 ms of io.read idle.
	var wi struct {
		WhatIf map[string]struct {
			SavedNSPerStep int64   `json:"saved_ns_per_step"`
			SavedFraction  float64 `json:"saved_fraction"`
			Fix            string  `json:"fix"`
		} `json:"what_if"`
	}
	if err := json.Unmarshal(b, &wi); err != nil {
		t.Fatal(err)
	}
	if r := wi.WhatIf["io.read"]; r.SavedNSPerStep != 40e6 || r.SavedFraction != 0.4 || r.Fix == "" || len(wi.WhatIf) != 1 {
		t.Errorf("what_if %+v, want io.read alone saving 40 ms/step (0.4) with a fix", wi.WhatIf)
	}
	out := h.stdout.String()
	for _, want := range []string{"summary", "GPU idle 40.0%", "io.read", "gaps     " + gaps, "spans    gaptrace-spans.jsonl",
		"without io.read         −40 ms/step (−40.0%) — prefetch", "dropped events 2\n  late events 7   incomplete steps 1\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if h.pipe.pc.Spans != "gaptrace-spans.jsonl" {
		t.Errorf("spans file %q, want the default in file mode", h.pipe.pc.Spans)
	}
}

func TestRunOTLPModeHasNoDefaultSpansFile(t *testing.T) {
	h := newHarness(t)
	h.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://collector:4318"
	if code := h.main(context.Background(), "run", "--live", "off", "--", "true"); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr)
	}
	if h.pipe.pc.Spans != "" {
		t.Errorf("spans file %q with an OTLP endpoint, want none", h.pipe.pc.Spans)
	}
	if !strings.Contains(h.stdout.String(), "OTLP     http://collector:4318") {
		t.Errorf("summary does not say where spans went:\n%s", h.stdout)
	}
}

// The pipeline is told to stop waiting for the probes to detach
// DetachTimeout after the job exited, not after whatever came between
// (the GPU drain, a slow flush): the bound on gaptrace's exit counts from
// the job's.
func TestRunBoundsTheDetachFromTheJobsExit(t *testing.T) {
	h := newHarness(t)
	ended := filepath.Join(t.TempDir(), "ended")
	if code := h.main(context.Background(), "run", "--live", "off", "--", "sh", "-c", `date +%s.%N > "$0"`, ended); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr)
	}
	b, err := os.ReadFile(ended)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		t.Fatal(err)
	}
	jobEnd := time.Unix(0, int64(sec*1e9)).Add(-time.Millisecond) // the float's rounding
	by, closed := h.pipe.detachBy, h.pipe.closedAt
	if by.Before(jobEnd.Add(DetachTimeout)) || by.After(closed.Add(DetachTimeout)) {
		t.Errorf("detach awaited until %v after the job's end, want %v after it (and no later than %v after Close began)",
			by.Sub(jobEnd), DetachTimeout, DetachTimeout)
	}
}

func TestRunDurationStopsTracingNotTheCommand(t *testing.T) {
	h := newHarness(t)
	start := time.Now()
	code := h.main(context.Background(), "run", "--live", "off", "--duration", "200ms", "--", "sh", "-c", "sleep 1; exit 3")
	if code != 3 {
		t.Fatalf("exit %d, want the command's 3: %s", code, h.stderr)
	}
	if d := h.pipe.closedAt.Sub(start); d > 900*time.Millisecond {
		t.Errorf("tracing stopped after %v, want about 200ms", d)
	}
	if time.Since(start) < time.Second {
		t.Error("returned before the command exited")
	}
}

func TestLogLinesWhenNotATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a 5 s log period")
	}
	h := newHarness(t)
	if code := h.main(context.Background(), "run", "--", "sleep", "5.5"); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if n := strings.Count(h.stdout.String(), "gaptrace elapsed="); n != 1 {
		t.Errorf("%d log lines in 5.5 s, want 1:\n%s", n, h.stdout)
	}
	if strings.Contains(h.stdout.String(), "\x1b[") {
		t.Error("escape sequences written to a non-terminal")
	}
}

func TestLiveViewOnTerminal(t *testing.T) {
	h := newHarness(t)
	h.deps.IsTerminal = func() (bool, int) { return true, 90 }
	h.deps.TerminalRows = func() int { return 40 }
	if code := h.main(context.Background(), "run", "--", "sleep", "1.3"); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := h.stdout.String()
	// The view fenced the bottom rows off with a scroll region and drew
	// there, then gave the terminal back before the summary.
	set := regexp.MustCompile(`\x1b\[1;\d+r`).FindStringIndex(out)
	if set == nil || !strings.Contains(out, "idle by cause") {
		t.Fatalf("no live frame in a scroll region:\n%q", out)
	}
	reset := strings.LastIndex(out, "\x1b[r")
	if reset < set[0] || reset > strings.Index(out, "summary\n") {
		t.Errorf("the scroll region was not reset before the summary:\n%q", out)
	}
}

// TestLiveViewUnknownTerminalSize: a terminal of 0 rows (a pty nobody
// sized) cannot show the frame; the periodic line stands in, said once.
func TestLiveViewUnknownTerminalSize(t *testing.T) {
	h := newHarness(t)
	h.deps.IsTerminal = func() (bool, int) { return true, 100 }
	h.deps.TerminalRows = func() int { return 0 }
	if code := h.main(context.Background(), "run", "--live", "on", "--", "sleep", "5.5"); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if n := strings.Count(h.stderr.String(), "the terminal reports no size"); n != 1 {
		t.Errorf("note said %d times, want once:\n%s", n, h.stderr)
	}
	if n := strings.Count(h.stdout.String(), "gaptrace elapsed="); n != 1 {
		t.Errorf("%d status lines in 5.5 s, want 1:\n%s", n, h.stdout)
	}
	if strings.Contains(h.stdout.String(), "\x1b[") {
		t.Errorf("escape sequences for a frame that cannot be drawn:\n%q", h.stdout)
	}
}

func TestBadFlagsReportEverything(t *testing.T) {
	h := newHarness(t)
	code := h.main(context.Background(), "run", "--probes", "some", "--min-gap", "x", "--gaps-out", "/nonexistent/g.jsonl", "--", "true")
	if code != ExitUsage {
		t.Errorf("exit %d, want 2", code)
	}
	e := h.stderr.String()
	for _, want := range []string{"invalid configuration", "--probes", "--min-gap", "--gaps-out"} {
		if !strings.Contains(e, want) {
			t.Errorf("stderr lacks %q:\n%s", want, e)
		}
	}
	if h.pipe.runs != 0 || len(h.pipe.traced) != 0 {
		t.Error("pipeline used despite bad configuration")
	}
}

func TestNotPrivileged(t *testing.T) {
	h := newHarness(t)
	h.deps.Privileged = func() error { return errors.New("missing capabilities CAP_BPF, CAP_PERFMON") }
	for _, args := range [][]string{{"run", "--", "true"}, {"attach", "--pid", "1", "--force"}, {"demo"}} {
		h.stderr.b.Reset()
		if code := h.main(context.Background(), args...); code != ExitFailure {
			t.Errorf("%v: exit %d, want 1", args, code)
		}
		if got := h.stderr.String(); !strings.Contains(got, "cannot trace: missing capabilities CAP_BPF") || strings.Count(got, "\n") != 1 {
			t.Errorf("%v: want one clear line, got:\n%s", args, got)
		}
	}
}

func TestUsageAndVersion(t *testing.T) {
	h := newHarness(t)
	if code := h.main(context.Background(), "version"); code != 0 || h.stdout.String() != "gaptrace test\n" {
		t.Errorf("version: %d %q", code, h.stdout)
	}
	if code := h.main(context.Background(), "frobnicate"); code != ExitUsage || !strings.Contains(h.stderr.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %d %q", code, h.stderr)
	}
	if code := h.main(context.Background()); code != ExitUsage {
		t.Errorf("no args: %d", code)
	}
	if code := h.main(context.Background(), "run", "-h"); code != ExitOK || !strings.Contains(h.stderr.String(), "-min-gap") {
		t.Errorf("run -h: %d %q", code, h.stderr)
	}
}

func TestDemoArgs(t *testing.T) {
	args := demoArgs("/x/simtrain", "/tmp/d", 25*time.Second)
	joined := strings.Join(args, " ")
	for _, s := range demoMix {
		if !strings.Contains(joined, fmt.Sprintf("--stall %s:every=%d:ms=%d", s.cause, s.every, s.ms)) {
			t.Errorf("missing stall %s in %s", s.cause, joined)
		}
	}
	// About 25 s of steps at the mix's mean step time.
	var steps int
	if _, err := fmt.Sscan(args[2], &steps); err != nil {
		t.Fatalf("step count %q: %v", args[2], err)
	}
	if steps < 450 || steps > 800 {
		t.Errorf("%d steps for 25 s", steps)
	}
}

func TestDemoWithoutSimGPU(t *testing.T) {
	h := newHarness(t)
	h.env["GAPTRACE_SIMGPU"] = t.TempDir()
	if code := h.main(context.Background(), "demo"); code != ExitFailure {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(h.stderr.String(), "make simgpu") {
		t.Errorf("stderr: %s", h.stderr)
	}
}

func TestSummaryJSONCarriesSidecarCost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary.json")
	in := correlate.Summary{Steps: 3, Sidecar: &correlate.SidecarCost{Events: 9, EventsByKind: map[string]uint64{"cuda.launch": 9}}}
	if err := writeSummaryJSON(path, in, nil, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s correlate.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Sidecar == nil || s.Sidecar.CPUNS <= 0 || s.Sidecar.MaxRSSBytes < 1<<20 {
		t.Fatalf("sidecar cost missing or implausible: %+v", s.Sidecar)
	}
	if s.Sidecar.Events != 9 || s.Sidecar.EventsByKind["cuda.launch"] != 9 {
		t.Errorf("records handled lost: %+v", s.Sidecar)
	}
	if s.Steps != 3 || s.ByCause == nil {
		t.Fatalf("summary fields lost: %+v", s)
	}
}
