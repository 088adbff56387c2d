package cli

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

// output is where a tracing command writes: the live view's terminal (nil
// unless the view is redrawn in place) and the base logger. Each
// component adds its own "component" attribute to the logger.
type output struct {
	mode string         // "on" (redrawn frame), "log" (periodic lines), "off"
	term *live.Terminal // when mode is "on"
	log  *slog.Logger
}

// newOutput resolves --live and builds the logger. When the view is
// redrawn on the terminal that stderr also goes to, log lines are written
// through it, above the frame, instead of across it.
func newOutput(cfg *config.Config, deps Deps) output {
	isTTY, _ := deps.IsTerminal()
	o := output{mode: cfg.Live}
	if o.mode == "auto" {
		o.mode = map[bool]string{true: "on", false: "log"}[isTTY]
	}
	// Log lines go straight to stderr: on the terminal they scroll in the
	// region above the view, like the traced command's output.
	w := deps.Stderr
	sizeUnknown := false
	if o.mode == "on" {
		o.term = &live.Terminal{W: deps.Stdout, Rows: deps.TerminalRows}
		if !o.term.SizeKnown() {
			// Nothing could be drawn until the summary: the periodic
			// line says at least how it goes.
			o.mode, o.term, sizeUnknown = "log", nil, true
		}
	}
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.LogLevel)) //nolint:errcheck // validated by config
	o.log = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
	if sizeUnknown {
		o.log.Warn("the terminal reports no size (0 rows), so the live view cannot be drawn: a status line every 5 s instead; "+
			"give it a size (stty rows 40 cols 120) for the view", "component", "cli")
	}
	return o
}

// fail prints one clear message and returns ExitFailure.
func fail(deps Deps, cmd config.Command, format string, a ...any) int {
	fmt.Fprintf(deps.Stderr, "gaptrace %s: %s\n", cmd, fmt.Sprintf(format, a...))
	return ExitFailure
}

// gapsWriter is the --gaps-out sink: correlate's JSON-lines encoding, in
// start order (gaps leave a short reorder window), buffered and written in
// whole lines, so a crash loses at most the window and the buffer and a
// full disk never leaves half a line.
type gapsWriter struct {
	mu   sync.Mutex
	log  *slog.Logger
	f    *safefile.Writer
	buf  bytes.Buffer
	gaps *correlate.GapsJSONL
	// order holds gaps briefly so the file is in start order.
	order startOrder
}

const gapsFlushAt = 64 << 10

func newGapsWriter(path string, log *slog.Logger) (*gapsWriter, error) {
	f, err := safefile.NewWriter(path)
	if err != nil {
		return nil, fmt.Errorf("create gaps file: %w", err)
	}
	g := &gapsWriter{f: f, log: log}
	g.gaps = correlate.WriteGapsJSONL(&g.buf)
	g.order.out = func(gap correlate.Gap) {
		g.gaps.Gap(gap)
		if g.buf.Len() >= gapsFlushAt {
			g.flushLocked()
		}
	}
	return g, nil
}

func (g *gapsWriter) Gap(gap correlate.Gap) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.order.add(gap)
}

// flushLocked writes the buffered whole lines; a failed write is kept in
// the writer and reported at Close.
func (g *gapsWriter) flushLocked() {
	if g.buf.Len() > 0 {
		failed := g.f.Err() != nil
		if err := g.f.WriteRecords(g.buf.Bytes()); err != nil && !failed {
			// Said when it happens, not only in the summary.
			g.log.Error("gaps file write failed; no more gaps are written to it", "err", err)
		}
		g.buf.Reset()
	}
}

func (g *gapsWriter) Step(correlate.StepResult) {}

func (g *gapsWriter) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.order.flush()
	g.flushLocked()
	err := errors.Join(g.gaps.Err(), g.f.Close())
	if err != nil {
		return fmt.Errorf("gaps file %s: %w", g.f.Name(), err)
	}
	return nil
}
