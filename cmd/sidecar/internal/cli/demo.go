package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/correlate"
)

// simgpuFiles must all exist in a simulated-GPU directory.
var simgpuFiles = []string{"simtrain", "libcuda.so.1", "libnccl.so.2", "libnvidia-ml.so.1"}

// demoStall is one injected stall of the demo's mix: a cause, how often
// (every Nth step) and how long.
type demoStall struct {
	cause string
	every int
	ms    int
}

// demoMix resembles a real job's: frequent small input stalls, data-loader
// waits of both kinds, a periodic checkpoint write, synchronous logging
// over a socket, launch-bound CPU time, a late collective, a pageable copy,
// a noisy neighbour and a stray sleep.
var demoMix = []demoStall{
	{"io.read", 5, 20},
	{"loader.wait.io", 8, 30},
	{"loader.wait.cpu", 12, 25},
	{"net", 10, 15},
	{"io.write", 50, 150},
	{"cpu", 3, 8},
	{"comm", 9, 20},
	{"cuda.memcpy", 15, 10},
	{"cpu.contention", 20, 15},
	{"sleep", 25, 10},
}

const (
	demoKernels  = 10
	demoKernelUS = 2000
	demoGapUS    = 20
)

// demoArgs builds the simtrain command line for about d of training.
func demoArgs(simtrain, dataDir string, d time.Duration) []string {
	perStep := float64(demoKernels*(demoKernelUS+demoGapUS)) / 1000 // ms
	for _, s := range demoMix {
		perStep += float64(s.ms) / float64(s.every)
	}
	steps := max(50, int(float64(d.Milliseconds())/perStep))
	args := []string{simtrain, "--steps", strconv.Itoa(steps),
		"--kernels-per-step", strconv.Itoa(demoKernels), "--kernel-us", strconv.Itoa(demoKernelUS),
		"--launch-gap-us", strconv.Itoa(demoGapUS), "--workers", "2", "--data-dir", dataDir, "--quiet"}
	for _, s := range demoMix {
		args = append(args, "--stall", fmt.Sprintf("%s:every=%d:ms=%d", s.cause, s.every, s.ms))
	}
	return args
}

func hasSimGPU(dir string) bool {
	for _, f := range simgpuFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}

// findSimGPU locates the simulated GPU: $GAPTRACE_SIMGPU, then build/simgpu
// of the repository the binary was built in (bin/gaptrace → ../build), then
// of the working directory. When none exists but the sources do, it builds
// them with make.
func findSimGPU(deps Deps, log func(string, ...any)) (string, error) {
	if d := deps.Getenv("GAPTRACE_SIMGPU"); d != "" {
		if hasSimGPU(d) {
			return d, nil
		}
		return "", fmt.Errorf("GAPTRACE_SIMGPU=%s does not hold %v (build it with 'make simgpu')", d, simgpuFiles)
	}
	var roots []string
	if exe, err := deps.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			roots = append(roots, filepath.Dir(filepath.Dir(exe)))
		}
	}
	if wd, err := os.Getwd(); err == nil {
		roots = append(roots, wd)
	}
	for _, r := range roots {
		if d := filepath.Join(r, "build", "simgpu"); hasSimGPU(d) {
			return d, nil
		}
	}
	for _, r := range roots {
		if _, err := os.Stat(filepath.Join(r, "testdata", "simgpu", "Makefile")); err != nil {
			continue
		}
		log("building the simulated GPU", "dir", filepath.Join(r, "build", "simgpu"))
		cmd := exec.Command("make", "-C", r, "simgpu")
		cmd.Stdout, cmd.Stderr = deps.Stderr, deps.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("build the simulated GPU (make -C %s simgpu): %w", r, err)
		}
		if d := filepath.Join(r, "build", "simgpu"); hasSimGPU(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("simulated GPU not found: set GAPTRACE_SIMGPU to a directory with %v, or run 'make demo' in the gaptrace repository", simgpuFiles)
}

// demoOutputProblems checks the demo's outputs once --out has filled in
// their defaults. A file under an --out directory that does not exist yet
// cannot be anything unsafe; its directory is created later.
func demoOutputProblems(cfg *config.Config) config.Problems {
	if _, err := os.Stat(cfg.OutDir); err != nil {
		return nil // creatable: config checked its nearest existing parent
	}
	return cfg.OutputProblems()
}

