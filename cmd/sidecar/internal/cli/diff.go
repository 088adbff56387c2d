package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/regress"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
)

const diffUsage = `Usage: gaptrace diff [flags] BASE NEW

Compare two runs of a job step by step: per cause, the mean idle per step
before and after, each with its 95% confidence interval, and the change
with its 95% interval (Welch's t on the per-step distributions). BASE and
NEW are each a summary (--summary-json: its step_idle), a recording
(--record), a spans file (--spans-out) or a gaps file (--gaps-out); the
kind is told from the content.

Exit status: 0, or 1 with --fail-on when a cause grew by more than PCT
percent at 95% confidence (and by at least --min-change ms per step), 2
on bad arguments or input.

Flags:
`

// stepCollector keeps the steps a replay emits.
type stepCollector struct{ steps []correlate.Step }

func (c *stepCollector) Gap(correlate.Gap)           {}
func (c *stepCollector) Step(s correlate.StepResult) { c.steps = append(c.steps, s.Step) }

// replaySteps correlates a recording again, as `gaptrace replay` does, and
// returns its steps.
func replaySteps(r io.Reader) ([]correlate.Step, error) {
	h, calls, err := record.Read(r)
	if err != nil && len(calls) == 0 {
		return nil, err
	}
	view := record.View{Window: config.DefaultAutoWindow, WarmupSteps: config.AutoWarmupSteps,
		WarmupMax: config.AutoWarmupWindows * config.DefaultAutoWindow}
	if err := record.CheckView(h, view); err != nil {
		return nil, err
	}
	cfg := h.Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	var c stepCollector
	if _, err := record.ReplayAs(cfg, &c, h, calls, view); err != nil {
		return nil, err
	}
	return c.steps, nil
}

func diffCmd(args []string, deps Deps) int {
	fs := flag.NewFlagSet("gaptrace diff", flag.ContinueOnError)
	fs.SetOutput(deps.Stderr)
	failOn := fs.Float64("fail-on", -1, "exit 1 when a cause's idle per step grew by more than `PCT` percent (95% confidence)")
	minChange := fs.Float64("min-change", 0.1, "with --fail-on, ignore growth below `MS` ms per step")
	asJSON := fs.Bool("json", false, "print the comparison as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), diffUsage)
		fs.PrintDefaults()
	}
	files, code, ok := parseInterspersed(fs, args)
	if !ok {
		return code
	}
	var problems []string
	if len(files) != 2 {
		problems = append(problems, fmt.Sprintf("want two runs, BASE and NEW, got %d", len(files)))
	}
	failSet := false
	fs.Visit(func(f *flag.Flag) { failSet = failSet || f.Name == "fail-on" })
	if failSet && (*failOn < 0 || math.IsNaN(*failOn) || math.IsInf(*failOn, 0)) {
		problems = append(problems, fmt.Sprintf("--fail-on %v: want a percentage >= 0", *failOn))
	}
	if *minChange < 0 || math.IsNaN(*minChange) || math.IsInf(*minChange, 0) {
		problems = append(problems, fmt.Sprintf("--min-change %v: want ms per step >= 0", *minChange))
	}
	if len(problems) > 0 {
		fmt.Fprintf(deps.Stderr, "gaptrace diff: invalid arguments:\n  - %s\n", strings.Join(problems, "\n  - "))
		return ExitUsage
	}
	var runs [2]regress.Run
	for i, f := range files {
		r, err := regress.Load(f, replaySteps)
		if err != nil {
			fmt.Fprintf(deps.Stderr, "gaptrace diff: %s: %v\n", f, err)
			return ExitUsage
		}
		if r.Steps < 2 {
			fmt.Fprintf(deps.Stderr, "gaptrace diff: %s: %d step: an interval needs at least 2\n", f, r.Steps)
			return ExitUsage
		}
		runs[i] = r
	}
	rows := regress.Compare(runs[0], runs[1])
	var grew []string
	for _, r := range rows {
		if failSet && r.Cause != regress.Total && r.Grew(*failOn, *minChange) {
			grew = append(grew, r.Cause)
		}
	}
	if *asJSON {
		b, err := json.MarshalIndent(struct {
			Base, New   string
			BaseSteps   int `json:"base_steps"`
			NewSteps    int `json:"new_steps"`
			Causes      []regress.Row
			Regressions []string `json:"regressions"`
		}{files[0], files[1], runs[0].Steps, runs[1].Steps, rows, grew}, "", "  ")
		if err != nil {
			return fail(deps, "diff", "%v", err)
		}
		fmt.Fprintf(deps.Stdout, "%s\n", b)
	} else {
		printDiff(deps.Stdout, files, runs, rows, grew, failSet, *failOn)
	}
	if len(grew) > 0 {
		return ExitFailure
	}
	return ExitOK
}

func printDiff(w io.Writer, files []string, runs [2]regress.Run, rows []regress.Row, grew []string, failSet bool, pct float64) {
	fmt.Fprintf(w, "base %s (%s, %d steps)\nnew  %s (%s, %d steps)\n\n", files[0], runs[0].Source, runs[0].Steps,
		files[1], runs[1].Source, runs[1].Steps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "idle ms/step\tbase [95% CI]\tnew [95% CI]\tchange [95% CI]\tchange %\t")
	iv := func(i regress.Interval, sign string) string {
		return fmt.Sprintf("%"+sign+".2f [%"+sign+".2f, %"+sign+".2f]", i.Mean, i.Lo, i.Hi)
	}
	for _, r := range rows {
		p := "new"
		if !math.IsInf(r.ChangePct, 0) {
			p = fmt.Sprintf("%+.1f%%", r.ChangePct)
		}
		mark := ""
		for _, g := range grew {
			if g == r.Cause {
				mark = fmt.Sprintf("REGRESSION (> %g%%)", pct)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Cause, iv(r.Base, ""), iv(r.New, ""), iv(r.Change, "+"), p, mark)
	}
	tw.Flush()
	if failSet && len(grew) == 0 {
		fmt.Fprintf(w, "\nno cause grew by more than %g%% at 95%% confidence\n", pct)
	}
}
