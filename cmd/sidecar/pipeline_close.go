package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/cli"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

// Close finishes correlation and flushes the exporter within ctx, then
// detaches every probe. Detaching has no deadline: it must complete, or
// probes of ours would outlive the session.
func (p *pipeline) Close(ctx context.Context, detachBy time.Time) (correlate.Summary, error) {
	st := p.tr.Stats()
	var errs []error
	t0 := time.Now()
	now := time.Now().UnixNano()
	sum := p.in.Close(now)
	if p.peers != nil {
		st := p.peers.Stats()
		p.log.Info("peer exchange", "role", st.Role, "peers", st.Peers, "sent", st.Sent, "received", st.Received,
			"dropped", st.Dropped, "rejected", st.Rejected, "clock_offset_us", st.OffsetNS/1000)
		if err := p.peers.Close(); err != nil {
			p.log.Warn("close the peer exchange", "err", err)
		}
	}
	if err := p.endRecording(now); err != nil {
		errs = append(errs, fmt.Errorf("recording: %w", err))
	}
	if sum.Probes == "" {
		sum.Probes = p.cfg.Config.Probes
	}
	if p.auto != nil {
		c := p.autoCost
		share := 0.0
		if sum.WallNS > 0 {
			share = float64(sum.ProbesFullNS) / float64(sum.WallNS)
		}
		p.log.Info("auto: per-launch probe windows", "windows", c.attaches+1, "full_share", fmt.Sprintf("%.3f", share),
			"attach_mean", meanDur(c.attach, c.attaches), "detach_mean", meanDur(c.detach, c.detaches))
	}
	sum.DroppedEvents = max(sum.DroppedEvents, st.RingDrops)
	p.exp.Summary(sum, sum.DroppedEvents)
	// The engine has emitted everything: flushing the exporter and
	// detaching the probes (which can take seconds on a busy kernel) run
	// side by side, so the exit waits for the longer one, not the sum.
	flushed := make(chan error, 1)
	go func() { flushed <- p.exp.Shutdown(ctx) }()
	p.log.Info("detaching probes")
	detached := make(chan error, 1)
	go func() {
		err := p.tr.Close()
		time.Sleep(p.detachDelay)
		detached <- err
	}()
	if err := awaitDetach(detached, detachBy, p.log); err != nil {
		errs = append(errs, fmt.Errorf("detach probes: %w", err))
	}
	t1 := time.Now()
	if err := <-flushed; err != nil {
		errs = append(errs, fmt.Errorf("flush exporter: %w", err))
	}
	if es := p.exp.Stats(); es.SpansDropped > 0 || es.GapsDropped > 0 {
		p.log.Warn("exporter dropped data", "spans_dropped", es.SpansDropped, "gaps_dropped", es.GapsDropped, "export_errors", es.ExportErrors)
	}
	t2 := time.Now()
	p.closeGPU()
	if p.winOut != nil {
		if err := p.winOut.close(); err != nil {
			errs = append(errs, err)
		}
	}
	p.log.Debug("pipeline closed", "detach", t1.Sub(t0), "flush", t2.Sub(t0))
	return sum, errors.Join(errs...)
}

// awaitDetach waits for the detach to report on done, or until by (zero:
// for as long as it takes). Past by the detach goes on in the background:
// every probe is a file descriptor of gaptrace's, so whatever it has not
// closed when gaptrace exits the kernel detaches then, and nothing stays
// attached once the process is gone (cli.DetachTimeout).
func awaitDetach(done <-chan error, by time.Time, log *slog.Logger) error {
	if by.IsZero() {
		return <-done
	}
	select {
	case err := <-done:
		return err
	default:
	}
	timer := time.NewTimer(time.Until(by))
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		// Nothing is wrong: closing the probes' descriptors at exit ends
		// the detach, on a loaded host most runs get here.
		log.Debug("probes still detaching at the deadline; not waiting longer: the kernel detaches the rest when gaptrace exits",
			"deadline", cli.DetachTimeout.String()+" after tracing stopped")
		return nil
	}
}

// detachDelayEnv, not an option, makes the probe detach at exit end a
// duration late (its closes done, the end not yet reported), for testing
// that gaptrace exits on time when detaching is slow.
const detachDelayEnv = "GAPTRACE_TEST_DETACH_DELAY"

// closeRecording closes rec (already closed with the engine's inputs: this
// returns what it met) and then its file, and says once what went wrong,
// naming the file.
func closeRecording(rec *record.Writer, f *safefile.Stream, path string, now int64) error {
	err := rec.Close(now)
	var we *safefile.WriteError
	if ferr := f.Close(); ferr != nil {
		err = ferr // what the recorder met writing, said once
	} else if err != nil && !errors.As(err, &we) {
		err = &safefile.WriteError{Path: path, Err: err}
	}
	return err
}
