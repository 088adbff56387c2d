package accuracy

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// score reads one run's outputs and checks the targets.
func score(t *testing.T, j *job) *row {
	r := &row{Scenario: j.sc.name, Probes: j.probes, Dir: j.dir, WallS: j.wall.Seconds()}
	miss := func(format string, a ...any) { r.Misses = append(r.Misses, fmt.Sprintf(format, a...)) }
	if j.err != nil {
		miss("gaptrace: %v (log: %s)", j.err, filepath.Join(j.dir, "gaptrace.log"))
		return r
	}
	tr, err := ReadTruth(filepath.Join(j.dir, "truth.jsonl"))
	if err != nil {
		miss("%v", err)
		return r
	}
	if !tr.Ended || len(tr.Steps) == 0 {
		miss("truth is incomplete (%d steps, end record %v)", len(tr.Steps), tr.Ended)
		return r
	}
	if j.scoredFrom == 0 {
		miss("gaptrace never attached uprobes to the trainer (pid %d)", tr.PID)
		return r
	}
	r.WarmupMS = ms(j.scoredFrom - j.attached)
	if j.noPeriod {
		r.Notes = append(r.Notes, fmt.Sprintf("no step period within %v of the attach: scored from the attach", periodWait))
	}
	ran := len(tr.Steps)
	tr.TracedFrom(j.scoredFrom)
	tr.Until(j.scoredUntil)
	r.ScoredSteps = len(tr.Steps)
	if len(tr.Steps) > 0 {
		r.SkippedSteps = int(tr.Steps[0].Number) - 1
	}
	if len(tr.Steps) < j.sc.steps {
		miss("only %d of the trainer's %d steps are scored (after the probes attached, before the cool-down), want %d",
			len(tr.Steps), ran, j.sc.steps)
		if len(tr.Steps) == 0 {
			return r
		}
	}
	gaps, err := ReadGaps(filepath.Join(j.dir, "gaps.jsonl"))
	if err != nil {
		miss("%v", err)
		return r
	}
	res := Evaluate(tr, gaps, minGapNS)
	r.Result = res
	if res.Recall.Defined() && res.Recall.Den >= minScoredNS && res.Recall.Value() < minRecall {
		miss("detection recall %s < %.2f: %.1f of %.1f ms of true gaps ≥ 1 ms reported; %d gaps less than half covered, first %s",
			res.Recall, minRecall, ms(res.Recall.Num), ms(res.Recall.Den), len(res.Missed), firstMissed(res, tr))
	}
	if res.Precision.Defined() && res.Precision.Den >= minScoredNS && res.Precision.Value() < minPrecision {
		miss("detection precision %s < %.2f: %.1f of %.1f ms reported idle truly idle",
			res.Precision, minPrecision, ms(res.Precision.Num), ms(res.Precision.Den))
	}
	if res.StallRecall.Defined() && res.StallRecall.Value() < minRecall {
		miss("comm stall recall %s < %.2f: %.1f of %.1f ms reported as stall",
			res.StallRecall, minRecall, ms(res.StallRecall.Num), ms(res.StallRecall.Den))
	}
	if res.StallPrecision.Defined() && res.StallPrecision.Value() < minPrecision {
		miss("comm stall precision %s < %.2f: %.1f of %.1f ms of stall gaps inside truth comm stalls",
			res.StallPrecision, minPrecision, ms(res.StallPrecision.Num), ms(res.StallPrecision.Den))
	}
	for _, c := range sortedCauses(res.Causes) {
		cr := res.Causes[c]
		if cr.TruthNS == 0 {
			miss("cause %s: its %d stalls left no true idle to explain", c, cr.Stalls)
			continue
		}
		if !cr.Accuracy.Defined() {
			miss("cause %s: no reported gap covers any of its %.1f ms", c, ms(cr.TruthNS))
			continue
		}
		if cr.Accuracy.Value() < minAccuracy {
			miss("cause %s: attribution accuracy %s < %.2f (coverage %s), reported as %s",
				c, cr.Accuracy, minAccuracy, cr.Coverage, confusion(cr))
		}
	}
	r.Net = NetShare(tr, gaps)
	if j.sc.netShare > 0 {
		switch nr := r.Net; {
		case nr == nil || nr.Stalls == 0:
			miss("net: no gap covers a net stall")
		default:
			if nr.Share.Value() < j.sc.netShare {
				miss("net: %s of the net stalls' gaps attributed net < %.2f", nr.Share, j.sc.netShare)
			}
			if nr.Named < nr.Stalls {
				miss("net: %d of %d net stalls' gaps name the server as their peer", nr.Named, nr.Stalls)
			}
		}
	}
	if j.sc.countSteps {
		spans, err := ReadStepSpans(filepath.Join(j.dir, "spans.jsonl"))
		if err != nil {
			miss("%v", err)
			return r
		}
		sc := CountSteps(tr, spans, tr.PID)
		r.StepCount = sc
		if sc.RelErr() > maxStepCountErr {
			miss("steps counted: %d (%d fixed windows) over the trainer's %d steps (%+.1f%%, want within %.0f%%)",
				sc.Counted, sc.Windows, sc.True, 100*sc.SignedErr(), 100*maxStepCountErr)
		}
	}
	if j.sc.launchBound {
		judgeStepIdle(t, j, tr, r, miss)
	}
	return r
}

