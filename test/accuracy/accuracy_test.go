package accuracy

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// Targets. They are the promise made to users; a miss fails the test.
const (
	minRecall      = 0.95 // time-weighted, true gaps ≥ minGapNS
	minPrecision   = 0.95 // time-weighted, reported idle gaps
	minAccuracy    = 0.95 // time-weighted attribution, every cause
	maxStepIdleErr = 0.05 // launch-bound: per-step idle vs truth (median and total)
	// minStepIdleJudged: steps not preempted (StepIdleResult.Preempted)
	// that the per-step median needs; fewer, and the totals judge alone.
	minStepIdleJudged = 15
	maxStepCountErr   = 0.02 // steps counted vs the trainer's, over the scored range
	minGapNS          = int64(time.Millisecond)
	// minScoredNS: detection recall and precision are asserted over at
	// least this much time. Below it the ratio is decided by one or two
	// chance events (the launch-bound trainer has no injected stall; its
	// only gaps ≥ 1 ms are the feeder being preempted by other load), so it
	// is printed, not judged. Every injected-stall scenario has 200+ ms.
	minScoredNS     = int64(20 * time.Millisecond)
	runDeadline     = 3 * time.Minute // one gaptrace run, start to exit
	detachSignal    = "detaching probes"
	accuracyOutRoot = "out/accuracy"
)

// scenario is one simtrain configuration traced under each probe set.
type scenario struct {
	name string
	// The trainer: kernels per step of kernelUS each, launched every
	// gapUS (plus the launch's own cost) round-robin on streams.
	kernels, kernelUS, gapUS, streams, collectives int
	stalls                                         []stall
	// steps is how many steps are scored: the trainer runs that many after
	// gaptrace has attached its probes (plus one, see Truth.TracedFrom).
	steps int
	// launchBound scenarios are also scored on per-step idle.
	launchBound bool
	// extra are more simtrain flags; env more variables for the trainer.
	extra, env []string
	// countSteps scenarios are also scored on how many steps gaptrace
	// counted over the scored range, against the trainer's.
	countSteps bool
	// probes, when set, are the only probe sets the scenario runs under.
	probes []string
	// netShare, when set, also judges the gaps of net stalls on their
	// breakdown (at least this share net) and their peers (every one names
	// the server): see NetShare. Other scenarios with net stalls print
	// the figures.
	netShare float64
}

type stall struct {
	cause     string
	every, ms int
	ahead     bool
	via       string // net: "poll" for a socket with a timeout
}

func (sc scenario) args() []string {
	// The trainer runs until the harness has seen enough steps after the
	// probes attached, then gets SIGINT (it stops after the current step).
	v := []string{"--steps", "1000000",
		"--kernels-per-step", fmt.Sprint(sc.kernels), "--kernel-us", fmt.Sprint(sc.kernelUS),
		"--launch-gap-us", fmt.Sprint(sc.gapUS), "--streams", fmt.Sprint(max(1, sc.streams)),
		"--collectives", fmt.Sprint(sc.collectives), "--workers", "0"}
	// Data-loader workers only where a stall needs them: each is one more
	// process to attach probes to and, slower still, to detach them from.
	for _, st := range sc.stalls {
		if strings.HasPrefix(st.cause, "loader.wait") {
			v[len(v)-1] = "2"
			break
		}
	}
	for _, st := range sc.stalls {
		a := fmt.Sprintf("%s:every=%d:ms=%d", st.cause, st.every, st.ms)
		if st.ahead {
			a += ":at=ahead"
		}
		if st.via != "" {
			a += ":via=" + st.via
		}
		v = append(v, "--stall", a)
	}
	return append(v, sc.extra...)
}

