package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The jobs bench measures (-jobs): what tracing costs depends on what the
// job makes the probes see.
//
//	launch  one process, -kernels 1 µs kernels a step launched back to back
//	loader  a trainer fed by 2 data-loader worker processes (cold reads and
//	        CPU work for a batch every step), 8 kernels of 200 µs a step
//	ranks8  8 processes: 8 ranks on 8 simulated devices, an all-reduce a
//	        step; each runs -rank-steps steps and stops on its own (a rank
//	        stopped by a signal would leave its peers in the all-reduce)
var knownJobs = []string{"launch", "loader", "ranks8"}

// jobArgv is the job's command line; truth is where it writes the truth
// that is measured (rank 0's for ranks8), dir the run's folder. signal
// says whether the job is stopped by SIGINT after -run.
func jobArgv(o options, job, dir, truth string) (argv []string, env []string, signal bool) {
	sim := filepath.Join(o.simgpu, "simtrain")
	switch job {
	case "loader":
		return []string{sim, "--steps", "1000000000", "--workers", "2", "--data-dir", dir, "--quiet", "--truth", truth,
			"--stall", "loader.wait.io:every=2:ms=4", "--stall", "loader.wait.cpu:every=3:ms=4"}, nil, true
	case "ranks8":
		var b strings.Builder
		id := fmt.Sprintf("bench-%d-%d", os.Getpid(), time.Now().UnixNano())
		for r := range 8 {
			t := filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r))
			if r == 0 {
				t = truth
			}
			fmt.Fprintf(&b, "%s --rank %d --nranks 8 --device %d --steps %d --collectives 1 --kernels-per-step 9 "+
				"--kernel-us 1500 --launch-gap-us 20 --comm-id %s --workers 0 --quiet --truth %s & ",
				sim, r, r, o.rankSteps, id, t)
		}
		b.WriteString("wait")
		return []string{"/bin/sh", "-c", b.String()}, []string{"SIMGPU_DEVICES=8"}, false
	}
	// A small batch: the step is the launches and one sync, not a copy.
	return []string{sim, "--steps", "1000000000", "--kernels-per-step", strconv.Itoa(o.kernels),
		"--kernel-us", "1", "--launch-gap-us", "0", "--batch-bytes", "4096", "--workers", "0", "--quiet", "--truth", truth}, nil, true
}

// key names a job's mode in the results; the launch job keeps the bare
// mode, as files saved before there were jobs have it.
func key(job, mode string) string {
	if job == "launch" {
		return mode
	}
	return job + "/" + mode
}

// cpuMeter follows gaptrace's CPU time (user + system, /proc/PID/stat)
// from its first reading on, at most every half second.
type cpuMeter struct {
	pid          int
	t0, t1       time.Time
	ticks0, tick int64
}

func (m *cpuMeter) read(now time.Time) {
	if !m.t1.IsZero() && now.Sub(m.t1) < 500*time.Millisecond {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.pid))
	if err != nil {
		return
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	if m.t0.IsZero() {
		m.t0, m.ticks0 = now, u+st
	}
	m.t1, m.tick = now, u+st
}

// share is the CPU time between the first and last reading as a share of
// one core (clock ticks of 10 ms); -1 under 2 s of readings.
func (m *cpuMeter) share() float64 {
	span := m.t1.Sub(m.t0).Seconds()
	if span < 2 {
		return -1
	}
	return float64(m.tick-m.ticks0) / 100 / span
}

// sidecarRSS is gaptrace's peak RSS in MiB from a run's summary (-1: none).
func sidecarRSS(dir string) float64 {
	var sum struct {
		Sidecar *struct {
			MaxRSS int64 `json:"max_rss_bytes"`
		} `json:"sidecar"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil || json.Unmarshal(b, &sum) != nil || sum.Sidecar == nil {
		return -1
	}
	return float64(sum.Sidecar.MaxRSS) / (1 << 20)
}
