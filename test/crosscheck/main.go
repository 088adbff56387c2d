package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
)

// Modes are the probe modes in table order.
var Modes = []string{"full", "auto", "lite", "attach"}

func main() {
	gaptrace := flag.String("gaptrace", "bin/gaptrace", "gaptrace binary")
	sim := flag.String("simgpu", "build/simgpu", "directory of the simulated GPU libraries (make simgpu)")
	jobs := flag.String("jobs", "", "comma-separated jobs (default all: "+jobNames()+")")
	modes := flag.String("modes", strings.Join(Modes, ","), "comma-separated modes: full, auto, lite, attach")
	out := flag.String("out", "out/crosscheck", "where each run's inputs and outputs are kept")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "crosscheck: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	cfg, js, ms, err := setup(*gaptrace, *sim, *out, *jobs, *modes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crosscheck:", err)
		os.Exit(2)
	}
	scores, err := runAll(cfg, js, ms, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crosscheck:", err)
		os.Exit(1)
	}
	met, missed := printTable(os.Stdout, scores)
	if missed > 0 || met == 0 {
		os.Exit(1)
	}
}

// setup checks the arguments and builds the C jobs.
func setup(gaptrace, sim, out, jobs, modes string) (*Config, []Job, []string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, nil, nil, err
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		wd, _ := os.Getwd()
		return filepath.Join(wd, p)
	}
	cfg := &Config{Root: root, JobsDir: filepath.Join(root, "test", "crosscheck", "jobs"),
		Gaptrace: abs(gaptrace), SimGPU: abs(sim), Out: abs(out)}
	if st, err := os.Stat(cfg.Gaptrace); err != nil || st.IsDir() {
		return nil, nil, nil, fmt.Errorf("-gaptrace %s: not a file (make build)", gaptrace)
	}
	if _, err := os.Stat(filepath.Join(cfg.SimGPU, "libcuda.so.1")); err != nil {
		return nil, nil, nil, fmt.Errorf("-simgpu %s: no libcuda.so.1 there (make simgpu)", sim)
	}
	if cfg.Python, err = exec.LookPath("python3"); err != nil {
		return nil, nil, nil, errors.New("python3 not found: the Python jobs need it")
	}
	js, err := pickJobs(jobs)
	if err != nil {
		return nil, nil, nil, err
	}
	var ms []string
	for _, m := range strings.Split(modes, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(Modes, m) {
			return nil, nil, nil, fmt.Errorf("unknown mode %q (modes: full,auto,lite,attach)", m)
		}
		ms = append(ms, m)
	}
	if err := buildJobs(cfg, js, filepath.Join(cfg.Out, "bin")); err != nil {
		return nil, nil, nil, err
	}
	return cfg, js, ms, nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test", "crosscheck", "jobs")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the repository (no test/crosscheck/jobs above the working directory)")
		}
		dir = parent
	}
}

// runAll runs and scores every job × mode, logging progress to log.
func runAll(cfg *Config, jobs []Job, modes []string, log io.Writer) ([]*Score, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("gaptrace loads eBPF programs: run as root")
	}
	var scores []*Score
	for _, j := range jobs {
		for _, m := range modes {
			ro, err := runJob(cfg, j, m)
			var sc *Score
			if err != nil {
				sc = &Score{Job: j.Name, Mode: m, Clock: "-", Err: err}
			} else {
				sc = scoreRun(j, m, ro)
			}
			fmt.Fprintf(log, "%s/%s: %d/%d steps, met %d, missed %d%s\n", j.Name, m, sc.Steps, sc.TrueSteps,
				len(sc.Met), len(sc.Missed), errNote(sc.Err))
			scores = append(scores, sc)
		}
	}
	return scores, nil
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return ": NOT SCORED: " + err.Error()
}

// printTable writes the table and the final line; it returns the targets
// met and missed (a run that could not be scored misses one).
func printTable(w io.Writer, scores []*Score) (met, missed int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "job\tmode\ttrue\tsteps\tratio\tstep_clock\tstalls: cause share / code named [top label]\tother")
	for _, sc := range scores {
		if sc.Err != nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\tNOT SCORED: %s\t-\n", sc.Job, sc.Mode, oneLine(sc.Err.Error()))
			missed++
			continue
		}
		ratio := "-"
		if sc.TrueSteps > 0 {
			ratio = fmt.Sprintf("%.3f", float64(sc.Steps)/float64(sc.TrueSteps))
		}
		steps := fmt.Sprint(sc.Steps)
		if sc.Windows > 0 {
			steps += fmt.Sprintf(" (%d win)", sc.Windows)
		}
		var cells []string
		for _, k := range sc.Kinds {
			share := "—"
			if k.Share() >= 0 {
				share = fmt.Sprintf("%.2f", k.Share())
			}
			code := "n/a"
			if k.Nameable && k.Gapped > 0 {
				code = fmt.Sprintf("%.2f", float64(k.Named)/float64(k.Gapped))
			}
			short := ""
			if k.Short > 0 {
				short = fmt.Sprintf(" (+%d short)", k.Short)
			}
			if idle := k.Stalls - k.Gapped; idle > 0 {
				short += fmt.Sprintf(" (%d under no gap)", idle)
			}
			cells = append(cells, fmt.Sprintf("%s ×%d%s %s/%s [%s]", k.Kind, k.Stalls, short, share, code, k.Top()))
		}
		other := "—"
		if sc.IdleNS > 0 {
			other = fmt.Sprintf("%.3f", sc.OtherNS/sc.IdleNS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", sc.Job, sc.Mode, sc.TrueSteps, steps, ratio,
			sc.Clock, strings.Join(cells, "; "), other)
		met += len(sc.Met)
		missed += len(sc.Missed)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d targets met, %d missed\n", met, missed)
	return met, missed
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