// Every injectable cause alone, a mix, CPU-ahead stalls, several streams
// and a launch-bound run. Stalls of 25–40 ms. "other" is not injectable: simtrain has no stall that blocks in a
// syscall outside the taxonomy, so it is not scored.
func scenarios() []scenario {
	single := func(cause string, ms int) scenario {
		return scenario{name: cause, kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 40,
			stalls: []stall{{cause: cause, every: 4, ms: ms}}}
	}
	// A late peer delays one of the all-reduces every step has (DDP issues
	// several per step); without them simtrain would run a collective only
	// in the late steps, which no trainer does.
	comm := single("comm", 30)
	comm.collectives = 2
	// A metrics post through a socket with a timeout (http.client with
	// timeout=, requests): the thread waits in poll on the socket, not in
	// recv.
	netPoll := single("net", 30)
	netPoll.name, netPoll.stalls[0].via, netPoll.netShare = "net-poll", "poll", 0.98
	return []scenario{
		single("io.read", 30),
		single("io.write", 30),
		single("net", 30),
		netPoll,
		single("loader.wait.io", 30),
		single("loader.wait.cpu", 30),
		comm,
		single("cuda.memcpy", 30),
		single("cuda.alloc", 30),
		single("cpu", 30),
		single("cpu.contention", 25),
		single("sleep", 30),
		single("lock", 30),
		// x.to(device) from pageable memory: the async copy keeps the host
		// while the driver stages it (truth cuda.memcpy).
		{name: "pageable", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 40,
			stalls: []stall{{cause: "pageable", every: 4, ms: 30}}},
		// torch.save of a CUDA state_dict: per tensor a copy to the host, a
		// sync, serialization and a write; then fsync (truth io.write).
		{name: "checkpoint", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 40,
			stalls: []stall{{cause: "checkpoint", every: 4, ms: 30}}},
		// A checkpoint, then a wait for a lock a second thread holds (a
		// metrics thread holding the GIL), back to back before the same
		// step: two gaps, io.write then lock.
		{name: "checkpoint-lock", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 40,
			stalls: []stall{{cause: "checkpoint", every: 4, ms: 30}, {cause: "lock", every: 4, ms: 30}}},
		// A few short kernels follow every step's last sync (GradScaler's
		// update, an optimizer step after loss.item()): no sync says when
		// the queue drained before the stall.
		{name: "trailing-io.read", kernels: 40, kernelUS: 300, gapUS: 20, streams: 1, steps: 40,
			extra:  []string{"--trailing-launches", "2"},
			stalls: []stall{{cause: "io.read", every: 4, ms: 30}}},
		{name: "trailing-checkpoint", kernels: 40, kernelUS: 300, gapUS: 20, streams: 1, steps: 40,
			extra:  []string{"--trailing-launches", "2"},
			stalls: []stall{{cause: "checkpoint", every: 4, ms: 30}}},
		// Every value is a prime whose products exceed any run's steps, so
		// no two pre-step stalls share a gap; the comm stall ends its step
		// and never shares a gap with them.
		{name: "mix", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, collectives: 2, steps: 120,
			stalls: []stall{
				{cause: "io.read", every: 31, ms: 30},
				{cause: "sleep", every: 37, ms: 25},
				{cause: "loader.wait.cpu", every: 41, ms: 30},
				{cause: "net", every: 43, ms: 25},
				{cause: "io.write", every: 47, ms: 30},
				{cause: "comm", every: 7, ms: 25},
			}},
		// The CPU runs ahead: 16 ms of kernels queued, then a 40 ms stall
		// before the sync: ~24 ms of idle that no sync bounds.
		{name: "ahead-io.read", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 36,
			stalls: []stall{{cause: "io.read", every: 4, ms: 40, ahead: true}}},
		{name: "ahead-sleep", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 36,
			stalls: []stall{{cause: "sleep", every: 4, ms: 40, ahead: true}}},
		// Three streams, kernels round-robin: the queue drains only when
		// every stream has.
		{name: "streams", kernels: 9, kernelUS: 2000, gapUS: 20, streams: 3, steps: 40,
			stalls: []stall{{cause: "io.read", every: 4, ms: 30}}},
		// Launch-bound: 100 µs kernels launched every ~250 µs, no stall:
		// the idle is all micro-gaps, ~60% of every step.
		{name: "launch-bound", kernels: 60, kernelUS: 100, gapUS: 250, streams: 1, steps: 50, launchBound: true},
		// A step is one iteration of the loop, however many syncs it
		// holds: host code reads scalars (.item()) 0–3 times per step at
		// varying points, after the batch's two copies, on top of the
		// step's own final sync.
		{name: "steps-extra-syncs", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 48, countSteps: true,
			extra:  []string{"--extra-syncs", "3", "--batch-copies", "2"},
			stalls: []stall{{cause: "io.read", every: 4, ms: 30}}},
		// The same with several streams and two all-reduces per step.
		{name: "steps-streams-comm", kernels: 9, kernelUS: 1500, gapUS: 20, streams: 3, collectives: 2, steps: 48, countSteps: true,
			extra:  []string{"--extra-syncs", "2", "--batch-copies", "2"},
			stalls: []stall{{cause: "sleep", every: 5, ms: 30}}},
		// A checkpoint every 10th step (torch.save of a CUDA state_dict:
		// per tensor a copy to the host and a sync) whose tensors are the
		// size of the batch, copied to the device every step on the same
		// stream: the checkpoint's copies are no steps, and the loop keeps
		// its clock past them.
		{name: "steps-checkpoint", kernels: 8, kernelUS: 2000, gapUS: 20, streams: 1, steps: 48, countSteps: true,
			extra:  []string{"--batch-bytes", "2097152"},
			stalls: []stall{{cause: "checkpoint", every: 10, ms: 30}}},
		// A CUDA-graph step: the batch's copies, one replay, scalar reads.
		{name: "steps-graph", kernels: 1, kernelUS: 2000, gapUS: 20, streams: 1, steps: 48, countSteps: true,
			extra:  []string{"--launch-api", "graph", "--extra-syncs", "2", "--batch-copies", "2"},
			env:    []string{"SIMGPU_GRAPH_US=12000"},
			stalls: []stall{{cause: "io.read", every: 4, ms: 30}}},
		// A benchmark's loop: its input already on the device, nothing
		// enqueued but kernels of six functions (five cycling, the last
		// kernel its own), the loss read every 10th step. The launches
		// of the functions the tracer marks clock it: full probes only,
		// lite sees nothing but the syncs.
		{name: "steps-kernels-only", kernels: 24, kernelUS: 500, gapUS: 20, streams: 1, steps: 60, countSteps: true,
			probes: []string{"full"},
			extra:  []string{"--batch-bytes", "0", "--kernel-fns", "6", "--sync-every", "10"}},
	}
}

