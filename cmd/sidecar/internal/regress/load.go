// Package regress compares two runs of a job step by step: per cause,
// the idle time of each step before and after, with a confidence interval
// for the change (Welch's t interval on the per-step distributions), so
// that CI and nightly jobs can fail on a cause that grew.
//
// A run is read from what gaptrace writes: a summary (--summary-json: its
// step_idle, each cause's per-step moments, kept by StepIdle during the
// run), a recording (--record, replayed here), a spans file (--spans-out:
// train.step spans carry idle by cause), or a gaps file (--gaps-out, an
// approximation: gaps' breakdowns summed per step; steps between the first
// and last that have no gap count as 0, steps outside them and micro idle
// are not seen). A summary written before step_idle existed is refused with a
// message naming what to pass instead.
package regress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
)

// Total is the pseudo-cause that sums every cause of a step.
const Total = "total"

// stepKey names one step of one process on one device.
type stepKey struct {
	pid    uint32
	device int
	step   int64
}

// Run is one run's per-step idle by cause, in nanoseconds. Every step has
// a value for every cause of the run (0 where it had none).
type Run struct {
	Source string // "recording", "spans", "gaps", "summary"
	Steps  int
	// ByCause are each cause's per-step idle moments; Total included.
	ByCause map[string]Moments
}

func newRun(source string, steps map[stepKey]map[string]float64) (Run, error) {
	if len(steps) == 0 {
		return Run{}, errors.New("no training steps in it (only fixed windows, or an empty run)")
	}
	keys := make([]stepKey, 0, len(steps))
	causes := map[string]bool{}
	for k, m := range steps {
		keys = append(keys, k)
		for c := range m {
			causes[c] = true
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.pid != b.pid {
			return a.pid < b.pid
		}
		if a.device != b.device {
			return a.device < b.device
		}
		return a.step < b.step
	})
	samples := map[string][]float64{Total: make([]float64, len(keys))}
	for c := range causes {
		samples[c] = make([]float64, len(keys))
	}
	for i, k := range keys {
		for c, ns := range steps[k] {
			samples[c][i] = ns
			samples[Total][i] += ns
		}
	}
	r := Run{Source: source, Steps: len(keys), ByCause: map[string]Moments{}}
	for c, xs := range samples {
		r.ByCause[c] = momentsOf(xs)
	}
	return r, nil
}

// Load reads a run from path, telling the kind by its content. replay
// correlates a recording's calls again (the caller's view of it).
func Load(path string, replay func(io.Reader) ([]correlate.Step, error)) (Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return Run{}, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<16)
	head, _ := br.Peek(2)
	if len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		return loadRecording(br, replay)
	}
	first, err := br.Peek(br.Size())
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return Run{}, err
	}
	first = bytes.TrimSpace(first)
	if len(first) == 0 {
		return Run{}, errors.New("empty file")
	}
	if first[0] != '{' {
		return Run{}, errors.New("not a gaptrace recording, spans file, gaps file or summary")
	}
	// A summary is one indented JSON object; spans and gaps are JSON lines.
	var probe map[string]json.RawMessage
	line, _, _ := strings.Cut(string(first), "\n")
	if json.Unmarshal([]byte(line), &probe) != nil {
		if strings.TrimSpace(line) == "{" {
			return loadSummary(br)
		}
		return Run{}, fmt.Errorf("first line is not JSON: %.80q", line)
	}
	switch {
	case probe["wall_ns"] != nil && probe["by_cause"] != nil:
		return loadSummary(br)
	case probe["trace_id"] != nil && probe["span_id"] != nil:
		return loadSpans(br)
	case probe["cause"] != nil && probe["duration_ns"] != nil:
		return loadGaps(br)
	}
	return Run{}, errors.New("JSON lines that are neither spans (--spans-out) nor gaps (--gaps-out)")
}

var errNoStepIdle = errors.New("this summary has no step_idle (written before gaptrace kept per-step idle, " +
	"or by a run without steps): pass the run's recording (--record), spans file (--spans-out) or gaps file (--gaps-out)")

// loadSummary reads a summary file's step_idle: each cause's per-step
// moments.
func loadSummary(r io.Reader) (Run, error) {
	var s struct {
		WallNS   *int64             `json:"wall_ns"`
		StepIdle map[string]Moments `json:"step_idle"`
	}
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		return Run{}, fmt.Errorf("summary: %w", err)
	}
	if s.WallNS == nil {
		return Run{}, errors.New("a JSON object that is no gaptrace summary (no wall_ns)")
	}
	tot, ok := s.StepIdle[Total]
	if !ok {
		return Run{}, errNoStepIdle
	}
	for c, m := range s.StepIdle {
		if m.Steps != tot.Steps || m.MeanNS < 0 || m.SDNS < 0 || math.IsNaN(m.MeanNS+m.SDNS) || math.IsInf(m.MeanNS+m.SDNS, 0) {
			return Run{}, fmt.Errorf("summary step_idle %q: %+v (want %d steps, a mean and sd >= 0)", c, m, tot.Steps)
		}
	}
	return Run{Source: "summary", Steps: int(tot.Steps), ByCause: s.StepIdle}, nil
}

