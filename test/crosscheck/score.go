package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/test/accuracy"
)

// Targets.
const (
	maxStepErr    = 0.02
	minCauseShare = 0.9
	minCodeNamed  = 0.9
	maxOther      = 0.05
)

// KindScore scores the stalls of one kind.
type KindScore struct {
	Kind    string
	Stalls  int
	StallNS int64
	// Short counts stalls shorter than the shortest gap gaptrace
	// reports (correlate.DefaultMinGap): the job timed them, but they
	// idled the GPU for less than a gap (a mapped page still mapped, a
	// write the page cache took), so they are not judged.
	Short int
	// SeenNS is the breakdown time of gaps over the stalls, RightNS of it
	// the expected cause's, ExcusedNS the cpu.contention set aside.
	SeenNS, RightNS, ExcusedNS float64
	// Named counts stalls a gap over which names their code, of Gapped,
	// the stalls that some gap overlaps (a stall the host ran ahead of,
	// the device busy with work queued before it, idled nothing: no gap
	// can name it); Nameable is false where the truth gives no code.
	Named    int
	Gapped   int
	Nameable bool
	// Labels is the seen time by reported cause.
	Labels map[string]float64
}

// Share is the expected cause's share of the seen time (-1: nothing seen).
func (k *KindScore) Share() float64 {
	d := k.SeenNS - k.ExcusedNS
	if d <= 0 {
		return -1
	}
	return k.RightNS / d
}

// Top is the label given most of the seen time, less the contention
// set aside.
func (k *KindScore) Top() string {
	best, bestNS := "-", 0.0
	for c, ns := range k.Labels {
		if c == string(correlate.CauseCPUContention) {
			ns -= k.ExcusedNS // the machine's load, set aside
		}
		if ns > bestNS || (ns == bestNS && c < best) {
			best, bestNS = c, ns
		}
	}
	return best
}

// Score is one job × mode.
type Score struct {
	Job, Mode   string
	Err         error
	TrueSteps   int
	Steps       int
	Windows     int // of Steps, fixed windows, not detected steps
	Clock       string
	Kinds       []*KindScore
	OtherNS     float64
	IdleNS      float64
	Met, Missed []string
}

// scoreRun reads a run's files and scores them.
func scoreRun(j Job, mode string, ro *RunOut) *Score {
	sc := &Score{Job: j.Name, Mode: mode, Clock: "-"}
	tr, err := readTruth(ro.Truth)
	if err != nil {
		sc.Err = err
		return sc
	}
	if !tr.Ended {
		sc.Err = fmt.Errorf("truth %s has no end record: the job did not finish", ro.Truth)
		return sc
	}
	at, err := attachTime(ro.Log, tr.PID)
	if err != nil {
		sc.Err = err
		return sc
	}
	tr.tracedFrom(at)
	spans, err := accuracy.ReadStepSpans(ro.Spans)
	if err != nil {
		sc.Err = err
		return sc
	}
	gaps, raws, err := readGaps(ro.Gaps)
	if err != nil {
		sc.Err = err
		return sc
	}
	sc.Clock = stepClock(ro.Summary)
	c := accuracy.CountSteps(&tr.Truth, spans, tr.PID)
	sc.TrueSteps, sc.Steps, sc.Windows = c.True, c.Counted, c.Windows
	sc.Kinds = scoreStalls(tr, gaps, raws)
	rng := tr.Range()
	for _, g := range gaps {
		if int(g.PID) != tr.PID || g.Duration <= 0 {
			continue
		}
		ov := min(g.End, rng.End) - max(g.Start, rng.Start)
		if ov <= 0 {
			continue
		}
		f := float64(ov) / float64(g.Duration)
		for cause, ns := range g.Breakdown {
			sc.IdleNS += float64(ns) * f
			if cause == correlate.CauseOther {
				sc.OtherNS += float64(ns) * f
			}
		}
	}
	sc.judge()
	return sc
}

