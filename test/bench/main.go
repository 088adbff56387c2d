// Command bench measures what tracing costs simtrain jobs (-jobs, see
// jobs.go: launch-bound, fed by data-loader workers, 8 ranks): it runs each
// untraced and under gaptrace's probe sets null, lite, auto and full, each traced run paired with an untraced run
// right before it (the machine's drift cancels in the pair), for -reps
// repetitions in a shuffled order, and prints the median and a bootstrap
// 95% interval of: the wall time per step as a ratio to the paired
// untraced run, the trainer's own CPU time per step (uprobe traps are
// charged to the thread that hits them), the time per kernel launch, and
// gaptrace's own CPU as a share of one core (/proc, from -skip after the
// job's start to its end) and peak RSS (its summary).
// The first -skip of every run (auto's first window) is left out of each
// figure; auto's later windows are not. The trainer's CPU time comes from
// simtrain itself (CLOCK_PROCESS_CPUTIME_ID at the end of every step).
//
// It is run by `make bench` (root: gaptrace loads BPF programs); it is not
// part of the test suite.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gaptrace/gaptrace/internal/stats"
)

type options struct {
	gaptrace, simgpu, out string
	reps                  int
	jobs                  []string
	rankSteps             int
	modes                 []string
	runFor                time.Duration
	kernels               int
	skip                  time.Duration
	autoFlags             []string
	seed                  uint64
	save                  string
	merged                []string // -merge: the saved files the table comes from
}

