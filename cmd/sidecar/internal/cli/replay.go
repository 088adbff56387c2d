package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/regress"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/whatif"
)

const replayUsage = `Usage: gaptrace replay [flags] FILE

Run a recording made with --record through the correlation engine again and
print the summary the run would have printed: the same gaps, steps and
causes, without the job, a GPU or privileges. Attach a recording to a bug
report when a gap is mis-attributed; replay it after an upgrade to see what
a newer engine says about the same run.

--probes replays the recording as another probe set would have seen the
same run: a recording made at full holds every kernel launch, so it can be
replayed as lite (without them) or auto (at full through the warm-up
window, then lite), to compare the probe sets without running the job
again. A lite recording replays only as lite.

--step-at ends each step at the syncs made from a site, as a run given it
would have: pin the site a summary's step_clock names and see the steps.

Flags:
`

func replayCmd(args []string, deps Deps) int {
	fs := flag.NewFlagSet("gaptrace replay", flag.ContinueOnError)
	fs.SetOutput(deps.Stderr)
	gapsOut := fs.String("gaps-out", "", "write every gap as a JSON line to `FILE`")
	sumOut := fs.String("summary-json", "", "write the summary as JSON to `FILE`")
	probes := fs.String("probes", "", "replay as probe set `SET` saw the run: full, lite or auto (default: the recording's own)")
	stepAt := fs.String("step-at", "", "end each step at the syncs made with `SITE` on their stack (FILE:LINE or a function), as run --step-at would have")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), replayUsage)
		fs.PrintDefaults()
	}
	files, code, ok := parseInterspersed(fs, args)
	if !ok {
		return code
	}
	var problems []string
	if len(files) != 1 {
		problems = append(problems, fmt.Sprintf("want one recording FILE (written by --record), got %d", len(files)))
	}
	switch *probes {
	case "", correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto:
	default:
		problems = append(problems, fmt.Sprintf("--probes %q: want %s, %s or %s", *probes, correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto))
	}
	if *stepAt != "" {
		if _, err := stepclock.ParseSpec(*stepAt); err != nil {
			problems = append(problems, fmt.Sprintf("--step-at: %v", err))
		}
	}
	for _, o := range []struct{ flag, path string }{{"gaps-out", *gapsOut}, {"summary-json", *sumOut}} {
		if msg := config.CheckOutput(o.flag, o.path); msg != "" {
			problems = append(problems, msg)
		}
	}
	if len(problems) > 0 {
		fmt.Fprintf(deps.Stderr, "gaptrace replay: invalid arguments:\n  - %s\n", strings.Join(problems, "\n  - "))
		return ExitUsage
	}
	f, err := os.Open(files[0])
	if err != nil {
		return fail(deps, "replay", "%v", err)
	}
	defer f.Close()
	// Read as it is replayed: memory is bounded by a line, whatever the
	// recording's size.
	rd, err := record.NewReader(f)
	if err != nil {
		return fail(deps, "replay", "%s: %v", files[0], err)
	}
	h := rd.Header()
	calls := 0
	seq := func(yield func(record.Call) bool) {
		for c := range rd.Calls() {
			calls++
			if !yield(c) {
				return
			}
		}
	}
	view := record.View{Probes: *probes, Window: config.DefaultAutoWindow,
		WarmupSteps: config.AutoWarmupSteps, WarmupMax: config.AutoWarmupWindows * config.DefaultAutoWindow}
	if err := record.CheckView(h, view); err != nil {
		fmt.Fprintf(deps.Stderr, "gaptrace replay: %s: %v\n", files[0], err)
		return ExitUsage
	}
	cfg := h.Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.StepAt = *stepAt

	agg := live.NewAggregator(nil)
	wi := whatif.New()
	agg.SetWhatIf(wi.Estimates)
	var procs processes
	var stepIdle regress.StepIdle
	sinks := correlate.Tee{agg, &procs, wi, &stepIdle}
	var gw *gapsWriter
	if *gapsOut != "" {
		if gw, err = newGapsWriter(*gapsOut, slog.New(slog.DiscardHandler)); err != nil {
			return fail(deps, "replay", "%v", err)
		}
		sinks = append(sinks, gw)
	}
	sum, err := record.ReplayAsSeq(cfg, sinks, h, seq, view)
	if err != nil {
		return fail(deps, "replay", "%v", err) // CheckView passed: not reached
	}
	if code, ok := recordingRead(deps, files[0], rd, calls); !ok {
		return code
	}
	if *probes != "" {
		cfg.Probes = *probes
	}
	if sum.Probes == "" {
		sum.Probes = cfg.Probes // as the run's summary names its fixed set
	}
	agg.Stop()
	agg.SetSummary(sum)
	var errs []error
	if gw != nil {
		errs = append(errs, gw.Close())
	}
	sum.Processes = procs.list()
	sum.CallSites = agg.CallSites(maxSummaryCallSites)
	sum.CPUCode = agg.CPUCode(maxSummaryCallSites)
	if *sumOut != "" {
		errs = append(errs, writeSummaryJSON(*sumOut, sum, wi.Estimates(), &stepIdle))
	}
	_, width := deps.IsTerminal()
	title := fmt.Sprintf("replay of %s (%d calls, probes %s)", files[0], calls, cfg.Probes)
	fmt.Fprint(deps.Stdout, live.Summary(agg.View(title), live.Outputs{Gaps: *gapsOut, Summary: *sumOut}, width))
	if err := errors.Join(errs...); err != nil {
		return fail(deps, "replay", "%v", err)
	}
	return ExitOK
}

// recordingRead says what reading the recording met: damage (fatal when no
// call came before it), calls skipped.
func recordingRead(deps Deps, file string, rd *record.Reader, calls int) (int, bool) {
	if err := rd.Err(); err != nil && calls == 0 {
		return fail(deps, "replay", "%s: %v", file, err), false
	} else if err != nil {
		fmt.Fprintf(deps.Stderr, "gaptrace replay: warning: %v\n", err)
	}
	if n := rd.Skipped(); n > 0 {
		fmt.Fprintf(deps.Stderr, "gaptrace replay: warning: %s: %d calls skipped (a field out of range, or a line over %d MiB)\n",
			file, n, record.MaxLine>>20)
	}
	return 0, true
}

// parseInterspersed parses args with fs where flags may follow the
// positional arguments (gaptrace replay FILE --gaps-out X), and returns
// those arguments in order. When parsing stops (--help, a bad flag), ok
// is false and code is the exit status to return.
func parseInterspersed(fs *flag.FlagSet, args []string) (files []string, code int, ok bool) {
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, ExitOK, false
			}
			return nil, ExitUsage, false
		}
		if fs.NArg() == 0 {
			return files, 0, true
		}
		files = append(files, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}
