package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ThreadRunDelay is how long thread tid of pid has been runnable without a
// CPU, as the kernel's schedstat accounts it (field 2 of
// /proc/PID/task/TID/schedstat).
func ThreadRunDelay(pid, tid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
	if err != nil {
		return 0, fmt.Errorf("read schedstat: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("schedstat of %d/%d: %q has no run delay", pid, tid, b)
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat of %d/%d: %w", pid, tid, err)
	}
	return time.Duration(ns), nil
}

// RunDelay follows, while a process runs, the time its threads wait
// runnable for a CPU. Timing tests judge a deadline against it: on a
// loaded machine a process meets a wall-clock promise late by up to what
// the kernel made it wait, and that wait is recorded, not guessed.
//
// It is the sum over threads, each at its last sample (a thread that
// exited keeps the value it had), so it bounds the wait on any one chain
// of work from above.
type RunDelay struct {
	pid  int
	mu   sync.Mutex
	last map[int]time.Duration
	stop chan struct{}
	done chan struct{}
}

// TrackRunDelay samples pid's threads every interval until Stop or the
// process's exit.
func TrackRunDelay(pid int, interval time.Duration) *RunDelay {
	r := &RunDelay{pid: pid, last: map[int]time.Duration{}, stop: make(chan struct{}), done: make(chan struct{})}
	r.sample()
	go func() {
		defer close(r.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
				if !r.sample() {
					return
				}
			}
		}
	}()
	return r
}

// sample reads every thread of the process; false once it is gone.
func (r *RunDelay) sample() bool {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(r.pid), "task"))
	if err != nil {
		return false
	}
	for _, e := range tasks {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if d, err := ThreadRunDelay(r.pid, tid); err == nil {
			r.mu.Lock()
			r.last[tid] = d
			r.mu.Unlock()
		}
	}
	return true
}

// Total is the process's run delay so far (at the last sample).
func (r *RunDelay) Total() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum time.Duration
	for _, d := range r.last {
		sum += d
	}
	return sum
}

// Stop ends the sampling and returns Total.
func (r *RunDelay) Stop() time.Duration {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	return r.Total()
}