var probeSets = []string{"full", "lite", "auto"}

type setup struct{ bin, sim, root string }

func need(t *testing.T) setup {
	t.Helper()
	testutil.NeedRoot(t, "traces with eBPF")
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return setup{bin: testutil.Gaptrace(t), sim: testutil.SimGPU(t), root: root}
}

func TestMain(m *testing.M) { testutil.Main(m) }

// job is one gaptrace run of one scenario under one probe set.
type job struct {
	sc     scenario
	probes string
	flags  []string // more gaptrace flags
	dir    string
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	wall   time.Duration

	mu    sync.Mutex
	lines []string // gaptrace's log so far

	// The scored steps start after scoredFrom (Unix ns): when gaptrace had
	// attached its probes (attached) and found the trainer's step period.
	// scoredUntil is the end of the last of them. Set by driveTrainer.
	attached, scoredFrom, scoredUntil int64
	noPeriod                          bool
}

func (j *job) id() string { return j.sc.name + "/" + j.probes }

// kill ends the run's process group (gaptrace, the trainer and its
// children), which start made for it.
func (j *job) kill() {
	if j.cmd != nil && j.cmd.Process != nil {
		_ = syscall.Kill(-j.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (j *job) logLines() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.lines)
}

// start launches gaptrace. The simulated GPU is copied into the run's
// directory first: uprobes are per file, so an earlier run whose probes are
// still being detached never fires in this run's trainer, and each run has
// its own device timeline (SIMGPU_DIR). The returned channel is closed when
// gaptrace says it is detaching (the trainer has exited) or has exited.
func (s setup) start(j *job, dataDir string) (<-chan struct{}, error) {
	sim := filepath.Join(j.dir, "simgpu")
	tl := filepath.Join(j.dir, "timeline")
	for _, d := range []string{sim, tl} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, f := range testutil.SimFiles {
		if err := copyFile(filepath.Join(s.sim, f), filepath.Join(sim, f)); err != nil {
			return nil, fmt.Errorf("copy simulated GPU: %w", err)
		}
	}
	args := []string{"run", "--probes", j.probes, "--live", "off", "--log-level", "debug"}
	args = append(args, j.flags...)
	args = append(args,
		"--gaps-out", filepath.Join(j.dir, "gaps.jsonl"),
		"--summary-json", filepath.Join(j.dir, "summary.json"),
		"--spans-out", filepath.Join(j.dir, "spans.jsonl"),
		"--nvml-lib", filepath.Join(sim, "libnvidia-ml.so.1"),
		"--", filepath.Join(sim, "simtrain"), "--truth", filepath.Join(j.dir, "truth.jsonl"),
		"--data-dir", dataDir, "--quiet")
	args = append(args, j.sc.args()...)
	if err := os.WriteFile(filepath.Join(j.dir, "command"), []byte(s.bin+" "+strings.Join(args, " ")+"\n"), 0o644); err != nil {
		return nil, err
	}
	j.cmd = exec.Command(s.bin, args...)
	j.cmd.Dir = j.dir
	j.cmd.Env = append(append(cleanEnv(), "SIMGPU_DIR="+tl), j.sc.env...)
	// Its own process group, so that the priority below reaches the trainer
	// and every child gaptrace starts.
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	pr, pw := io.Pipe()
	j.cmd.Stdout, j.cmd.Stderr = pw, pw
	j.done = make(chan struct{})
	detached := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(detached) }) }
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			j.mu.Lock()
			j.lines = append(j.lines, sc.Text())
			j.mu.Unlock()
			if strings.Contains(sc.Text(), detachSignal) {
				release()
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	t0 := time.Now()
	if err := j.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start gaptrace: %w", err)
	}
	// gaptrace loads its BPF objects (hundreds of ms) before it starts the
	// trainer, so the trainer inherits this; driveTrainer repeats it for
	// the process group once the trainer runs, in case it did not.
	if err := raisePriority(j.cmd.Process.Pid); err != nil {
		j.kill()
		return nil, err
	}
	go func() {
		j.err = j.cmd.Wait()
		j.wall = time.Since(t0)
		pw.Close()
		release()
		close(j.done)
	}()
	return detached, nil
}