func main() {
	var o options
	var modes, autoFlags, jobs string
	flag.StringVar(&jobs, "jobs", strings.Join(knownJobs, ","), "jobs to measure, comma-separated: launch, loader, ranks8")
	flag.IntVar(&o.rankSteps, "rank-steps", 400, "ranks8: steps each rank runs (it stops on its own)")
	flag.StringVar(&o.gaptrace, "gaptrace", "bin/gaptrace", "the gaptrace binary")
	flag.StringVar(&o.simgpu, "simgpu", "build/simgpu", "the simulated GPU (simtrain, libcuda, libnvidia-ml)")
	flag.StringVar(&o.out, "out", "", "where runs write (default: a new directory under /tmp)")
	flag.IntVar(&o.reps, "reps", 20, "repetitions of every mode (each one an interleaved pair with an untraced run)")
	flag.StringVar(&modes, "modes", "untraced,null,lite,auto,full", "modes to measure, comma-separated")
	flag.DurationVar(&o.runFor, "run", 5*time.Second, "how long each run lasts (then simtrain, or gaptrace and with it simtrain, is interrupted)")
	flag.IntVar(&o.kernels, "kernels", 300, "kernels per step (1 µs each, launched back to back)")
	flag.DurationVar(&o.skip, "skip", 2*time.Second, "leave out the first part of every run (attach, auto's first window)")
	flag.StringVar(&autoFlags, "auto-flags", "", "more gaptrace flags for mode auto (e.g. \"--auto-every 10s\")")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the run order and of the bootstrap")
	flag.StringVar(&o.save, "save", "", "also write every pair's figures to FILE (JSON), for -merge")
	var merge string
	flag.StringVar(&merge, "merge", "", "print the table of saved runs (comma-separated files from -save) instead of running")
	flag.Parse()
	o.modes = strings.Split(modes, ",")
	o.jobs = strings.Split(jobs, ",")
	o.autoFlags = strings.Fields(autoFlags)
	if merge != "" {
		res, err := load(strings.Split(merge, ","))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		o.reps = 0
		for _, v := range res.Ratio {
			o.reps = max(o.reps, len(v))
		}
		o.merged = strings.Split(merge, ",")
		fmt.Print(table(o, res))
		return
	}
	if err := validate(&o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	res, err := runAll(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if o.save != "" {
		b, _ := json.Marshal(res)
		if err := os.WriteFile(o.save, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	fmt.Print(table(o, res))
}

// load merges the pairs of saved runs.
func load(files []string) (*results, error) {
	all := newResults()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r results
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for m, v := range r.Ratio {
			all.Ratio[m] = append(all.Ratio[m], v...)
			all.CPU[m] = append(all.CPU[m], r.CPU[m]...)
			all.Launch[m] = append(all.Launch[m], r.Launch[m]...)
			all.SideCPU[m] = append(all.SideCPU[m], r.SideCPU[m]...)
			all.SideRSS[m] = append(all.SideRSS[m], r.SideRSS[m]...)
		}
		all.FullShare = append(all.FullShare, r.FullShare...)
	}
	return all, nil
}

func validate(o *options) error {
	for _, m := range o.modes {
		switch m {
		case "untraced", "null", "lite", "auto", "full":
		default:
			return fmt.Errorf("-modes: unknown mode %q (want untraced, null, lite, auto, full)", m)
		}
	}
	for _, j := range o.jobs {
		if !slices.Contains(knownJobs, j) {
			return fmt.Errorf("-jobs: unknown job %q (want %s)", j, strings.Join(knownJobs, ", "))
		}
	}
	if o.rankSteps < 20 {
		return fmt.Errorf("-rank-steps must be at least 20")
	}
	if o.reps < 1 || o.kernels < 1 || o.runFor < o.skip+time.Second {
		return fmt.Errorf("-reps and -kernels must be at least 1, -run at least -skip plus 1s")
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("gaptrace loads BPF programs: run as root")
	}
	for _, f := range []string{o.gaptrace, filepath.Join(o.simgpu, "simtrain")} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w (make build simgpu)", err)
		}
	}
	if o.out == "" {
		d, err := os.MkdirTemp("", "gaptrace-bench.")
		if err != nil {
			return err
		}
		o.out = d
	}
	return nil
}

// sample is one run's figures over its steps after the skip.
type sample struct {
	StepNS    float64 // mean wall time per step
	CPUNS     float64 // trainer CPU time per step
	LaunchNS  float64 // median time per launch
	Steps     int
	FullShare float64 // auto: share of the run at full (from its summary)
	// HangTickNS: the mean time of one check of the hang watch (gaptrace's
	// log), 0 for an untraced run.
	HangTickNS float64
	SideCPU    float64 // gaptrace's CPU, share of one core (-1: untraced or unknown)
	SideRSS    float64 // gaptrace's peak RSS, MiB (-1: untraced or unknown)
}

// results are keyed by key(job, mode).
type results struct {
	Ratio, CPU, Launch map[string][]float64
	SideCPU, SideRSS   map[string][]float64
	FullShare          []float64
	HangTick           []float64 // ns per check of the hang watch, every traced run
}

func newResults() *results {
	return &results{Ratio: map[string][]float64{}, CPU: map[string][]float64{}, Launch: map[string][]float64{},
		SideCPU: map[string][]float64{}, SideRSS: map[string][]float64{}}
}

func runAll(o options) (*results, error) {
	res := newResults()
	r := rand.New(rand.NewPCG(o.seed, 99))
	n := 0
	total := o.reps * len(o.modes) * len(o.jobs)
	fmt.Fprintf(os.Stderr, "bench: %d pairs of runs, outputs in %s\n", total, o.out)
	for rep := 0; rep < o.reps; rep++ {
		var order [][2]string
		for _, j := range o.jobs {
			for _, m := range o.modes {
				order = append(order, [2]string{j, m})
			}
		}
		r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, jm := range order {
			j, m := jm[0], jm[1]
			k := key(j, m)
			n++
			base, err := run(o, j, "untraced", fmt.Sprintf("%03d-%s-%s-base", rep, j, m))
			if err != nil {
				return nil, err
			}
			s, err := run(o, j, m, fmt.Sprintf("%03d-%s-%s", rep, j, m))
			if err != nil {
				return nil, err
			}
			res.Ratio[k] = append(res.Ratio[k], s.StepNS/base.StepNS)
			res.CPU[k] = append(res.CPU[k], s.CPUNS)
			res.Launch[k] = append(res.Launch[k], s.LaunchNS)
			if s.SideCPU >= 0 {
				res.SideCPU[k] = append(res.SideCPU[k], s.SideCPU)
			}
			if s.SideRSS >= 0 {
				res.SideRSS[k] = append(res.SideRSS[k], s.SideRSS)
			}
			if m == "auto" && j == "launch" {
				res.FullShare = append(res.FullShare, s.FullShare)
			}
			if s.HangTickNS > 0 {
				res.HangTick = append(res.HangTick, s.HangTickNS)
			}
			fmt.Fprintf(os.Stderr, "bench: %3d/%d %-14s step %.1f µs (untraced %.1f), cpu %.1f µs/step, %.3f µs/launch, gaptrace %.1f%% of a core, %.0f MiB\n",
				n, total, k, s.StepNS/1e3, base.StepNS/1e3, s.CPUNS/1e3, s.LaunchNS/1e3, 100*s.SideCPU, s.SideRSS)
		}
	}
	return res, nil
}

// run runs a job once, under gaptrace unless mode is untraced.
func run(o options, job, mode, name string) (sample, error) {
	dir := filepath.Join(o.out, name)
	if err := os.MkdirAll(filepath.Join(dir, "tl"), 0o755); err != nil {
		return sample{}, err
	}
	truth := filepath.Join(dir, "truth.jsonl")
	inner, env, signal := jobArgv(o, job, dir, truth)
	argv := inner
	if mode != "untraced" {
		argv = []string{o.gaptrace, "run", "--probes", mode, "--live", "off",
			"--nvml-lib", filepath.Join(o.simgpu, "libnvidia-ml.so.1"),
			"--summary-json", filepath.Join(dir, "summary.json"), "--spans-out", filepath.Join(dir, "spans.jsonl"),
			"--gaps-out", filepath.Join(dir, "gaps.jsonl")}
		if mode == "auto" {
			argv = append(argv, o.autoFlags...)
		}
		argv = append(append(argv, "--"), inner...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), "SIMGPU_DIR="+filepath.Join(dir, "tl")), env...)
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return sample{}, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return sample{}, fmt.Errorf("%s: %w", name, err)
	}
	// simtrain stops after the step it is in on SIGINT, writing its
	// truth; gaptrace passes the signal on to it and then detaches. The
	// run is timed from simtrain's start (it creates its truth file then),
	// not gaptrace's: loading the probes takes seconds on a loaded machine.
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	started := time.Time{}
	meter := cpuMeter{pid: cmd.Process.Pid}
	tick := time.NewTicker(20 * time.Millisecond)
	for err = nil; ; {
		select {
		case err = <-done:
		case now := <-tick.C:
			switch {
			case started.IsZero():
				if _, serr := os.Stat(truth); serr == nil {
					started = now
				}
			case now.Sub(started) >= o.runFor && signal:
				_ = cmd.Process.Signal(os.Interrupt)
				started = now.Add(time.Hour) // once
				signal = false
			case now.Sub(started) >= o.skip && mode != "untraced" && signal:
				meter.read(now)
			case now.Sub(started) >= o.skip && mode != "untraced" && job == "ranks8":
				meter.read(now)
			}
			continue
		}
		break
	}
	tick.Stop()
	if err != nil {
		return sample{}, fmt.Errorf("%s: %w (log: %s)", name, err, logf.Name())
	}
	s, err := measure(dir, truth, mode, o.skip)
	s.SideCPU, s.SideRSS = -1, -1
	if mode != "untraced" {
		s.SideCPU, s.SideRSS = meter.share(), sidecarRSS(dir)
	}
	if err == nil && mode != "untraced" {
		s.HangTickNS = hangTick(logf.Name())
	}
	return s, err
}

