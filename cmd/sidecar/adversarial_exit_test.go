package main_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// A collector that accepts connections and never answers must not hold
// the job's exit: run returns within 5 s of the command's end.
func TestSilentCollectorExitWithinFiveSeconds(t *testing.T) {
	need(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never read, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	dir := t.TempDir()
	endFile := filepath.Join(dir, "end")
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		script := `"$0" --steps 150 --kernel-us 1000 --stall io.read:every=2:ms=2 --quiet; date +%s.%N > "$1"`
		p := start(t, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
			"--otlp-endpoint", "http://"+ln.Addr().String(), "--otlp-protocol", protocol,
			"--", "sh", "-c", script, filepath.Join(simgpuDir, "simtrain"), endFile)
		// The promise is about waiting on the collector. On a loaded
		// machine gaptrace's own shutdown work also waits for a CPU: the
		// kernel's record of that wait from the command's end on is added
		// to the 5 s.
		rd := testutil.TrackRunDelay(p.cmd.Process.Pid, 20*time.Millisecond)
		var atEnd time.Duration
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			testutil.Poll(2*time.Minute, 20*time.Millisecond, func() bool {
				_, err := os.Stat(endFile)
				select {
				case <-p.done:
				default:
					if err != nil {
						return false
					}
				}
				atEnd = rd.Total()
				return true
			})
		}()
		code := p.wait(t, 2*time.Minute)
		exited := time.Now()
		delay := rd.Stop()
		<-ended
		b, err := os.ReadFile(endFile)
		if err != nil {
			t.Fatalf("%s: the command did not finish: %v\n%s", protocol, err, p.stderr)
		}
		if err := os.Remove(endFile); err != nil {
			t.Fatal(err)
		}
		sec, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		late := exited.Sub(time.Unix(0, int64(sec*1e9)))
		delay -= atEnd
		t.Logf("%s: gaptrace exited %v after the command, %v of it waiting for a CPU", protocol, late.Round(time.Millisecond), delay.Round(time.Millisecond))
		if code != 0 || late > 5*time.Second+delay {
			t.Errorf("%s: exit %d, %v after the command ended (%v of it waiting for a CPU); want 0 within 5 s\n%s",
				protocol, code, late, delay, p.stderr)
		}
	}
}

