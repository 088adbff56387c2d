package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Job is one trainer of jobs/.
type Job struct {
	Name string
	// Source is the file in jobs/: a .py is run with python3, a .c built
	// against the simulated libcuda.
	Source string
	// Strip builds a C job without symbols.
	Strip bool
	// DataFlag names the job's flag for a directory on disk ("" for none).
	DataFlag string
	Desc     string
}

// Jobs are the cross-check trainers, in table order.
var Jobs = []Job{
	{Name: "graph_saver", Source: "graph_saver.py",
		Desc: "Python: one CUDA graph replayed per step + scalar loss read; saver thread copies weights every 20 steps; 60 ms Python stall meanwhile"},
	{Name: "accum", Source: "accum.c",
		Desc: "C, worker pthread: 4 micro-batches (loss read each) + optimizer update per step; eval every 15 steps with sync copies; sleep and cpu stalls"},
	{Name: "sparse_loss", Source: "sparse_loss.py", DataFlag: "--data-dir",
		Desc: "Python class loop: loss read every 10 iterations (event sync); EMA thread copies and syncs; fsync'd metrics and sleep stalls"},
	{Name: "mp_loader", Source: "mp_loader.py",
		Desc: "Python: multiprocessing workers over queues, one 45 ms/batch slow worker (loader.wait.cpu); sync copies + ctx sync"},
	{Name: "gil_gc", Source: "gil_gc.py",
		Desc: "Python, per-thread default stream: GIL-holding metrics thread (lock), 60 ms pure-Python cpu stall, gc.collect stall"},
	{Name: "blocking_misc", Source: "blocking_misc.py", DataFlag: "--data-dir",
		Desc: "Python: log writes into a slow reader's pipe, subprocess.run(sleep 0.08), cold mmap pages"},
	{Name: "ckpt", Source: "ckpt.c", DataFlag: "--dir",
		Desc: "C, legacy stream: loss read copy+sync; save_checkpoint every 25 steps copies 48 tensors with the same copy+sync, writes, fsyncs"},
	{Name: "stripped", Source: "stripped.c", Strip: true,
		Desc: "C built with -s, no Python: copy stream + event wait, 8 kernels, event sync; sleep stall (code cannot be named)"},
	{Name: "sync_logger", Source: "sync_logger.py",
		Desc: "Python: HTTP POST to a slow tracking server, os.system hook, logging into a slow pipe; cpu two calls deep beside a QueueListener's blocked writes; json.dumps"},
	{Name: "prefetch_queue", Source: "prefetch_queue.py", DataFlag: "--dir",
		Desc: "Python: queue.get on a prefetch thread decoding (lock) or reading a cold shard (io.read); small writes + fsync checkpoint; mmap slice copy; metrics lock held asleep"},
	{Name: "hf_trainer", Source: "hf_trainer.py", DataFlag: "--data-dir",
		Desc: "Python, Trainer-shaped: accumulation 8, no per-step sync, loss read every 5th step; eval every 40 (15 reads), checkpoint every 60 (24 sync copies)"},
	{Name: "lightning_hooks", Source: "lightning_hooks.py",
		Desc: "Python, fit-loop-shaped: step through callbacks and strategy; loss logged every step by a callback through the chain validation logs by (12 batches every 30)"},
	{Name: "two_graphs", Source: "two_graphs.py",
		Desc: "Python: 15 eager warm-up steps, then a train graph + scalar read each step, an eval graph + read every 10 through the same reader"},
	{Name: "varmicro", Source: "varmicro.py",
		Desc: "Python: 2-6 micro-batches a step (data decides), no reads; one event record+sync a step from a helper evaluate() uses 10 times every 25"},
	{Name: "split_threads", Source: "split_threads.c",
		Desc: "C: a producer pthread launches and records an event, a consumer pthread waits on it and reads the loss on its own stream; 2 steps ahead"},
}

// pickJobs returns the jobs named in the comma-separated list (all when
// empty).
func pickJobs(list string) ([]Job, error) {
	if list == "" {
		return Jobs, nil
	}
	var out []Job
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, j := range Jobs {
			if j.Name == name {
				out, found = append(out, j), true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown job %q (jobs: %s)", name, jobNames())
		}
	}
	return out, nil
}

func jobNames() string {
	var n []string
	for _, j := range Jobs {
		n = append(n, j.Name)
	}
	return strings.Join(n, ",")
}

// argv is the job's command line, writing its truth to truth and its data
// under dir; bin is where buildJobs put the C programs.
func (j Job) argv(cfg *Config, bin, truth, dir string) []string {
	var a []string
	if strings.HasSuffix(j.Source, ".py") {
		a = []string{cfg.Python, filepath.Join(cfg.JobsDir, j.Source), "--lib", cfg.SimGPU}
	} else {
		a = []string{filepath.Join(bin, j.Name)}
	}
	a = append(a, "--truth", truth)
	if j.DataFlag != "" {
		a = append(a, j.DataFlag, dir)
	}
	return a
}

// buildJobs compiles the C jobs into bin against the simulated libcuda.
func buildJobs(cfg *Config, jobs []Job, bin string) error {
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, j := range jobs {
		if !strings.HasSuffix(j.Source, ".c") {
			continue
		}
		args := []string{"-O2", "-Wall", "-pthread", "-I", filepath.Join(cfg.Root, "testdata", "simgpu"),
			"-o", filepath.Join(bin, j.Name), filepath.Join(cfg.JobsDir, j.Source),
			"-L", cfg.SimGPU, "-l:libcuda.so.1", "-Wl,-rpath," + cfg.SimGPU}
		if j.Strip {
			args = append([]string{"-s"}, args...)
		} else {
			args = append([]string{"-g"}, args...)
		}
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", j.Source, err, out)
		}
	}
	return nil
}