// hangTickRe reads the hang watch's cost from gaptrace's log.
var hangTickRe = regexp.MustCompile(`msg="hang watch" .*tick_mean=(\S+)`)

// hangTick is the mean time of one hang check in a run's log; 0 when the
// log does not say.
func hangTick(log string) float64 {
	b, err := os.ReadFile(log)
	if err != nil {
		return 0
	}
	m := hangTickRe.FindSubmatch(b)
	if m == nil {
		return 0
	}
	d, err := time.ParseDuration(string(m[1]))
	if err != nil {
		return 0
	}
	return float64(d)
}

// truthRec is a line of simtrain's truth file (CLOCK_MONOTONIC ns); a
// step's cpu_ns is the process's CPU time when it ended.
type truthRec struct {
	Type  string `json:"type"`
	What  string `json:"what"`
	Start int64  `json:"start"`
	End   int64  `json:"end"`
	Count int64  `json:"count"`
	CPUNS int64  `json:"cpu_ns"`
}

// measure reads a run's figures from simtrain's truth, over the steps that
// start at least skip after its first step.
func measure(dir, truth, mode string, skip time.Duration) (sample, error) {
	f, err := os.Open(truth)
	if err != nil {
		return sample{}, err
	}
	defer f.Close()
	var all []truthRec
	var perLaunch []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r truthRec
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		switch {
		case r.Type == "step":
			all = append(all, r)
		case r.Type == "call" && r.What == "launch_count" && r.Count > 0 && len(all) > 0 && r.Start >= all[0].Start+int64(skip):
			perLaunch = append(perLaunch, float64(r.End-r.Start)/float64(r.Count))
		}
	}
	// Steps from the first that starts skip after the first step; their
	// CPU time is counted from the end of the step before.
	from := len(all)
	for i, r := range all {
		if i > 0 && r.Start >= all[0].Start+int64(skip) {
			from = i
			break
		}
	}
	n := len(all) - from
	if n < 10 {
		return sample{}, fmt.Errorf("%s: %d steps after the first %v: raise -steps or lower -skip", dir, n, skip)
	}
	last := all[len(all)-1]
	s := sample{Steps: n, LaunchNS: stats.Median(perLaunch),
		StepNS: float64(last.End-all[from].Start) / float64(n),
		CPUNS:  float64(last.CPUNS-all[from-1].CPUNS) / float64(n)}
	if mode == "auto" {
		var sum struct {
			WallNS int64 `json:"wall_ns"`
			FullNS int64 `json:"probes_full_ns"`
		}
		if b, err := os.ReadFile(filepath.Join(dir, "summary.json")); err == nil && json.Unmarshal(b, &sum) == nil && sum.WallNS > 0 {
			s.FullShare = float64(sum.FullNS) / float64(sum.WallNS)
		}
	}
	return s, nil
}