// scoreStalls scores each stall kind against the gaps.
func scoreStalls(tr *JobTruth, gaps []correlate.Gap, raws [][]byte) []*KindScore {
	byKind := map[string]*KindScore{}
	var kinds []*KindScore
	for _, s := range tr.Stalls {
		k := byKind[s.Kind()]
		if k == nil {
			k = &KindScore{Kind: s.Kind(), Nameable: s.Code != "", Labels: map[string]float64{}}
			byKind[s.Kind()] = k
			kinds = append(kinds, k)
		}
		if s.Len() < int64(correlate.DefaultMinGap) {
			k.Short++
			continue
		}
		k.Stalls++
		k.StallNS += s.Len()
		want, worker := accuracy.ExpectedCause(s.Cause)
		var contention float64
		named, gapped := false, false
		for i, g := range gaps {
			ov := min(g.End, s.End) - max(g.Start, s.Start)
			if int(g.PID) != tr.PID || ov <= 0 || g.Duration <= 0 {
				continue
			}
			gapped = true
			f := float64(ov) / float64(g.Duration)
			right := worker == "" || accuracy.ReportedCause(g) == "loader.wait."+worker
			for cause, ns := range g.Breakdown {
				x := float64(ns) * f
				k.SeenNS += x
				label := string(cause)
				if cause == correlate.CauseLoaderWait {
					label = accuracy.ReportedCause(g)
				}
				k.Labels[label] += x
				if cause == want && right {
					k.RightNS += x
				}
				if cause == correlate.CauseCPUContention {
					contention += x
				}
			}
			if !named && names(raws[i], s.Names()) {
				named = true
			}
		}
		if want != correlate.CauseCPUContention {
			k.ExcusedNS += min(contention, float64(s.RunDelayNS))
		}
		if named {
			k.Named++
		}
		if gapped {
			k.Gapped++
		}
	}
	return kinds
}

// names reports whether any string in the gap's JSON names one of the
// functions: equal to it, ending in "."+it or ":"+it, or starting with it
// and a space or parenthesis.
func names(raw []byte, fns []string) bool {
	if len(fns) == 0 {
		return false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case string:
			for _, fn := range fns {
				if x == fn || strings.HasSuffix(x, "."+fn) || strings.HasSuffix(x, ":"+fn) ||
					strings.HasPrefix(x, fn+" ") || strings.HasPrefix(x, fn+"(") {
					return true
				}
			}
		case []any:
			return slices.ContainsFunc(x, walk)
		case map[string]any:
			for key, e := range x {
				if walk(key) || walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// readGaps returns the gaps file's gaps and each gap's raw line.
func readGaps(path string) ([]correlate.Gap, [][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read gaps: %w", err)
	}
	var gaps []correlate.Gap
	var raws [][]byte
	for n, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var g correlate.Gap
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			return nil, nil, fmt.Errorf("%s line %d: %w", path, n+1, err)
		}
		gaps, raws = append(gaps, g), append(raws, []byte(line))
	}
	return gaps, raws, nil
}

// stepClock is the summary's step_clock as "source@site", "-" when absent.
func stepClock(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "-"
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return "-"
	}
	sc, ok := m["step_clock"].(map[string]any)
	if !ok {
		for _, v := range m { // per-process summaries
			if mm, ok := v.(map[string]any); ok {
				if sc, ok = mm["step_clock"].(map[string]any); ok {
					break
				}
			}
		}
	}
	if sc == nil {
		return "-"
	}
	src, _ := sc["source"].(string)
	site, _ := sc["site"].(string)
	if site == "" {
		return src
	}
	return src + "@" + site
}

// judge fills Met and Missed.
func (sc *Score) judge() {
	check := func(ok bool, what string) {
		if ok {
			sc.Met = append(sc.Met, what)
		} else {
			sc.Missed = append(sc.Missed, what)
		}
	}
	c := accuracy.StepCountResult{True: sc.TrueSteps, Counted: sc.Steps}
	check(sc.TrueSteps > 0 && c.RelErr() <= maxStepErr, fmt.Sprintf("steps %d/%d", sc.Steps, sc.TrueSteps))
	for _, k := range sc.Kinds {
		if k.Stalls == 0 {
			continue // every one short: nothing to judge
		}
		check(k.Share() >= minCauseShare, fmt.Sprintf("%s cause %.2f (top %s)", k.Kind, k.Share(), k.Top()))
		if k.Nameable {
			check(float64(k.Named) >= minCodeNamed*float64(k.Gapped), fmt.Sprintf("%s code %d/%d", k.Kind, k.Named, k.Gapped))
		}
	}
	check(sc.IdleNS > 0 && sc.OtherNS <= maxOther*sc.IdleNS, fmt.Sprintf("other %.3f", sc.OtherNS/max(sc.IdleNS, 1)))
}
