package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/test/accuracy"
)

// Stall is one stall the job injected.
type Stall struct {
	Cause string
	// Code is the function a gap over the stall should name, alternatives
	// separated by "|"; empty where none can be named.
	Code string
	accuracy.Interval
	RunDelayNS int64
}

// Kind is the stall's row label: cause and first code name.
func (s Stall) Kind() string {
	c, _, _ := strings.Cut(s.Code, "|")
	if c == "" {
		return s.Cause
	}
	return s.Cause + "/" + c
}

// Names is the code names a gap may give.
func (s Stall) Names() []string {
	if s.Code == "" {
		return nil
	}
	return strings.Split(s.Code, "|")
}

// JobTruth is a job's own record of what it did.
type JobTruth struct {
	accuracy.Truth
	Job    string
	Stalls []Stall
	Ended  bool
}

// readTruth parses and validates a job's truth file.
func readTruth(path string) (*JobTruth, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read truth: %w", err)
	}
	defer f.Close()
	t := &JobTruth{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	meta := false
	for n := 1; sc.Scan(); n++ {
		var r struct {
			Type     string `json:"type"`
			Job      string `json:"job"`
			PID      int    `json:"pid"`
			Clock    string `json:"clock"`
			N        int64  `json:"n"`
			Start    int64  `json:"start"`
			End      int64  `json:"end"`
			Cause    string `json:"cause"`
			Code     string `json:"code"`
			RunDelay int64  `json:"run_delay_ns"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		if !meta && r.Type != "meta" {
			return nil, fmt.Errorf("%s line %d: %q record before the meta record", path, n, r.Type)
		}
		if r.Type != "meta" && r.Type != "end" && (r.Start <= 0 || r.End < r.Start) {
			return nil, fmt.Errorf("%s line %d: bad interval [%d, %d]", path, n, r.Start, r.End)
		}
		switch r.Type {
		case "meta":
			if r.PID <= 0 || r.Clock != "realtime" {
				return nil, fmt.Errorf("%s line %d: meta needs a pid and clock realtime", path, n)
			}
			meta, t.PID, t.Job = true, r.PID, r.Job
		case "step":
			t.Steps = append(t.Steps, accuracy.TruthStep{Number: r.N, Interval: accuracy.Interval{Start: r.Start, End: r.End}})
		case "stall":
			if r.Cause == "" {
				return nil, fmt.Errorf("%s line %d: stall without a cause", path, n)
			}
			t.Stalls = append(t.Stalls, Stall{Cause: r.Cause, Code: r.Code,
				Interval: accuracy.Interval{Start: r.Start, End: r.End}, RunDelayNS: max(r.RunDelay, 0)})
		case "end":
			t.Ended = true
		default:
			return nil, fmt.Errorf("%s line %d: unknown record type %q", path, n, r.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read truth %s: %w", path, err)
	}
	if !meta {
		return nil, fmt.Errorf("%s: no meta record", path)
	}
	slices.SortFunc(t.Steps, func(a, b accuracy.TruthStep) int { return int(a.Number - b.Number) })
	return t, nil
}

// tracedFrom keeps what a tracer attached at `at` can be judged on: the
// steps that started after it less the first, and the stalls inside them.
func (t *JobTruth) tracedFrom(at int64) {
	t.TracedFrom(at)
	rng := t.Range()
	t.Stalls = slices.DeleteFunc(t.Stalls, func(s Stall) bool { return s.Start < rng.Start || s.End > rng.End })
}