// judgeStepIdle scores a launch-bound run's per-step idle against the
// truth's.
func judgeStepIdle(t *testing.T, j *job, tr *Truth, r *row, miss func(string, ...any)) {
	t.Helper()
	spans, err := ReadStepSpans(filepath.Join(j.dir, "spans.jsonl"))
	if err != nil {
		miss("%v", err)
		return
	}
	si := StepIdle(tr, spans, tr.PID)
	r.StepIdle = si
	switch {
	case si.Matched < len(tr.Steps)/2:
		miss("per-step idle: only %d of %d truth steps matched by %d gaptrace steps", si.Matched, len(tr.Steps), si.Steps)
	default:
		if si.Matched-si.Preempted < minStepIdleJudged {
			// The machine kept the feeder off a CPU in most steps:
			// only the totals say how right gaptrace was.
			t.Logf("%s/%s: per-step idle judged in totals only: %d of %d matched steps waited ≥ %.0f%% of their time for a CPU",
				j.sc.name, j.probes, si.Preempted, si.Matched, 100*preemptedShare)
		} else if si.MedianRelErr > maxStepIdleErr {
			miss("per-step idle: median relative error %.1f%% > %.0f%% (p90 %.1f%%)", 100*si.MedianRelErr, 100*maxStepIdleErr, 100*si.P90RelErr)
		}
		if si.TotalRelErr > maxStepIdleErr {
			miss("per-step idle: total %.1f ms reported vs %.1f ms true (%.1f%% > %.0f%%)",
				ms(si.ReportedNS), ms(si.TrueNS), 100*si.TotalRelErr, 100*maxStepIdleErr)
		}
	}
}

// attachRE matches the tracer's log line for attached uprobes.
var attachRE = regexp.MustCompile(`^time=(\S+) .*msg="uprobes attached" .*library=(\S+) pid=(\d+) `)

// periodRE matches the engine's log line for a trainer's step period.
var periodRE = regexp.MustCompile(`^time=(\S+) .*msg="step period found" .*pid=(\d+) `)

// periodTime is when gaptrace logged the step period of pid, if it did.
// The log is written after the engine's emission delay, so this is a little
// later than the steps that revealed the period.
func periodTime(lines []string, pid int) (int64, bool) {
	for _, line := range lines {
		m := periodRE.FindStringSubmatch(line)
		if len(m) < 3 || m[2] != fmt.Sprint(pid) {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			return ts.Add(time.Millisecond).UnixNano(), true
		}
	}
	return 0, false
}

// attachTime is when the last uprobes for pid were attached, from
// gaptrace's log (millisecond timestamps, so rounded up), and for how many
// libraries.
func attachTime(lines []string, pid int) (int64, int) {
	var last time.Time
	libs := map[string]bool{}
	for _, line := range lines {
		m := attachRE.FindStringSubmatch(line)
		if len(m) < 4 || m[3] != fmt.Sprint(pid) {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		libs[m[2]] = true
		if ts.After(last) {
			last = ts
		}
	}
	if last.IsZero() {
		return 0, 0
	}
	return last.Add(time.Millisecond).UnixNano(), len(libs)
}

func firstMissed(res *Result, tr *Truth) string {
	if len(res.Missed) == 0 {
		return "none"
	}
	m := res.Missed[0]
	return fmt.Sprintf("[%d, %d] (%.2f ms, %.1f ms after the first step)", m.Start, m.End, ms(m.Len()), ms(m.Start-tr.Range().Start))
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func sortedCauses(m map[string]*CauseResult) []string {
	var v []string
	for c := range m {
		v = append(v, c)
	}
	slices.Sort(v)
	return v
}

func confusion(cr *CauseResult) string {
	type kv struct {
		c  string
		ns int64
	}
	var v []kv
	for c, ns := range cr.Confusion {
		v = append(v, kv{c, ns})
	}
	slices.SortFunc(v, func(a, b kv) int { return int(b.ns - a.ns) })
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", x.c, ms(x.ns)))
	}
	return strings.Join(parts, ", ")
}

func pct(r Ratio) string {
	if !r.Defined() {
		return "-"
	}
	return fmt.Sprintf("%.3f", r.Value())
}

// autoAgainstFull says, per scenario that ran under both, how far auto's
// recall and attribution fell below full's (where each has at least 20 ms
// to judge), the largest first: auto is meant to stay within 0.02 of full.
// Both are single runs on a shared machine, so a difference of a few
// hundredths over a few milliseconds of gaps is as much noise as probes.
func autoAgainstFull(rows []*row) string {
	type diff struct {
		what string
		d    float64
	}
	full := map[string]*row{}
	for _, r := range rows {
		if r.Probes == "full" && r.Result != nil {
			full[r.Scenario] = r
		}
	}
	var ds []diff
	for _, r := range rows {
		f := full[r.Scenario]
		if r.Probes != "auto" || r.Result == nil || f == nil {
			continue
		}
		judged := func(x Ratio) bool { return x.Den >= 20*int64(time.Millisecond) }
		if a, b := r.Result.Recall, f.Result.Recall; judged(a) && judged(b) {
			ds = append(ds, diff{r.Scenario + " recall", b.Value() - a.Value()})
		}
		for c, ac := range r.Result.Causes {
			if fc, ok := f.Result.Causes[c]; ok && judged(ac.Accuracy) && judged(fc.Accuracy) {
				ds = append(ds, diff{r.Scenario + " " + c, fc.Accuracy.Value() - ac.Accuracy.Value()})
			}
		}
	}
	if len(ds) == 0 {
		return ""
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].d > ds[j].d })
	var b strings.Builder
	over := 0
	for _, d := range ds {
		if d.d > 0.02 {
			over++
		}
	}
	fmt.Fprintf(&b, "auto against full: %d of %d figures more than 0.02 below full; largest:", over, len(ds))
	for _, d := range ds[:min(len(ds), 4)] {
		fmt.Fprintf(&b, " %s %+.3f", d.what, -d.d)
	}
	b.WriteString("\n")
	return b.String()
}

