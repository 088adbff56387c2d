package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/regress"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/safefile"
	"github.com/gaptrace/gaptrace/internal/wake"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/perfetto"
	"github.com/gaptrace/gaptrace/whatif"
)

// session is one tracing session: outputs, pipeline, live view.
type session struct {
	cmd   config.Command
	cfg   *config.Config
	deps  Deps
	log   *slog.Logger
	agg   *live.Aggregator
	gaps  *gapsWriter
	hangs hangRecords
	dump  *dumpServer      // gaptrace dump, SIGUSR1; nil when the pipeline cannot dump
	trace *perfetto.Writer // --perfetto-out, nil when off
	procs processes
	names procNames
	wi    *whatif.Accumulator
	steps regress.StepIdle // per-step idle moments for the summary
	pipe  Pipeline
	spans string
	// cmdline is the target's command line as --command-line and
	// --redact allow it to be shown.
	cmdline []string
	title   string
	closed  bool
	sum     correlate.Summary // set by finish

	mode string         // live view: "on" (redrawn frame), "log" (periodic lines), "off"
	term *live.Terminal // when mode is "on"

	runCancel context.CancelFunc
	runDone   chan error
	viewStop  chan struct{}
	viewDone  chan struct{}
}

// open prepares outputs and builds the pipeline. On error nothing is left
// open.
func openSession(ctx context.Context, cfg *config.Config, deps Deps, out output, targetPID int, argv []string) (*session, error) {
	base := out.log
	s := &session{cmd: cfg.Command, cfg: cfg, deps: deps, log: base.With("component", "cli"), agg: live.NewAggregator(nil),
		mode: out.mode, term: out.term, cmdline: redactCmdline(cfg, argv)}
	// An OTLP endpoint with --spans-out: both, OTLP and a local copy.
	s.spans = cfg.SpansFile(deps.Getenv)
	s.wi = whatif.New()
	s.agg.SetWhatIf(s.wi.Estimates)
	sinks := correlate.Tee{s.agg, &s.procs, s.wi, &s.steps}
	if cfg.GapsOut != "" {
		g, err := newGapsWriter(cfg.GapsOut, s.log)
		if err != nil {
			return nil, err
		}
		s.gaps = g
		sinks = append(sinks, g)
	}
	if cfg.PerfettoOut != "" {
		log := s.log
		t, err := perfetto.Create(cfg.PerfettoOut, perfetto.Options{ProcessName: s.names.name, ThreadName: threadComm,
			OnError: func(err error) {
				log.Error("trace file write failed; the trace is not written (nothing of it is under its name)", "err", err)
			}})
		if err != nil {
			if s.gaps != nil {
				_ = s.gaps.Close() // reporting the trace file error instead
			}
			return nil, err
		}
		s.trace = t
		sinks = append(sinks, t)
	}
	pipe, err := deps.NewPipeline(ctx, PipelineConfig{
		Config: cfg, Sink: sinks, Snapshot: s.agg.SetSummary, Spans: s.spans,
		TargetPID: targetPID, TargetCmdline: s.cmdline, Logger: base, Named: s.names.Named, Hang: s.hangSink,
	})
	if err != nil {
		if s.gaps != nil {
			_ = s.gaps.Close() // reporting the pipeline error instead
		}
		if s.trace != nil {
			s.trace.Abort() // nothing was traced
		}
		return nil, err
	}
	s.pipe = pipe
	return s, nil
}

// start runs the pipeline and the live view in the background.
func (s *session) start(ctx context.Context) {
	rctx, cancel := context.WithCancel(ctx)
	s.runCancel = cancel
	s.runDone = make(chan error, 1)
	go func() { s.runDone <- s.pipe.Run(rctx) }()
	if d, ok := s.pipe.(Dumper); ok {
		s.dump = startDump(d, s.deps.Getenv, s.log)
	}
	s.viewStop = make(chan struct{})
	s.viewDone = make(chan struct{})
	go s.render()
}