// driveTrainer waits until the trainer has run the scenario's steps after
// gaptrace attached its probes to it, then stops it with SIGINT (simtrain
// finishes the current step, writes its truth and exits 0). `gaptrace run`
// attaches the CUDA probes once the trainer has mapped libcuda, without
// holding it, which took 0.2–4 s on this machine (longer while earlier runs
// are still detaching): a fixed step count would score untraced steps.
func (j *job) driveTrainer(deadline time.Time) error {
	truthPath := filepath.Join(j.dir, "truth.jsonl")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var tr *Truth
	attached := int64(0)
	for {
		select {
		case <-j.done:
			return fmt.Errorf("gaptrace exited before the trainer ran %d traced steps", j.sc.steps+1)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("trainer did not run %d traced steps within %v", j.sc.steps+1, runDeadline)
		}
		var err error
		if tr, err = ReadTruth(truthPath); err != nil {
			continue // not written yet
		}
		if attached == 0 {
			at, libs := attachTime(j.logLines(), tr.PID)
			if libs < 2 { // libcuda and libnccl
				continue
			}
			attached = at
			if err := raisePriority(j.cmd.Process.Pid); err != nil {
				return err
			}
		}
		if j.scoredFrom == 0 {
			found, ok := periodTime(j.logLines(), tr.PID)
			switch {
			case ok:
				j.attached, j.scoredFrom = attached, max(attached, found)
			case time.Now().UnixNano() > attached+int64(periodWait):
				// No step structure: gaptrace falls back to fixed windows,
				// and that is scored from the attach on.
				j.attached, j.scoredFrom, j.noPeriod = attached, attached, true
			default:
				continue
			}
		}
		if j.scoredUntil == 0 {
			n := 0
			for _, st := range tr.Steps {
				if st.Start >= j.scoredFrom {
					if n++; n > j.sc.steps {
						j.scoredUntil = st.End
						break
					}
				}
			}
		}
		if j.scoredUntil != 0 && time.Now().UnixNano() >= j.scoredUntil+int64(coolDown) {
			return syscall.Kill(tr.PID, syscall.SIGINT)
		}
	}
}

// periodWait bounds the wait for gaptrace's step period after the attach.
const periodWait = 3 * time.Second

// coolDown is how long the trainer keeps running after the scored steps:
// the GPU windows that cover the last scored steps must not reach past the
// trainer's exit, when the device idles for good (a job's last window is
// a separate finding, not the steady state this suite measures).
const coolDown = 700 * time.Millisecond

// wait waits for the job to exit, killing it at the deadline, and saves its
// log beside its outputs.
func (j *job) wait(deadline time.Time) error {
	select {
	case <-j.done:
	case <-time.After(time.Until(deadline)):
		j.kill()
		<-j.done
		j.err = fmt.Errorf("killed at the suite's deadline: %w", j.err)
	}
	return os.WriteFile(filepath.Join(j.dir, "gaptrace.log"), []byte(strings.Join(j.logLines(), "\n")+"\n"), 0o644)
}

// runNice is the niceness of the traced trainer and of gaptrace. The suite
// measures attribution, not how a shared machine schedules: CI machines run
// other jobs (and `nice go test` lowers everything it starts), and on two
// loaded cores a trainer at the same priority as everything else wakes from
// its sync tens of ms after the GPU drained. A training job owns its cores;
// this approximates that. What the scheduler still adds is real idle and is
// scored (the host cannot see a wake-up's run-queue wait; see the package
// comment).
const runNice = -10

// raisePriority sets the niceness of the process group pgid (gaptrace, the
// trainer and its children).
func raisePriority(pgid int) error {
	if err := syscall.Setpriority(syscall.PRIO_PGRP, pgid, runNice); err != nil {
		return fmt.Errorf("set niceness %d of process group %d: %w", runNice, pgid, err)
	}
	return nil
}

// lockWait bounds the wait for another suite of the same checkout.
const lockWait = 15 * time.Minute

// lockSuite takes an exclusive flock on path, polling until wait has passed.
func lockSuite(t *testing.T, path string, wait time.Duration) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for logged := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !logged {
			t.Logf("another accuracy suite runs in this checkout; waiting for %s", path)
			logged = true
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s: another accuracy suite held it for %v", path, wait)
		}
		<-tick.C
	}
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// cleanEnv drops settings that would send spans elsewhere or change what
// gaptrace reads about the job.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "GAPTRACE_") ||
			strings.HasPrefix(kv, "SIMGPU_") || strings.HasPrefix(kv, "TORCHELASTIC_") ||
			strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "RANK=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// row is one line of the accuracy table.
type row struct {
	Scenario string  `json:"scenario"`
	Probes   string  `json:"probes"`
	Dir      string  `json:"dir"`
	WallS    float64 `json:"wall_s"`
	// ScoredSteps ran after gaptrace had attached its probes and found the
	// step period (WarmupMS after the attach); the SkippedSteps before
	// (and the first after), and those of the final cool-down, are not
	// scored.
	ScoredSteps  int              `json:"scored_steps"`
	SkippedSteps int              `json:"skipped_steps"`
	WarmupMS     float64          `json:"warmup_ms"`
	Notes        []string         `json:"notes,omitempty"`
	Result       *Result          `json:"result"`
	StepIdle     *StepIdleResult  `json:"step_idle,omitempty"`
	Net          *NetResult       `json:"net,omitempty"`
	StepCount    *StepCountResult `json:"step_count,omitempty"`
	Misses       []string         `json:"misses,omitempty"`
}