// formatTable renders the rows as the table `make accuracy` prints.
func formatTable(rows []*row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\ngaptrace accuracy on simtrain (targets: recall/precision ≥ %.2f for gaps ≥ 1 ms, attribution ≥ %.2f per cause, launch-bound per-step idle within %.0f%%)\n",
		minRecall, minAccuracy, 100*maxStepIdleErr)
	fmt.Fprintf(&b, "%-15s %-5s %5s %6s %9s %9s %7s %7s %6s %6s %13s  %s\n",
		"scenario", "probe", "steps", "warmup", "idle ms", "gap≥1ms", "recall", "prec", "stallR", "stallP", "bound p50/p90", "cause accuracy (coverage); per-step idle error")
	for _, r := range rows {
		if r.Result == nil {
			fmt.Fprintf(&b, "%-15s %-5s  FAILED: %s\n", r.Scenario, r.Probes, strings.Join(r.Misses, "; "))
			continue
		}
		res := r.Result
		var causes []string
		for _, c := range sortedCauses(res.Causes) {
			cr := res.Causes[c]
			causes = append(causes, fmt.Sprintf("%s %s (%s)", c, pct(cr.Accuracy), pct(cr.Coverage)))
		}
		if nr := r.Net; nr != nil {
			causes = append(causes, fmt.Sprintf("net share %s, peer named %d/%d", pct(nr.Share), nr.Named, nr.Stalls))
		}
		if sc := r.StepCount; sc != nil {
			causes = append(causes, fmt.Sprintf("steps counted %d/%d (%+.1f%%)", sc.Counted, sc.True, 100*sc.SignedErr()))
		}
		if r.StepIdle != nil {
			si := r.StepIdle
			pre := ""
			if si.Preempted > 0 {
				pre = fmt.Sprintf(", %d preempted", si.Preempted)
			}
			causes = append(causes, fmt.Sprintf("step idle p50 %.1f%% p90 %.1f%% total %.1f%% (%d/%d steps%s, %.0f vs %.0f ms)",
				100*si.MedianRelErr, 100*si.P90RelErr, 100*si.TotalRelErr, si.Matched, si.Steps, pre, ms(si.ReportedNS), ms(si.TrueNS)))
		}
		mark := ""
		if len(r.Misses) > 0 {
			mark = "  MISS"
		}
		fmt.Fprintf(&b, "%-15s %-5s %5d %6.0f %9.1f %9.1f %7s %7s %6s %6s %6.2f/%-6.2f  %s%s\n",
			r.Scenario, r.Probes, r.ScoredSteps, r.WarmupMS, ms(res.TrueIdleNS), ms(res.TrueGapNS), pct(res.Recall), pct(res.Precision),
			pct(res.StallRecall), pct(res.StallPrecision), ms(res.BoundaryP50NS), ms(res.BoundaryP90NS),
			strings.Join(causes, ", "), mark)
	}
	fmt.Fprintf(&b, "(steps: scored, those that started once the probes were attached and gaptrace had found the step period (warmup: ms between the two), less one; idle ms: true GPU idle over them; gap≥1ms: of it in gaps ≥ 1 ms; stallR/P: comm stalls vs gaps of kind stall; bound: gap boundary error, ms; 'other' is not injectable; recall and precision are judged only over ≥ 20 ms)\n")
	b.WriteString(autoAgainstFull(rows))
	misses := 0
	for _, r := range rows {
		misses += len(r.Misses)
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "note %s/%s: %s\n", r.Scenario, r.Probes, n)
		}
	}
	if misses > 0 {
		fmt.Fprintf(&b, "%d targets missed:\n", misses)
		for _, r := range rows {
			for _, m := range r.Misses {
				fmt.Fprintf(&b, "  %s/%s: %s\n", r.Scenario, r.Probes, m)
			}
		}
	} else {
		fmt.Fprintf(&b, "every target met\n")
	}
	return b.String()
}