func demoCmd(ctx context.Context, args []string, deps Deps) int {
	cfg, code, ok := load(config.CmdDemo, args, deps)
	if !ok {
		return code
	}
	outDir := absOrSame(cfg.OutDir)
	setDefault := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	setDefault(&cfg.GapsOut, filepath.Join(outDir, "gaptrace-gaps.jsonl"))
	setDefault(&cfg.SummaryJSON, filepath.Join(outDir, "gaptrace-summary.json"))
	setDefault(&cfg.SpansOut, filepath.Join(outDir, config.DefaultSpansFile))
	setDefault(&cfg.PerfettoOut, filepath.Join(outDir, "gaptrace-trace.json"))
	// The files under --out are refused as any named output is, before
	// anything loads; a directory that does not exist yet is made below.
	if p := demoOutputProblems(&cfg); len(p) > 0 {
		fmt.Fprintf(deps.Stderr, "gaptrace %s: invalid configuration:\n", config.CmdDemo)
		for _, msg := range p {
			fmt.Fprintf(deps.Stderr, "  - %s\n", msg)
		}
		return ExitUsage
	}
	out := newOutput(&cfg, deps)
	log := out.log.With("component", "cli")
	if err := deps.Privileged(); err != nil {
		return fail(deps, config.CmdDemo, "cannot trace: %v", err)
	}
	sim, err := findSimGPU(deps, log.Info)
	if err != nil {
		return fail(deps, config.CmdDemo, "%v", err)
	}
	sim, _ = filepath.Abs(sim)
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return fail(deps, config.CmdDemo, "create output directory: %v", err)
	}
	setDefault(&cfg.NVMLLib, filepath.Join(sim, "libnvidia-ml.so.1"))
	setDefault(&cfg.CUDALib, filepath.Join(sim, "libcuda.so.1"))
	setDefault(&cfg.NCCLLib, filepath.Join(sim, "libnccl.so.2"))
	setDefault(&cfg.JobID, "gaptrace-demo")

	// The simulated GPU keeps its timeline in SIMGPU_DIR; the trainer and
	// the simulated NVML loaded into gaptrace itself must agree on it.
	tmp, err := os.MkdirTemp("", "gaptrace-demo-")
	if err != nil {
		return fail(deps, config.CmdDemo, "temporary directory: %v", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Setenv("SIMGPU_DIR", tmp); err != nil {
		return fail(deps, config.CmdDemo, "set SIMGPU_DIR: %v", err)
	}
	env := append(childEnv(deps.Environ()), "SIMGPU_DIR="+tmp)
	argv := demoArgs(filepath.Join(sim, "simtrain"), filepath.Join(tmp, "data"), cfg.DemoFor)

	fmt.Fprintf(deps.Stdout, "gaptrace demo: tracing the simulated trainer for about %v (no GPU needed)\n"+
		"  simulated GPU: %s\n  injected stalls:", cfg.DemoFor, sim)
	for _, s := range demoMix {
		fmt.Fprintf(deps.Stdout, " %s", s.cause)
	}
	fmt.Fprintf(deps.Stdout, "\n  outputs: %s\n\n", outDir)
	var sum correlate.Summary
	code = runSession(ctx, &cfg, deps, out, argv, env, &sum)
	if code == ExitOK && sum.Steps == 0 {
		// The trainer ran its steps: a demo that found none saw nothing of
		// it, and an empty result is no success.
		fmt.Fprintf(deps.Stderr, "gaptrace demo: FAILED: the simulated trainer ran, but gaptrace saw %d steps and %d gaps of it: "+
			"its CUDA calls never reached the probes.\n"+
			"  Run 'gaptrace check' for what this host lacks, and the demo again with --log-level debug to see what attached;\n"+
			"  please report it with that output if check finds nothing wrong.\n", sum.Steps, sum.Gaps)
		return ExitFailure
	}
	if code == ExitOK {
		fmt.Fprintf(deps.Stdout, "\nopen %s for one JSON line per gap, load %s into Jaeger/Tempo (see README),\n"+
			"or open %s in ui.perfetto.dev\n", cfg.GapsOut, cfg.SpansOut, cfg.PerfettoOut)
	}
	return code
}
