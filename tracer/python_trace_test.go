package tracer

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// TestPyStacksTraced traces testdata/pystacks.py under each interpreter
// found here and checks the Python frames the programs captured:
//   - the sleeps of the main thread, from the first one with Python frames
//     on, name nap() and outer() at the lines the script recorded;
//   - the churn thread's freshly compiled, called and dropped functions
//     never get another function's line (gen_I sleeps on line I%500+2):
//     a freed code object reused by the next one is re-read or cut off;
//   - the deep recursion's stacks are flagged truncated, and keep their
//     innermost frames.
func TestPyStacksTraced(t *testing.T) {
	for _, py := range testutil.Pythons(t) {
		t.Run(testName(py), func(t *testing.T) { tracePyStacks(t, py) })
	}
}

type pyTruth struct {
	PID         uint32 `json:"pid"`
	TID         uint32 `json:"tid"`
	File        string `json:"file"`
	NapLine     int    `json:"nap_line"`
	OuterLine   int    `json:"outer_line"`
	RecLine     int    `json:"rec_line"`
	ChurnTID    uint32 `json:"churn_tid"`
	DeepTID     uint32 `json:"deep_tid"`
	ChurnRounds int    `json:"churn_rounds"`
}

func tracePyStacks(t *testing.T, py string) {
	tr := newTestTracer(t, Config{Probes: ProbesFull, SyscallThreshold: 10 * time.Microsecond})
	script, err := filepath.Abs(filepath.Join("testdata", "pystacks.py"))
	if err != nil {
		t.Fatal(err)
	}
	const naps = 150
	cmd := exec.Command("/bin/sh", "-c", `read _ && exec "$0" "$@"`, py, script, strconv.Itoa(naps))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	defer func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	if err := tr.Trace(int(pid)); err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("Trace: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evc := make(chan event.Event, 4096)
	runErr := make(chan error, 1)
	go func() { runErr <- tr.Run(ctx, evc) }()
	var events []event.Event
	var mainSleeps atomic.Int64
	exited := make(chan struct{})
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for ev := range evc {
			events = append(events, ev)
			if ev.PID == pid && ev.TID == pid && ev.Kind == event.KindSyscall && ev.Syscall == event.SysSleep {
				mainSleeps.Add(1)
			}
			if ev.Kind == event.KindExit && ev.PID == pid && ev.TID == pid {
				close(exited)
			}
		}
	}()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("%s pystacks.py: %v", py, err)
	}
	// The script waits until the tracer has taken the main thread's sleeps
	// (a loaded machine delays the consumer): the stacks are resolved
	// while the process can still be read.
	for deadline := time.Now().Add(60 * time.Second); mainSleeps.Load() < naps && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s pystacks.py: %v", py, err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Errorf("exit of pid %d not seen within 30s", pid)
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(evc)
	<-collected

	var truth pyTruth
	if err := json.Unmarshal([]byte(line), &truth); err != nil {
		t.Fatalf("truth %q: %v", line, err)
	}
	if truth.PID != pid {
		t.Fatalf("truth pid %d, traced %d", truth.PID, pid)
	}
	checkPyStacks(t, events, pid, truth, naps)
}

// checkPyStacks checks the sleeps of pystacks.py's threads against its
// truth: the main thread's naps name nap and outer at their lines, the
// churn thread's frames name gen functions at theirs, and the deep
// thread's stacks are flagged truncated.
func checkPyStacks(t *testing.T, events []event.Event, pid uint32, truth pyTruth, naps int) {
	t.Helper()
	genRe := regexp.MustCompile(`^gen_(\d+)$`)
	var napsEarly, napsSeen, napsNamed, churnStacks, churnFrames, churnTrunc, deepStacks, deepTrunc int
	for _, ev := range events {
		// time.sleep is clock_nanosleep from 3.11 on, select on no file
		// descriptor before: a sleep both ways.
		if ev.PID != pid || ev.Kind != event.KindSyscall || ev.Syscall != event.SysSleep {
			continue
		}
		switch ev.TID {
		case truth.TID:
			if napsSeen == 0 && !hasPyFrame(ev.Stack) {
				// before the tracer found the interpreter (the loader
				// maps it after exec; a loaded machine delays the rescan)
				napsEarly++
				continue
			}
			napsSeen++
			if i := pyFrameIndex(ev.Stack, "nap"); i >= 0 && i+1 < len(ev.Stack) &&
				ev.Stack[i] == (event.Frame{Function: "nap", File: truth.File, Line: truth.NapLine}) &&
				ev.Stack[i+1] == (event.Frame{Function: "outer", File: truth.File, Line: truth.OuterLine}) {
				napsNamed++
			} else if napsSeen-napsNamed <= 3 {
				t.Logf("nap sleep stack: %v truncated %v", ev.Stack, ev.StackTruncated)
			}
		case truth.ChurnTID:
			churnStacks++
			if ev.StackTruncated {
				churnTrunc++
			}
			for _, f := range ev.Stack {
				m := genRe.FindStringSubmatch(f.Function)
				if m == nil {
					continue
				}
				churnFrames++
				i, _ := strconv.Atoi(m[1])
				if f.File != "churn.py" || f.Line != i%500+2 {
					t.Errorf("churn frame %+v: want churn.py line %d (stack %v, truncated %v)", f, i%500+2, ev.Stack, ev.StackTruncated)
				}
			}
		case truth.DeepTID:
			deepStacks++
			i := pyFrameIndex(ev.Stack, "rec")
			if i < 0 {
				continue
			}
			if ev.Stack[i] != (event.Frame{Function: "rec", File: truth.File, Line: truth.RecLine}) {
				t.Errorf("innermost rec frame %+v, want line %d", ev.Stack[i], truth.RecLine)
			}
			if ev.StackTruncated {
				deepTrunc++
			} else {
				t.Errorf("a stack 40 calls deep not flagged truncated: %d frames", len(ev.Stack))
			}
		}
	}
	t.Logf("naps: %d before the interpreter was found, %d after, %d of them named; churn: %d rounds, %d stacks, %d gen frames, %d truncated; deep: %d stacks, %d truncated",
		napsEarly, napsSeen, napsNamed, truth.ChurnRounds, churnStacks, churnFrames, churnTrunc, deepStacks, deepTrunc)
	if napsSeen < naps/2 || napsEarly+napsSeen < naps*9/10 {
		t.Errorf("%d of %d naps seen as sleeps, %d of them after the interpreter was found", napsEarly+napsSeen, naps, napsSeen)
	}
	if napsNamed < napsSeen*9/10 {
		t.Errorf("%d of %d nap sleeps name nap/outer at lines %d/%d", napsNamed, napsSeen, truth.NapLine, truth.OuterLine)
	}
	if churnFrames < churnStacks/2 {
		t.Errorf("only %d of %d churn stacks name a gen function", churnFrames, churnStacks)
	}
	if deepTrunc == 0 {
		t.Errorf("no truncated stack of the deep thread (%d stacks)", deepStacks)
	}
}

// hasPyFrame: a frame with a line, which only Python frames have.
func hasPyFrame(stack []event.Frame) bool {
	for _, f := range stack {
		if f.Line > 0 {
			return true
		}
	}
	return false
}

// pyFrameIndex is the index of the first frame of function fn, -1 if none.
func pyFrameIndex(stack []event.Frame, fn string) int {
	for i, f := range stack {
		if f.Function == fn {
			return i
		}
	}
	return -1
}