func table(o options, res *results) string {
	var b strings.Builder
	for _, j := range o.jobs {
		b.WriteString(jobTable(o, j, res))
	}
	return b.String()
}

func jobTable(o options, job string, res *results) string {
	var b strings.Builder
	if o.merged != nil {
		// The saving script describes its job; here only what the table holds.
		fmt.Fprintf(&b, "\n%s, job %s: interleaved pairs per mode:", strings.Join(o.merged, ", "), job)
		for _, m := range o.modes {
			fmt.Fprintf(&b, " %s %d", m, len(res.Ratio[key(job, m)]))
		}
		fmt.Fprintln(&b)
	} else {
		what := map[string]string{
			"launch": fmt.Sprintf("steps of %d × 1 µs kernels launched back to back", o.kernels),
			"loader": "2 data-loader worker processes, a batch every step, 8 × 200 µs kernels",
			"ranks8": fmt.Sprintf("8 ranks, an all-reduce a step, %d steps each", o.rankSteps),
		}[job]
		fmt.Fprintf(&b, "\nsimtrain %s: %s; %d interleaved pairs per mode; runs of %v, the first %v of stepping left out\n",
			job, what, o.reps, o.runFor, o.skip)
	}
	fmt.Fprintf(&b, "median [bootstrap 95%% interval]\n")
	fmt.Fprintf(&b, "%-9s %-26s %-28s %-26s %-24s %-20s\n", "mode", "wall/step vs untraced", "trainer CPU µs/step", "µs per launch",
		"gaptrace % of a core", "gaptrace RSS MiB")
	for i, m := range o.modes {
		k := key(job, m)
		seed := o.seed + uint64(i)*7919
		r := BootstrapMedian(res.Ratio[k], 2000, 0.95, seed)
		c := BootstrapMedian(res.CPU[k], 2000, 0.95, seed+1)
		l := BootstrapMedian(res.Launch[k], 2000, 0.95, seed+2)
		side, rss := "-", "-"
		if len(res.SideCPU[k]) > 0 {
			s := BootstrapMedian(res.SideCPU[k], 2000, 0.95, seed+3)
			side = fmt.Sprintf("%.1f [%.1f, %.1f]", 100*s.Value, 100*s.Lo, 100*s.Hi)
		}
		if len(res.SideRSS[k]) > 0 {
			s := BootstrapMedian(res.SideRSS[k], 2000, 0.95, seed+4)
			rss = fmt.Sprintf("%.0f [%.0f, %.0f]", s.Value, s.Lo, s.Hi)
		}
		fmt.Fprintf(&b, "%-9s %-26s %-28s %-26s %-24s %-20s\n", m,
			fmt.Sprintf("%.4f [%.4f, %.4f]", r.Value, r.Lo, r.Hi),
			fmt.Sprintf("%.1f [%.1f, %.1f]", c.Value/1e3, c.Lo/1e3, c.Hi/1e3),
			fmt.Sprintf("%.3f [%.3f, %.3f]", l.Value/1e3, l.Lo/1e3, l.Hi/1e3), side, rss)
	}
	if job == "launch" && len(res.FullShare) > 0 {
		fmt.Fprintf(&b, "auto: median %.1f%% of each traced run at full (per-launch probes attached)\n", 100*stats.Median(res.FullShare))
	}
	if len(res.HangTick) > 0 {
		// The hang watch reads the probes' per-thread state and /proc
		// once a second, off the traced job's path: its cost is gaptrace's
		// own CPU, already in the figures above, not a cost per event.
		fmt.Fprintf(&b, "hang watch: one check a second, median %.0f µs per check (%.3f%% of a core), nothing per event\n",
			stats.Median(res.HangTick)/1e3, stats.Median(res.HangTick)/1e7)
	}
	return b.String()
}