// TestAccuracy runs every scenario under each probe set (full, lite, auto) with the real
// tracer, scores each run against simtrain's truth, prints the table,
// writes it to out/accuracy/accuracy.json and fails on every missed target.
//
// Runs overlap only where it cannot matter: the next run starts once the
// previous trainer has exited and gaptrace is detaching its probes (5–20 s
// on this kernel, mostly waiting), so only one trainer is ever running.
// GAPTRACE_ACCURACY_ONLY (a regular expression on "scenario/probes")
// selects runs while investigating.
func TestAccuracy(t *testing.T) {
	s := need(t)
	var only *regexp.Regexp
	if expr := os.Getenv("GAPTRACE_ACCURACY_ONLY"); expr != "" {
		var err error
		if only, err = regexp.Compile(expr); err != nil {
			t.Fatalf("GAPTRACE_ACCURACY_ONLY: %v", err)
		}
	}
	outDir := filepath.Join(s.root, accuracyOutRoot)
	runsDir := filepath.Join(outDir, "runs")
	// One suite at a time per checkout: runs share out/accuracy, and two
	// suites at once would also measure each other's load.
	unlock, err := lockSuite(t, filepath.Join(outDir, ".lock"), lockWait)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	dataDir := filepath.Join(t.TempDir(), "data") // shared: the 64 MiB data file is written once

	var jobs []*job
	for _, sc := range scenarios() {
		for _, p := range probeSets {
			if sc.probes != nil && !slices.Contains(sc.probes, p) {
				continue
			}
			j := &job{sc: sc, probes: p, dir: filepath.Join(runsDir, sc.name+"-"+p)}
			if only != nil && !only.MatchString(j.id()) {
				continue
			}
			jobs = append(jobs, j)
		}
	}
	if len(jobs) == 0 {
		t.Fatalf("GAPTRACE_ACCURACY_ONLY=%s selects no run", only)
	}
	t.Cleanup(func() {
		for _, j := range jobs {
			if j.cmd != nil && j.cmd.Process != nil && j.done != nil {
				select {
				case <-j.done:
				default:
					j.kill()
					<-j.done
				}
			}
		}
	})

	t0 := time.Now()
	run := func(j *job) {
		if err := os.RemoveAll(j.dir); err != nil {
			t.Fatal(err)
		}
		detached, err := s.start(j, dataDir)
		if err != nil {
			t.Fatalf("%s: %v", j.id(), err)
		}
		if err := j.driveTrainer(time.Now().Add(runDeadline)); err != nil {
			j.err = err
			j.kill()
		}
		select {
		case <-detached:
		case <-time.After(runDeadline):
			t.Errorf("%s: trainer still running %v after it was told to stop", j.id(), runDeadline)
		}
	}
	for _, j := range jobs {
		run(j)
	}
	for _, j := range jobs {
		if err := j.wait(time.Now().Add(runDeadline)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d runs in %v", len(jobs), time.Since(t0).Round(time.Second))

	var rows []*row
	for _, j := range jobs {
		rows = append(rows, score(t, j))
	}
	// A run that missed a target is run once more, alone: on a 2-core
	// machine one run in forty can lose a 2 ms gap to the machine's own
	// scheduling. The second run decides; the first run's misses stay in
	// the row's notes, so a target met only on the second try shows.
	for i, j := range jobs {
		if len(rows[i].Misses) == 0 {
			continue
		}
		first := rows[i].Misses
		again := &job{sc: j.sc, probes: j.probes, dir: j.dir + "-again"}
		run(again)
		if err := again.wait(time.Now().Add(runDeadline)); err != nil {
			t.Fatal(err)
		}
		r := score(t, again)
		for _, m := range first {
			r.Notes = append(r.Notes, "first run missed: "+m)
		}
		t.Logf("%s: first run missed %d target(s), the second %d", j.id(), len(first), len(r.Misses))
		rows[i] = r
	}
	table := formatTable(rows)
	fmt.Print(table)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(struct {
		Targets map[string]float64 `json:"targets"`
		Rows    []*row             `json:"rows"`
	}{map[string]float64{"recall": minRecall, "precision": minPrecision, "accuracy": minAccuracy,
		"step_idle_rel_err": maxStepIdleErr, "min_gap_ms": float64(minGapNS) / 1e6}, rows}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outDir, "accuracy.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outDir, "accuracy.txt"), []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		for _, m := range r.Misses {
			t.Errorf("%s/%s: %s (outputs in %s)", r.Scenario, r.Probes, m, r.Dir)
		}
	}
}

// score reads one run's outputs and checks the targets.
func score(t *testing.T, j *job) *row {
	r := &row{Scenario: j.sc.name, Probes: j.probes, Dir: j.dir, WallS: j.wall.Seconds()}
	miss := func(format string, a ...any) { r.Misses = append(r.Misses, fmt.Sprintf(format, a...)) }
	if j.err != nil {
		miss("gaptrace: %v (log: %s)", j.err, filepath.Join(j.dir, "gaptrace.log"))
		return r
	}
	tr, err := ReadTruth(filepath.Join(j.dir, "truth.jsonl"))
	if err != nil {
		miss("%v", err)
		return r
	}
	if !tr.Ended || len(tr.Steps) == 0 {
		miss("truth is incomplete (%d steps, end record %v)", len(tr.Steps), tr.Ended)
		return r
	}
	if j.scoredFrom == 0 {
		miss("gaptrace never attached uprobes to the trainer (pid %d)", tr.PID)
		return r
	}
	r.WarmupMS = ms(j.scoredFrom - j.attached)
	if j.noPeriod {
		r.Notes = append(r.Notes, fmt.Sprintf("no step period within %v of the attach: scored from the attach", periodWait))
	}
	ran := len(tr.Steps)
	tr.TracedFrom(j.scoredFrom)
	tr.Until(j.scoredUntil)
	r.ScoredSteps = len(tr.Steps)
	if len(tr.Steps) > 0 {
		r.SkippedSteps = int(tr.Steps[0].Number) - 1
	}
	if len(tr.Steps) < j.sc.steps {
		miss("only %d of the trainer's %d steps are scored (after the probes attached, before the cool-down), want %d",
			len(tr.Steps), ran, j.sc.steps)
		if len(tr.Steps) == 0 {
			return r
		}
	}
	gaps, err := ReadGaps(filepath.Join(j.dir, "gaps.jsonl"))
	if err != nil {
		miss("%v", err)
		return r
	}
	res := Evaluate(tr, gaps, minGapNS)
	r.Result = res
	if res.Recall.Defined() && res.Recall.Den >= minScoredNS && res.Recall.Value() < minRecall {
		miss("detection recall %s < %.2f: %.1f of %.1f ms of true gaps ≥ 1 ms reported; %d gaps less than half covered, first %s",
			res.Recall, minRecall, ms(res.Recall.Num), ms(res.Recall.Den), len(res.Missed), firstMissed(res, tr))
	}
	if res.Precision.Defined() && res.Precision.Den >= minScoredNS && res.Precision.Value() < minPrecision {
		miss("detection precision %s < %.2f: %.1f of %.1f ms reported idle truly idle",
			res.Precision, minPrecision, ms(res.Precision.Num), ms(res.Precision.Den))
	}
	if res.StallRecall.Defined() && res.StallRecall.Value() < minRecall {
		miss("comm stall recall %s < %.2f: %.1f of %.1f ms reported as stall",
			res.StallRecall, minRecall, ms(res.StallRecall.Num), ms(res.StallRecall.Den))
	}
	if res.StallPrecision.Defined() && res.StallPrecision.Value() < minPrecision {
		miss("comm stall precision %s < %.2f: %.1f of %.1f ms of stall gaps inside truth comm stalls",
			res.StallPrecision, minPrecision, ms(res.StallPrecision.Num), ms(res.StallPrecision.Den))
	}
	for _, c := range sortedCauses(res.Causes) {
		cr := res.Causes[c]
		if cr.TruthNS == 0 {
			miss("cause %s: its %d stalls left no true idle to explain", c, cr.Stalls)
			continue
		}
		if !cr.Accuracy.Defined() {
			miss("cause %s: no reported gap covers any of its %.1f ms", c, ms(cr.TruthNS))
			continue
		}
		if cr.Accuracy.Value() < minAccuracy {
			miss("cause %s: attribution accuracy %s < %.2f (coverage %s), reported as %s",
				c, cr.Accuracy, minAccuracy, cr.Coverage, confusion(cr))
		}
	}
	r.Net = NetShare(tr, gaps)
	if j.sc.netShare > 0 {
		switch nr := r.Net; {
		case nr == nil || nr.Stalls == 0:
			miss("net: no gap covers a net stall")
		default:
			if nr.Share.Value() < j.sc.netShare {
				miss("net: %s of the net stalls' gaps attributed net < %.2f", nr.Share, j.sc.netShare)
			}
			if nr.Named < nr.Stalls {
				miss("net: %d of %d net stalls' gaps name the server as their peer", nr.Named, nr.Stalls)
			}
		}
	}
	if j.sc.countSteps {
		spans, err := ReadStepSpans(filepath.Join(j.dir, "spans.jsonl"))
		if err != nil {
			miss("%v", err)
			return r
		}
		sc := CountSteps(tr, spans, tr.PID)
		r.StepCount = sc
		if sc.RelErr() > maxStepCountErr {
			miss("steps counted: %d (%d fixed windows) over the trainer's %d steps (%+.1f%%, want within %.0f%%)",
				sc.Counted, sc.Windows, sc.True, 100*sc.SignedErr(), 100*maxStepCountErr)
		}
	}
	if j.sc.launchBound {
		spans, err := ReadStepSpans(filepath.Join(j.dir, "spans.jsonl"))
		if err != nil {
			miss("%v", err)
			return r
		}
		si := StepIdle(tr, spans, tr.PID)
		r.StepIdle = si
		switch {
		case si.Matched < len(tr.Steps)/2:
			miss("per-step idle: only %d of %d truth steps matched by %d gaptrace steps", si.Matched, len(tr.Steps), si.Steps)
		default:
			if si.Matched-si.Preempted < minStepIdleJudged {
				// The machine kept the feeder off a CPU in most steps:
				// only the totals say how right gaptrace was.
				t.Logf("%s/%s: per-step idle judged in totals only: %d of %d matched steps waited ≥ %.0f%% of their time for a CPU",
					j.sc.name, j.probes, si.Preempted, si.Matched, 100*preemptedShare)
			} else if si.MedianRelErr > maxStepIdleErr {
				miss("per-step idle: median relative error %.1f%% > %.0f%% (p90 %.1f%%)", 100*si.MedianRelErr, 100*maxStepIdleErr, 100*si.P90RelErr)
			}
			if si.TotalRelErr > maxStepIdleErr {
				miss("per-step idle: total %.1f ms reported vs %.1f ms true (%.1f%% > %.0f%%)",
					ms(si.ReportedNS), ms(si.TrueNS), 100*si.TotalRelErr, 100*maxStepIdleErr)
			}
		}
	}
	return r
}

// attachRE matches the tracer's log line for attached uprobes.
var attachRE = regexp.MustCompile(`^time=(\S+) .*msg="uprobes attached" .*library=(\S+) pid=(\d+) `)

// periodRE matches the engine's log line for a trainer's step period.
var periodRE = regexp.MustCompile(`^time=(\S+) .*msg="step period found" .*pid=(\d+) `)

// periodTime is when gaptrace logged the step period of pid, if it did.
// The log is written after the engine's emission delay, so this is a little
// later than the steps that revealed the period.
func periodTime(lines []string, pid int) (int64, bool) {
	for _, line := range lines {
		m := periodRE.FindStringSubmatch(line)
		if len(m) < 3 || m[2] != fmt.Sprint(pid) {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			return ts.Add(time.Millisecond).UnixNano(), true
		}
	}
	return 0, false
}

// attachTime is when the last uprobes for pid were attached, from
// gaptrace's log (millisecond timestamps, so rounded up), and for how many
// libraries.
func attachTime(lines []string, pid int) (int64, int) {
	var last time.Time
	libs := map[string]bool{}
	for _, line := range lines {
		m := attachRE.FindStringSubmatch(line)
		if len(m) < 4 || m[3] != fmt.Sprint(pid) {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		libs[m[2]] = true
		if ts.After(last) {
			last = ts
		}
	}
	if last.IsZero() {
		return 0, 0
	}
	return last.Add(time.Millisecond).UnixNano(), len(libs)
}

func firstMissed(res *Result, tr *Truth) string {
	if len(res.Missed) == 0 {
		return "none"
	}
	m := res.Missed[0]
	return fmt.Sprintf("[%d, %d] (%.2f ms, %.1f ms after the first step)", m.Start, m.End, ms(m.Len()), ms(m.Start-tr.Range().Start))
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func sortedCauses(m map[string]*CauseResult) []string {
	var v []string
	for c := range m {
		v = append(v, c)
	}
	slices.Sort(v)
	return v
}

func confusion(cr *CauseResult) string {
	type kv struct {
		c  string
		ns int64
	}
	var v []kv
	for c, ns := range cr.Confusion {
		v = append(v, kv{c, ns})
	}
	slices.SortFunc(v, func(a, b kv) int { return int(b.ns - a.ns) })
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", x.c, ms(x.ns)))
	}
	return strings.Join(parts, ", ")
}

func pct(r Ratio) string {
	if !r.Defined() {
		return "-"
	}
	return fmt.Sprintf("%.3f", r.Value())
}

// autoAgainstFull says, per scenario that ran under both, how far auto's
// recall and attribution fell below full's (where each has at least 20 ms
// to judge), the largest first: auto is meant to stay within 0.02 of full.
// Both are single runs on a shared machine, so a difference of a few
// hundredths over a few milliseconds of gaps is as much noise as probes.
func autoAgainstFull(rows []*row) string {
	type diff struct {
		what string
		d    float64
	}
	full := map[string]*row{}
	for _, r := range rows {
		if r.Probes == "full" && r.Result != nil {
			full[r.Scenario] = r
		}
	}
	var ds []diff
	for _, r := range rows {
		f := full[r.Scenario]
		if r.Probes != "auto" || r.Result == nil || f == nil {
			continue
		}
		judged := func(x Ratio) bool { return x.Den >= 20*int64(time.Millisecond) }
		if a, b := r.Result.Recall, f.Result.Recall; judged(a) && judged(b) {
			ds = append(ds, diff{r.Scenario + " recall", b.Value() - a.Value()})
		}
		for c, ac := range r.Result.Causes {
			if fc, ok := f.Result.Causes[c]; ok && judged(ac.Accuracy) && judged(fc.Accuracy) {
				ds = append(ds, diff{r.Scenario + " " + c, fc.Accuracy.Value() - ac.Accuracy.Value()})
			}
		}
	}
	if len(ds) == 0 {
		return ""
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].d > ds[j].d })
	var b strings.Builder
	over := 0
	for _, d := range ds {
		if d.d > 0.02 {
			over++
		}
	}
	fmt.Fprintf(&b, "auto against full: %d of %d figures more than 0.02 below full; largest:", over, len(ds))
	for _, d := range ds[:min(len(ds), 4)] {
		fmt.Fprintf(&b, " %s %+.3f", d.what, -d.d)
	}
	b.WriteString("\n")
	return b.String()
}

