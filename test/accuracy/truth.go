package accuracy

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
)

// Truth is what simtrain says happened, in Unix nanoseconds.
type Truth struct {
	PID    int
	Offset int64 // realtime - monotonic, ns
	Steps  []TruthStep
	Stalls []TruthStall
	// Busy holds the intervals during which the device was busy in
	// utilization terms (kernels and collectives).
	Busy Set
	// Ended is true when the file held its end record (a complete run).
	Ended bool
}

// TruthStep is one step: from just before its first launch to the return
// of its final sync.
type TruthStep struct {
	Number int64
	Interval
	// RunDelayNS is the feeder's run-queue wait during the step (the
	// machine's own load), from schedstat; 0 when not recorded.
	RunDelayNS int64
}

// TruthStall is one injected stall.
type TruthStall struct {
	Step  int64
	Cause string // as given to simtrain: io.read, loader.wait.io, ...
	Interval
	// Ahead is true for a CPU-ahead stall (inside its step, after the
	// launches, before the sync).
	Ahead bool
	// WorkerDid is "io" or "cpu" for loader stalls.
	WorkerDid string
	// RunDelayNS is the main thread's run-queue wait during the stall (the
	// machine's own CPU contention), from schedstat.
	RunDelayNS int64
	// Peer and ServerPID name a net stall's server (ServerPID 0 when it is
	// not simtrain's own log server).
	Peer      string
	ServerPID uint32
}

// contentionShare: a stall whose run-queue wait was at least this share of
// it was, by the truth's own measurement, as much cpu.contention as its
// injected cause (on a loaded machine a 30 ms busy loop can spend half its
// time preempted). Either cause is then right. Slightly under one half:
// schedstat is sampled around the stall, the tracer counts waits from its
// threshold up.
const contentionShare = 0.45

// Accepts reports whether a gap's dominant cause (refined by worker
// evidence) is a right explanation of stall s.
func (s TruthStall) Accepts(g correlate.Gap) bool {
	want, worker := ExpectedCause(s.Cause)
	if g.Cause == want && (worker == "" || ReportedCause(g) == "loader.wait."+worker) {
		return true
	}
	return g.Cause == correlate.CauseCPUContention && s.Len() > 0 &&
		float64(s.RunDelayNS) >= contentionShare*float64(s.Len())
}

// TracedFrom restricts the truth to what a tracer that attached at from
// (Unix ns) can be judged on: the steps that start after it, less the first
// of them, whose queue state the tracer could not know (the untraced
// launches before it), and the stalls inside the remaining range.
func (t *Truth) TracedFrom(from int64) {
	i := slices.IndexFunc(t.Steps, func(s TruthStep) bool { return s.Start >= from })
	if i < 0 {
		t.Steps, t.Stalls = nil, nil
		return
	}
	t.Steps = t.Steps[min(i+1, len(t.Steps)):]
	rng := t.Range()
	t.Stalls = slices.DeleteFunc(t.Stalls, func(s TruthStall) bool {
		return s.Start < rng.Start || s.End > rng.End
	})
}

// Until restricts the truth to the steps that ended by until (Unix ns; 0
// keeps everything) and the stalls inside them.
func (t *Truth) Until(until int64) {
	if until == 0 {
		return
	}
	t.Steps = slices.DeleteFunc(t.Steps, func(s TruthStep) bool { return s.End > until })
	rng := t.Range()
	t.Stalls = slices.DeleteFunc(t.Stalls, func(s TruthStall) bool {
		return s.Start < rng.Start || s.End > rng.End
	})
}

// Range is the scored range: first step start to last step end.
func (t *Truth) Range() Interval {
	if len(t.Steps) == 0 {
		return Interval{}
	}
	return Interval{t.Steps[0].Start, t.Steps[len(t.Steps)-1].End}
}

// Idle is the true GPU idle inside the scored range.
func (t *Truth) Idle() Set { return Complement(t.Busy, t.Range()) }

// ReadTruth parses a simtrain --truth file.
func ReadTruth(path string) (*Truth, error) {
	t := &Truth{}
	var busy []Interval
	meta := false
	err := readLines(path, func(line []byte) error {
		var r struct {
			Type      string `json:"type"`
			Offset    int64  `json:"realtime_minus_monotonic_ns"`
			PID       int    `json:"pid"`
			Step      int64  `json:"step"`
			Cause     string `json:"cause"`
			Start     int64  `json:"start"`
			End       int64  `json:"end"`
			Kind      string `json:"kind"`
			At        string `json:"at"`
			WorkerDid string `json:"worker_did"`
			RunDelay  int64  `json:"run_delay_ns"`
			Peer      string `json:"peer"`
			ServerPID uint32 `json:"server_pid"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			return err
		}
		if !meta && r.Type != "meta" {
			return fmt.Errorf("record of type %q before the meta record", r.Type)
		}
		iv := Interval{r.Start + t.Offset, r.End + t.Offset}
		switch r.Type {
		case "meta":
			meta = true
			t.PID, t.Offset = r.PID, r.Offset
		case "step":
			t.Steps = append(t.Steps, TruthStep{Number: r.Step, Interval: iv, RunDelayNS: r.RunDelay})
		case "stall":
			t.Stalls = append(t.Stalls, TruthStall{Step: r.Step, Cause: r.Cause, Interval: iv,
				Ahead: r.At == "ahead", WorkerDid: r.WorkerDid, RunDelayNS: r.RunDelay, Peer: r.Peer, ServerPID: r.ServerPID})
		case "busy":
			if r.Kind == "kernel" || r.Kind == "collective" {
				busy = append(busy, iv)
			}
		case "end":
			t.Ended = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read truth %s: %w", path, err)
	}
	if !meta {
		return nil, fmt.Errorf("read truth %s: no meta record", path)
	}
	slices.SortFunc(t.Steps, func(a, b TruthStep) int { return cmp.Compare(a.Number, b.Number) })
	slices.SortFunc(t.Stalls, func(a, b TruthStall) int { return cmp.Compare(a.Start, b.Start) })
	t.Busy = NewSet(busy...)
	return t, nil
}

// ReadGaps parses a --gaps-out file.
func ReadGaps(path string) ([]correlate.Gap, error) {
	var gaps []correlate.Gap
	err := readLines(path, func(line []byte) error {
		var g correlate.Gap
		if err := json.Unmarshal(line, &g); err != nil {
			return err
		}
		gaps = append(gaps, g)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read gaps %s: %w", path, err)
	}
	return gaps, nil
}

func readLines(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}
