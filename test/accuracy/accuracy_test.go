package accuracy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
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

	jobs := selectJobs(t, runsDir)
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
	writeResults(t, outDir, rows)
	for _, r := range rows {
		for _, m := range r.Misses {
			t.Errorf("%s/%s: %s (outputs in %s)", r.Scenario, r.Probes, m, r.Dir)
		}
	}
}

// selectJobs is every scenario under each of its probe sets, narrowed by
// GAPTRACE_ACCURACY_ONLY (a regular expression over "scenario/probes").
func selectJobs(t *testing.T, runsDir string) []*job {
	t.Helper()
	var only *regexp.Regexp
	if expr := os.Getenv("GAPTRACE_ACCURACY_ONLY"); expr != "" {
		var err error
		if only, err = regexp.Compile(expr); err != nil {
			t.Fatalf("GAPTRACE_ACCURACY_ONLY: %v", err)
		}
	}
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
	return jobs
}

// writeResults prints the table and writes it, with the rows and targets
// as JSON, to outDir.
func writeResults(t *testing.T, outDir string, rows []*row) {
	t.Helper()
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
}