func loadRecording(r io.Reader, replay func(io.Reader) ([]correlate.Step, error)) (Run, error) {
	steps, err := replay(r)
	if err != nil {
		return Run{}, err
	}
	m := map[stepKey]map[string]float64{}
	for _, s := range steps {
		if s.Window {
			continue
		}
		by := map[string]float64{}
		for c, ns := range s.ByCause {
			by[string(c)] += float64(ns)
		}
		m[stepKey{s.PID, s.Device, s.Number}] = by
	}
	return newRun("recording", m)
}

func scanLines(r io.Reader, each func(n int, line []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	n := 0
	for sc.Scan() {
		n++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		if err := each(n, sc.Bytes()); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}

// spanLine is what a step span of the spans file says.
type spanLine struct {
	Name       string         `json:"name"`
	Attributes map[string]any `json:"attributes"`
	Resource   map[string]any `json:"resource"`
}

// loadSpans reads the steps' spans (train.step, rank N, device N: each
// carries the step's idle by cause as gpu.step.idle.CAUSE in ms). The root
// and its rank span of one step carry the same numbers: one is kept.
func loadSpans(r io.Reader) (Run, error) {
	m := map[stepKey]map[string]float64{}
	err := scanLines(r, func(_ int, line []byte) error {
		var s spanLine
		if err := json.Unmarshal(line, &s); err != nil {
			return err
		}
		num, ok := s.Attributes["gpu.step.number"].(float64)
		if !ok || s.Name == "gpu.idle" || s.Attributes["gpu.step.duration_ms"] == nil {
			return nil
		}
		if w, _ := s.Attributes["gpu.step.window"].(bool); w {
			return nil
		}
		dev, _ := s.Attributes["gpu.device"].(float64)
		pid, _ := s.Resource["process.pid"].(float64)
		if num != math.Trunc(num) || num < 0 {
			return fmt.Errorf("gpu.step.number %v", num)
		}
		by := map[string]float64{}
		for k, v := range s.Attributes {
			c, ok := strings.CutPrefix(k, "gpu.step.idle.")
			if !ok {
				continue
			}
			ms, ok := v.(float64)
			if !ok || ms < 0 || math.IsInf(ms, 0) {
				return fmt.Errorf("%s = %v: want a non-negative number of ms", k, v)
			}
			by[c] = ms * 1e6
		}
		m[stepKey{uint32(pid), int(dev), int64(num)}] = by
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	return newRun("spans", m)
}

// loadGaps sums each step's gaps by cause. Steps are numbered without
// holes, so a process's steps between its first and last gap that have
// none idled 0.
func loadGaps(r io.Reader) (Run, error) {
	m := map[stepKey]map[string]float64{}
	type span struct{ lo, hi int64 }
	ranges := map[stepKey]span{} // step field unused
	err := scanLines(r, func(_ int, line []byte) error {
		var g correlate.Gap
		if err := json.Unmarshal(line, &g); err != nil {
			return err
		}
		if g.Cause == "" || g.Duration < 0 || g.Step < 0 {
			return fmt.Errorf("gap with cause %q, duration %d ns, step %d", g.Cause, g.Duration, g.Step)
		}
		k := stepKey{g.PID, g.Device, g.Step}
		if m[k] == nil {
			m[k] = map[string]float64{}
		}
		// A gap's breakdown splits it between causes as the step's idle
		// by cause does; a gap without one is its cause's whole.
		if len(g.Breakdown) == 0 {
			m[k][string(g.Cause)] += float64(g.Duration)
		}
		for c, ns := range g.Breakdown {
			if ns < 0 {
				return fmt.Errorf("gap breakdown %s = %d ns", c, ns)
			}
			m[k][string(c)] += float64(ns)
		}
		pk := stepKey{g.PID, g.Device, 0}
		rg, ok := ranges[pk]
		if !ok {
			rg = span{g.Step, g.Step}
		}
		rg.lo, rg.hi = min(rg.lo, g.Step), max(rg.hi, g.Step)
		ranges[pk] = rg
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	for pk, rg := range ranges {
		if rg.hi-rg.lo > 10_000_000 {
			return Run{}, fmt.Errorf("pid %d device %d: steps %d to %d, too far apart to be one run", pk.pid, pk.device, rg.lo, rg.hi)
		}
		for n := rg.lo; n <= rg.hi; n++ {
			k := stepKey{pk.pid, pk.device, n}
			if m[k] == nil {
				m[k] = map[string]float64{}
			}
		}
	}
	return newRun("gaps", m)
}