// A probe detach slower than the bound (held back a minute here) must not
// hold the job's exit: run stops waiting 3 s after the job exited, says
// so, writes its summary and exits within 5 s; and once it is gone nothing
// of it stays attached, not even the uprobes on a process of the job that
// outlives it, which only the kernel can have detached (gaptrace's own
// detach never ran).
func TestSlowDetachExitWithinFiveSeconds(t *testing.T) {
	need(t)
	dir := t.TempDir()
	endFile, orphanFile, seenFile := filepath.Join(dir, "end"), filepath.Join(dir, "orphan"), filepath.Join(dir, "seen")
	sum := filepath.Join(dir, "summary.json")
	// The job leaves a trainer running behind it (its output elsewhere, so
	// that gaptrace's pipes close when gaptrace exits), traced until
	// gaptrace exits, and ends once the test saw that trainer's uprobe
	// links.
	script := `"$0" --steps 100000000 --kernel-us 1000 --quiet </dev/null >/dev/null 2>&1 & echo $! > "$2"
while [ ! -e "$3" ]; do sleep 0.05; done
"$0" --steps 50 --kernel-us 1000 --quiet; date +%s.%N > "$1"`
	environ := append(env(t), "GAPTRACE_TEST_DETACH_DELAY=1m")
	p := start(t, environ, "run", "--live", "off", "--log-level", "debug", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--summary-json", sum,
		"--", "sh", "-c", script, filepath.Join(simgpuDir, "simtrain"), endFile, orphanFile, seenFile)
	// The trainer and its workers are in gaptrace's process group.
	t.Cleanup(func() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) })
	orphan := 0
	testutil.WaitFor(t, time.Minute, "the trainer left behind", func() bool {
		b, err := os.ReadFile(orphanFile)
		orphan, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && orphan > 0
	})
	// Every link gaptrace holds, as its fds say, until it exits.
	held := heldLinks{}
	testutil.WaitFor(t, time.Minute, "uprobe links on the trainer left behind", func() bool {
		held.snapshot(p.cmd.Process.Pid)
		return held.uprobesOn(orphan) > 0
	})
	if err := os.WriteFile(seenFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rd := testutil.TrackRunDelay(p.cmd.Process.Pid, 20*time.Millisecond)
	var atEnd time.Duration
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		testutil.Poll(2*time.Minute, 20*time.Millisecond, func() bool {
			_, err := os.Stat(endFile)
			select {
			case <-p.done:
			default:
				if err != nil {
					return false
				}
			}
			atEnd = rd.Total()
			return true
		})
	}()
	for done := false; !done; {
		select {
		case <-p.done:
			done = true
		case <-time.After(20 * time.Millisecond):
			held.snapshot(p.cmd.Process.Pid)
		}
	}
	exited := time.Now()
	code := p.cmd.ProcessState.ExitCode()
	delay := rd.Stop()
	<-ended
	b, err := os.ReadFile(endFile)
	if err != nil {
		t.Fatalf("the job did not finish: %v\n%s", err, p.stderr)
	}
	sec, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	late := exited.Sub(time.Unix(0, int64(sec*1e9)))
	delay -= atEnd
	t.Logf("gaptrace exited %v after the job, %v of it waiting for a CPU; it held %d links, %d of them uprobes on pid %d",
		late.Round(time.Millisecond), delay.Round(time.Millisecond), len(held), held.uprobesOn(orphan), orphan)
	if code != 0 || late > 5*time.Second+delay {
		t.Errorf("exit %d, %v after the job ended (%v of it waiting for a CPU); want 0 within 5 s\n%s", code, late, delay, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "probes still detaching at the deadline") {
		t.Errorf("gaptrace does not say it stopped waiting for the detach:\n%s", p.stderr)
	}
	if b, err := os.ReadFile(sum); err != nil || !json.Valid(b) {
		t.Errorf("no whole summary written: %v", err)
	}
	if err := syscall.Kill(orphan, 0); err != nil {
		t.Fatalf("the trainer left behind is gone (%v): it no longer shows that the kernel detached its probes", err)
	}
	left := held.stillAttached(t)
	if len(left) > 0 {
		slices.Sort(left)
		t.Errorf("links gaptrace held still attached after it exited: %v", left)
	}
}

// heldLinks is every BPF link a process was seen holding, as its fdinfo
// said: link_id → fdinfo.
type heldLinks map[string]string

// snapshot adds the links pid holds now.
func (held heldLinks) snapshot(pid int) {
	infos, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fdinfo/*", pid))
	for _, f := range infos {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if id, ok := strings.CutPrefix(l, "link_id:"); ok {
				held[strings.TrimSpace(id)] = string(b)
			}
		}
	}
}

// uprobesOn counts the held links that probe process pid.
func (held heldLinks) uprobesOn(pid int) (n int) {
	for _, info := range held {
		if strings.Contains(info, "probe") && strings.Contains(info, fmt.Sprintf("pid:\t%d\n", pid)) {
			n++
		}
	}
	return n
}

// stillAttached returns the held links still attached after polling for
// up to 20 s (none, once the holder exited and the kernel detached them).
func (held heldLinks) stillAttached(t *testing.T) []string {
	t.Helper()
	var left []string
	testutil.Poll(20*time.Second, 100*time.Millisecond, func() bool {
		left = left[:0]
		for id := range held {
			n, _ := strconv.ParseUint(id, 10, 32)
			l, err := link.NewFromID(link.ID(n))
			if err == nil {
				l.Close()
				left = append(left, id)
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("link %s: %v", id, err)
			}
		}
		return len(left) == 0
	})
	return left
}