// formatTable renders the rows as the table `make accuracy` prints.
func formatTable(rows []*row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\ngaptrace accuracy on simtrain (targets: recall/precision ≥ %.2f for gaps ≥ 1 ms, attribution ≥ %.2f per cause, launch-bound per-step idle within %.0f%%)\n",
		minRecall, minAccuracy, 100*maxStepIdleErr)
	fmt.Fprintf(&b, "%-15s %-5s %5s %6s %9s %9s %7s %7s %6s %6s %13s  %s\n",
		"scenario", "probe", "steps", "warmup", "idle ms", "gap≥1ms", "recall", "prec", "stallR", "stallP", "bound p50/p90", "cause accuracy (coverage); per-step idle error")
	for _, r := range rows {
		if r.Result == nil {
			fmt.Fprintf(&b, "%-15s %-5s  FAILED: %s\n", r.Scenario, r.Probes, strings.Join(r.Misses, "; "))
			continue
		}
		res := r.Result
		var causes []string
		for _, c := range sortedCauses(res.Causes) {
			cr := res.Causes[c]
			causes = append(causes, fmt.Sprintf("%s %s (%s)", c, pct(cr.Accuracy), pct(cr.Coverage)))
		}
		if nr := r.Net; nr != nil {
			causes = append(causes, fmt.Sprintf("net share %s, peer named %d/%d", pct(nr.Share), nr.Named, nr.Stalls))
		}
		if sc := r.StepCount; sc != nil {
			causes = append(causes, fmt.Sprintf("steps counted %d/%d (%+.1f%%)", sc.Counted, sc.True, 100*sc.SignedErr()))
		}
		if r.StepIdle != nil {
			si := r.StepIdle
			pre := ""
			if si.Preempted > 0 {
				pre = fmt.Sprintf(", %d preempted", si.Preempted)
			}
			causes = append(causes, fmt.Sprintf("step idle p50 %.1f%% p90 %.1f%% total %.1f%% (%d/%d steps%s, %.0f vs %.0f ms)",
				100*si.MedianRelErr, 100*si.P90RelErr, 100*si.TotalRelErr, si.Matched, si.Steps, pre, ms(si.ReportedNS), ms(si.TrueNS)))
		}
		mark := ""
		if len(r.Misses) > 0 {
			mark = "  MISS"
		}
		fmt.Fprintf(&b, "%-15s %-5s %5d %6.0f %9.1f %9.1f %7s %7s %6s %6s %6.2f/%-6.2f  %s%s\n",
			r.Scenario, r.Probes, r.ScoredSteps, r.WarmupMS, ms(res.TrueIdleNS), ms(res.TrueGapNS), pct(res.Recall), pct(res.Precision),
			pct(res.StallRecall), pct(res.StallPrecision), ms(res.BoundaryP50NS), ms(res.BoundaryP90NS),
			strings.Join(causes, ", "), mark)
	}
	fmt.Fprintf(&b, "(steps: scored, those that started once the probes were attached and gaptrace had found the step period (warmup: ms between the two), less one; idle ms: true GPU idle over them; gap≥1ms: of it in gaps ≥ 1 ms; stallR/P: comm stalls vs gaps of kind stall; bound: gap boundary error, ms; 'other' is not injectable; recall and precision are judged only over ≥ 20 ms)\n")
	b.WriteString(autoAgainstFull(rows))
	misses := 0
	for _, r := range rows {
		misses += len(r.Misses)
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "note %s/%s: %s\n", r.Scenario, r.Probes, n)
		}
	}
	if misses > 0 {
		fmt.Fprintf(&b, "%d targets missed:\n", misses)
		for _, r := range rows {
			for _, m := range r.Misses {
				fmt.Fprintf(&b, "  %s/%s: %s\n", r.Scenario, r.Probes, m)
			}
		}
	} else {
		fmt.Fprintf(&b, "every target met\n")
	}
	return b.String()
}
