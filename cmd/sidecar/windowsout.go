package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

// windowsWriter writes --windows-out: one JSON object per GPU window.
type windowsWriter struct {
	f   *safefile.Writer
	log *slog.Logger
	buf bytes.Buffer
	enc *json.Encoder
	err error
}

type windowJSON struct {
	Device         int     `json:"device"`
	UUID           string  `json:"uuid,omitempty"`
	Source         string  `json:"source"`
	Start          int64   `json:"start_unix_nano"`
	End            int64   `json:"end_unix_nano"`
	IdleFraction   float64 `json:"idle_fraction"`
	SMActivity     float64 `json:"sm_activity"`
	TensorActivity float64 `json:"tensor_activity"`
	// SkewNS: GPM counters taken before the sampler aligned to their
	// refresh may be up to this much older than the window says.
	SkewNS int64 `json:"skew_ns,omitempty"`
}

func newWindowsWriter(path string, log *slog.Logger) (*windowsWriter, error) {
	f, err := safefile.NewWriter(path)
	if err != nil {
		return nil, fmt.Errorf("windows file: %w", err)
	}
	ww := &windowsWriter{f: f, log: log}
	ww.enc = json.NewEncoder(&ww.buf)
	return ww, nil
}

func (ww *windowsWriter) write(w event.GPUWindow) {
	if ww.err == nil {
		ww.err = ww.enc.Encode(windowJSON{Device: w.Device, UUID: w.UUID, Source: w.Source.String(), Start: w.Start,
			End: w.End, IdleFraction: w.IdleFraction, SMActivity: w.SMActivity, TensorActivity: w.TensorActivity, SkewNS: w.Skew})
	}
	if ww.buf.Len() >= 64<<10 {
		ww.flush()
	}
}

// flush writes whole lines only; a write error is sticky in f, said when
// it happens and returned by close.
func (ww *windowsWriter) flush() {
	if ww.buf.Len() > 0 {
		failed := ww.f.Err() != nil
		if err := ww.f.WriteRecords(ww.buf.Bytes()); err != nil && !failed {
			ww.log.Error("windows file write failed; no more windows are written to it", "err", err)
		}
	}
	ww.buf.Reset()
}

func (ww *windowsWriter) close() error {
	ww.flush()
	if err := errors.Join(ww.err, ww.f.Close()); err != nil {
		return fmt.Errorf("windows file %s: %w", ww.f.Name(), err)
	}
	return nil
}