// render draws the live view until stopped. It never writes after
// viewDone is closed, so the summary is printed on a clean screen.
func (s *session) render() {
	defer close(s.viewDone)
	_, width := s.deps.IsTerminal()
	if s.mode == "off" {
		<-s.viewStop
		return
	}
	every := time.Second
	if s.mode == "log" {
		every = 5 * time.Second
	}
	t := wake.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.viewStop:
			if s.term != nil {
				s.term.Clear()
			}
			return
		case <-t.C:
			t.Next()
			s.agg.SetStats(s.pipe.Stats())
			v := s.agg.View(s.title)
			if s.term != nil {
				s.term.Draw(live.Frame(v, width))
			} else {
				fmt.Fprintln(s.deps.Stdout, live.LogLine(v))
			}
		}
	}
}

// finish stops tracing, closes the pipeline, writes and prints the
// summary. It is idempotent.
func (s *session) finish() error {
	if s.closed {
		return nil
	}
	s.closed = true
	// The job exited (or --duration or a signal stopped tracing) just now.
	detachBy := time.Now().Add(DetachTimeout)
	var errs []error
	s.dump.stop()
	if s.runCancel != nil {
		s.runCancel()
		if err := <-s.runDone; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("tracing: %w", err))
		}
		close(s.viewStop)
		<-s.viewDone
	}
	s.agg.Stop()
	stats := s.pipe.Stats()
	cctx, cancel := context.WithTimeout(context.Background(), FlushTimeout)
	sum, err := s.pipe.Close(cctx, detachBy)
	cancel()
	if err != nil {
		errs = append(errs, fmt.Errorf("close pipeline: %w", err))
	}
	sum.DroppedEvents = max(sum.DroppedEvents, stats.Drops)
	sum.Sidecar = &correlate.SidecarCost{Events: stats.EventsRead, EventsByKind: stats.EventsByKind}
	stats.Drops = sum.DroppedEvents
	s.agg.SetStats(stats)
	s.agg.SetSummary(sum)
	if s.gaps != nil {
		if err := s.gaps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.trace != nil {
		if err := s.trace.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	sum.Processes = s.procs.list()
	sum.CallSites = s.agg.CallSites(maxSummaryCallSites)
	sum.CPUCode = s.agg.CPUCode(maxSummaryCallSites)
	s.sum = sum
	title := s.title
	if w := where(sum.Processes); w != "" {
		title += " · " + w
	}
	if s.cfg.SummaryJSON != "" {
		if err := writeSummaryJSON(s.cfg.SummaryJSON, sum, s.wi.Estimates(), &s.steps, s.agg.View("").Hangs...); err != nil {
			errs = append(errs, err)
		}
	}
	_, width := s.deps.IsTerminal()
	out := live.Outputs{Gaps: s.cfg.GapsOut, Spans: s.spans, Summary: s.cfg.SummaryJSON, Prometheus: s.cfg.Prometheus,
		Trace: s.cfg.PerfettoOut, Windows: s.cfg.WindowsOut, Record: s.cfg.Record}
	// An output that could not be written whole is not listed as written:
	// the summary and the trace appear whole or not at all, the streamed
	// files keep what was written before the failure.
	failed := safefile.FailedPaths(errors.Join(errs...))
	for _, p := range []*string{&out.Gaps, &out.Spans, &out.Summary, &out.Trace, &out.Windows, &out.Record} {
		if *p != "" && slices.Contains(failed, *p) {
			if p == &out.Summary || p == &out.Trace {
				*p += " (NOT written: see the error above)"
			} else {
				*p += " (INCOMPLETE: a write failed, see the error above)"
			}
		}
	}
	if s.cfg.OTLPConfigured(s.deps.Getenv) {
		out.OTLP = s.cfg.OTLPEndpoint
		if out.OTLP == "" {
			out.OTLP = firstNonEmpty(s.deps.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), s.deps.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
		}
		out.OTLP = otel.RedactURL(out.OTLP) + otlpNote(s.pipe.Stats().Export)
	}
	fmt.Fprint(s.deps.Stdout, live.Summary(s.agg.View(title), out, width))
	return errors.Join(errs...)
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func absOrSame(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
