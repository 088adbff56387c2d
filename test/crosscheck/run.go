package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// attachAfter is how many steps the job has written before the attach
	// mode runs gaptrace attach --pid.
	attachAfter = 15
	// runDeadline bounds one job under gaptrace; a job takes ~5-15 s.
	runDeadline = 3 * time.Minute
)

// Config is what every run needs.
type Config struct {
	Root                     string // repository root
	JobsDir                  string
	Gaptrace, SimGPU, Python string
	Out                      string // out/crosscheck
}

// RunOut names one run's files.
type RunOut struct {
	Dir, Truth, Gaps, Spans, Summary, Log string
	// Attached is when gaptrace's last uprobes on the job were in (Unix ns).
	Attached int64
}

func newRunOut(dir string) *RunOut {
	return &RunOut{Dir: dir, Truth: filepath.Join(dir, "truth.jsonl"), Gaps: filepath.Join(dir, "gaps.jsonl"),
		Spans: filepath.Join(dir, "spans.jsonl"), Summary: filepath.Join(dir, "summary.json"),
		Log: filepath.Join(dir, "gaptrace.log")}
}

// runJob runs job under mode (full, auto, lite, attach) and returns its
// files; the job's pid is in its truth.
func runJob(cfg *Config, j Job, mode string) (*RunOut, error) {
	ro := newRunOut(filepath.Join(cfg.Out, j.Name+"-"+mode))
	if err := os.RemoveAll(ro.Dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(ro.Dir, 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	probes := mode
	if mode == "attach" {
		probes = "auto" // the default a user gets
	}
	common := []string{"--probes", probes, "--live", "off", "--log-level", "debug",
		"--gaps-out", ro.Gaps, "--spans-out", ro.Spans, "--summary-json", ro.Summary,
		"--nvml-lib", filepath.Join(cfg.SimGPU, "libnvidia-ml.so.1")}
	env := append(os.Environ(), "SIMGPU_DIR="+ro.Dir)
	argv := j.argv(cfg, filepath.Join(cfg.Out, "bin"), ro.Truth, ro.Dir)
	var err error
	if mode == "attach" {
		err = runAttached(ctx, cfg, ro, argv, common, env)
	} else {
		cmd := exec.CommandContext(ctx, cfg.Gaptrace, append(append([]string{"run"}, common...), append([]string{"--"}, argv...)...)...)
		cmd.Dir, cmd.Env = ro.Dir, env
		var out []byte
		out, err = cmd.CombinedOutput()
		if werr := os.WriteFile(ro.Log, out, 0o644); werr != nil && err == nil {
			err = werr
		}
		if err != nil {
			err = fmt.Errorf("gaptrace run: %w (log %s)", err, ro.Log)
		}
	}
	if err != nil {
		return ro, err
	}
	return ro, nil
}

// runAttached starts the job, waits for attachAfter steps in its truth,
// then traces it with gaptrace attach --pid until it exits.
func runAttached(ctx context.Context, cfg *Config, ro *RunOut, argv, common, env []string) error {
	jobLog, err := os.Create(filepath.Join(ro.Dir, "job.log"))
	if err != nil {
		return err
	}
	defer jobLog.Close()
	job := exec.CommandContext(ctx, argv[0], argv[1:]...)
	job.Dir, job.Env, job.Stdout, job.Stderr = ro.Dir, env, jobLog, jobLog
	if err := job.Start(); err != nil {
		return fmt.Errorf("start %s: %w", argv[0], err)
	}
	jobDone := make(chan error, 1)
	go func() { jobDone <- job.Wait() }()
	if err := waitSteps(ctx, ro.Truth, attachAfter, jobDone); err != nil {
		_ = job.Process.Kill()
		return err
	}
	args := append(append([]string{"attach"}, common...), "--pid", strconv.Itoa(job.Process.Pid))
	gt := exec.Command(cfg.Gaptrace, args...)
	gt.Dir, gt.Env = ro.Dir, env
	gtLog, err := os.Create(ro.Log)
	if err != nil {
		return err
	}
	defer gtLog.Close()
	gt.Stdout, gt.Stderr = gtLog, gtLog
	if err := gt.Start(); err != nil {
		_ = job.Process.Kill()
		return fmt.Errorf("start gaptrace attach: %w", err)
	}
	gtDone := make(chan error, 1)
	go func() { gtDone <- gt.Wait() }()
	var jobErr error
	select {
	case jobErr = <-jobDone:
	case err := <-gtDone:
		_ = job.Process.Kill()
		killed := <-jobDone
		return fmt.Errorf("gaptrace attach exited before the job: %w (log %s)", errors.Join(err, killed), ro.Log)
	}
	// gaptrace ends once its target has exited; give it a deadline, then
	// ask it to stop.
	select {
	case err = <-gtDone:
	case <-time.After(30 * time.Second):
		_ = gt.Process.Signal(syscall.SIGINT)
		err = <-gtDone
	}
	if jobErr != nil {
		return fmt.Errorf("job %s: %w (log %s)", argv[0], jobErr, jobLog.Name())
	}
	if err != nil {
		return fmt.Errorf("gaptrace attach: %w (log %s)", err, ro.Log)
	}
	return nil
}

// waitSteps waits until the truth file holds n step records, the job exits
// or ctx ends.
func waitSteps(ctx context.Context, truth string, n int, done <-chan error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if countSteps(truth) >= n {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("job exited (%w) before %d steps", err, n)
		case <-ctx.Done():
			return fmt.Errorf("job wrote fewer than %d steps in %v", n, runDeadline)
		case <-tick.C:
		}
	}
}

func countSteps(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), `"type": "step"`) + strings.Count(string(b), `"type":"step"`)
}

// attachRE matches the tracer's log line for attached uprobes.
var attachRE = regexp.MustCompile(`^time=(\S+) .*msg="uprobes attached" .*pid=(\d+) `)

// attachTime is when the last uprobes for pid were attached, from
// gaptrace's debug log.
func attachTime(logPath string, pid int) (int64, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var at int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		m := attachRE.FindStringSubmatch(sc.Text())
		if len(m) < 3 || m[2] != strconv.Itoa(pid) {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return 0, fmt.Errorf("%s: bad time in %q: %w", logPath, sc.Text(), err)
		}
		at = max(at, t.UnixNano())
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if at == 0 {
		return 0, errors.New("gaptrace never attached uprobes to pid " + strconv.Itoa(pid) + " (log " + logPath + ")")
	}
	return at, nil
}
