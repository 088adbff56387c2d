package record

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/ranks"
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// Call is one recorded call to an Engine; exactly one field is set.
type Call struct {
	Header  *Header          `json:"header,omitempty"`
	Ev      *event.Event     `json:"ev,omitempty"`
	Win     *event.GPUWindow `json:"win,omitempty"`
	Advance int64            `json:"advance,omitempty"`
	Close   int64            `json:"close,omitempty"`
	Device  *DeviceCall      `json:"device,omitempty"`
	Rank    *RankCall        `json:"rank,omitempty"`
	Probes  *ProbesCall      `json:"probes,omitempty"`
	Peer    *PeerCall        `json:"peer,omitempty"`
}

// ProbesCall is a recorded ProbesLive (probe set auto's windows).
type ProbesCall struct {
	Full bool  `json:"full"`
	At   int64 `json:"at"`
}

// PeerCall is records from another sidecar of the job (Engine.Peer), or
// its leaving (Left).
type PeerCall struct {
	From string                 `json:"from"`
	Recs []correlate.PeerRecord `json:"recs,omitempty"`
	Left bool                   `json:"left,omitempty"`
}

// Header is the first line of a recording: what the engine was
// configured with.
type Header struct {
	Version string `json:"version,omitempty"` // gaptrace's version
	Probes  string `json:"probes"`
	MinGap  int64  `json:"min_gap_ns,omitempty"`
	// NoGPUWindows: the run had no NVML (correlate.Config.NoGPUWindows).
	NoGPUWindows bool `json:"no_gpu_windows,omitempty"`
	// GPMDevices: the devices whose GPM windows were to come
	// (correlate.Config.GPMDevices); none in recordings made before it.
	GPMDevices []int `json:"gpm_devices,omitempty"`
}

// Config is the engine configuration the recording was made with (its
// Logger left for the caller).
func (h Header) Config() correlate.Config {
	cfg := correlate.Config{Probes: h.Probes, NoGPUWindows: h.NoGPUWindows, GPMDevices: h.GPMDevices}
	if h.MinGap > 0 {
		cfg.MinGap = time.Duration(h.MinGap)
	}
	return cfg
}

// DeviceCall is a recorded SetDevice.
type DeviceCall struct {
	PID    uint32 `json:"pid"`
	Device int    `json:"device"`
}

// RankCall is a recorded SetRank.
type RankCall struct {
	PID  uint32 `json:"pid"`
	Rank int    `json:"rank"`
	Size int    `json:"size,omitempty"`
}

// Writer writes a recording. Its methods mirror the Engine's and are
// safe for concurrent use; the first write error is kept and returned by
// Close, and later calls are dropped, so recording never stops tracing.
type Writer struct {
	mu  sync.Mutex
	zw  *gzip.Writer
	bw  *bufio.Writer
	enc *json.Encoder
	err error

	closed bool  // Close has run
	result error // what the first Close returned
}

// NewWriter starts a recording on w with its header.
func NewWriter(w io.Writer, h Header) *Writer {
	bw := bufio.NewWriterSize(w, 256<<10)
	zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed) // level is valid
	r := &Writer{zw: zw, bw: bw, enc: json.NewEncoder(zw)}
	r.put(Call{Header: &h})
	return r
}

func (r *Writer) put(c Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = r.enc.Encode(c)
	}
}

// Event records an Engine.Event call.
func (r *Writer) Event(ev *event.Event) { r.put(Call{Ev: ev}) }

// Window records an Engine.Window call.
func (r *Writer) Window(w *event.GPUWindow) { r.put(Call{Win: w}) }

// Advance records an Engine.Advance call.
func (r *Writer) Advance(now int64) { r.put(Call{Advance: now}) }

// SetDevice records an Engine.SetDevice call.
func (r *Writer) SetDevice(pid uint32, dev int) {
	r.put(Call{Device: &DeviceCall{PID: pid, Device: dev}})
}

// SetRank records an Engine.SetRank call.
func (r *Writer) SetRank(pid uint32, rank, size int) {
	r.put(Call{Rank: &RankCall{PID: pid, Rank: rank, Size: size}})
}

// Peer records an Engine.Peer call.
func (r *Writer) Peer(from string, recs []correlate.PeerRecord) {
	r.put(Call{Peer: &PeerCall{From: from, Recs: recs}})
}

// PeerLeft records Engine.PeerLeft.
func (r *Writer) PeerLeft(from string) { r.put(Call{Peer: &PeerCall{From: from, Left: true}}) }

// ProbesLive records an Engine.ProbesLive call.
func (r *Writer) ProbesLive(full bool, at int64) {
	r.put(Call{Probes: &ProbesCall{Full: full, At: at}})
}

// Close records the Engine.Close call at now and flushes the recording; it
// returns the first error met while recording. A later Close records
// nothing and returns the first one's result, so the owner of the
// recording's file can ask for it after the engine's inputs were closed.
func (r *Writer) Close(now int64) error {
	r.put(Call{Close: now})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.result
	}
	r.closed = true
	r.result = errors.Join(r.err, r.zw.Close(), r.bw.Flush())
	r.err = errors.New("recording closed")
	return r.result
}

// Read reads a whole recording. A recording cut short (the
// sidecar was killed) yields the calls before the damage and an error
// that says so; a missing Close is not an error (Replay adds one). Calls
// that fail their checks are left out (Reader).
func Read(rd io.Reader) (Header, []Call, error) {
	r, err := NewReader(rd)
	if err != nil {
		return Header{}, nil, err
	}
	var calls []Call
	for c := range r.Calls() {
		calls = append(calls, c)
	}
	return r.Header(), calls, r.Err()
}

// MaxLine bounds one line of a recording: a longer one is
// skipped unread (a recorded call is at most a peer batch, ~100 KiB).
const MaxLine = 4 << 20

// Reader reads a recording a call at a time, in memory bounded by
// MaxLine whatever the file holds. Every call is checked before it
// is returned (Check); one that fails, or a line too long, is skipped
// and counted.
type Reader struct {
	zr      *gzip.Reader
	br      *bufio.Reader
	h       Header
	pending *Call // the first call, read with the header
	line    int   // lines read
	calls   int   // calls returned
	skipped int
	err     error
	done    bool
}

// NewReader starts reading the recording rd; it reads the header
// line.
func NewReader(rd io.Reader) (*Reader, error) {
	zr, err := gzip.NewReader(rd)
	if err != nil {
		return nil, fmt.Errorf("not a gaptrace recording (gzip): %w", err)
	}
	r := &Reader{zr: zr, br: bufio.NewReaderSize(zr, 64<<10)}
	if c, ok := r.next(); ok {
		r.pending = &c
	}
	return r, nil
}

// Header is the recording's configuration (zero when it has none).
func (r *Reader) Header() Header { return r.h }

// Skipped counts the calls left out: a field out of range, a line longer
// than MaxLine.
func (r *Reader) Skipped() int { return r.skipped }

// Err says why reading stopped before the end: the recording is damaged
// (cut short, not JSON); nil at its end.
func (r *Reader) Err() error { return r.err }

// Calls yields the recording's calls, header lines aside, until its end or
// its damage (Err).
func (r *Reader) Calls() iter.Seq[Call] {
	return func(yield func(Call) bool) {
		if c := r.pending; c != nil {
			r.pending = nil
			if !yield(*c) {
				return
			}
		}
		for {
			c, ok := r.next()
			if !ok || !yield(c) {
				return
			}
		}
	}
}

// next reads the next call to return.
func (r *Reader) next() (Call, bool) {
	for !r.done {
		b, err := r.readLine()
		switch {
		case errors.Is(err, errLongLine):
			r.skipped++
			continue
		case errors.Is(err, io.EOF) && len(b) == 0:
			r.done = true
			return Call{}, false
		case err != nil && !errors.Is(err, io.EOF):
			r.fail(err)
			return Call{}, false
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var c Call
		if err := json.Unmarshal(b, &c); err != nil {
			r.fail(err)
			return Call{}, false
		}
		if c.Header != nil {
			r.h = *c.Header
			continue
		}
		if Check(&c) != nil {
			r.skipped++
			continue
		}
		r.calls++
		return c, true
	}
	return Call{}, false
}

func (r *Reader) fail(err error) {
	r.done = true
	r.err = fmt.Errorf("recording damaged at line %d (kept the %d calls before it): %w", r.line, r.calls, err)
}

var errLongLine = fmt.Errorf("line longer than %d bytes", MaxLine)

// readLine reads one line, without its newline; a line longer than
// MaxLine is read through and reported as errLongLine.
func (r *Reader) readLine() ([]byte, error) {
	r.line++
	var buf []byte
	long := false
	for {
		frag, err := r.br.ReadSlice('\n')
		if !long {
			if len(buf)+len(frag) > MaxLine+1 {
				long, buf = true, nil
			} else {
				buf = append(buf, frag...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil && (len(buf) > 0 || long) && errors.Is(err, io.EOF):
			// A last line without its newline: whole if it parses.
			if long {
				return nil, errLongLine
			}
			return buf, nil
		case err != nil:
			return nil, err
		case long:
			return nil, errLongLine
		}
		return bytes.TrimSuffix(buf, []byte("\n")), nil
	}
}

// Bounds of the fields of a recorded call (see ranks.Record.Check).
const (
	maxCallPeerRecs = 1 << 14
	maxCallName     = 4096
	maxCallDevice   = 1 << 16
	maxMarkerName   = 64 // what the tracer reads of a marker's name
)

// Check reports whether a recorded call holds exactly one call whose
// fields lie within what a sidecar records; replay skips one that does not.
func Check(c *Call) error {
	inTime := func(what string, t int64) error {
		if t < 0 || t >= ranks.MaxTime {
			return fmt.Errorf("%s time %d out of range", what, t)
		}
		return nil
	}
	n := 0
	for _, set := range []bool{c.Ev != nil, c.Win != nil, c.Advance != 0, c.Close != 0, c.Device != nil,
		c.Rank != nil, c.Probes != nil, c.Peer != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("a recorded line holds %d calls, want 1", n)
	}
	switch {
	case c.Ev != nil:
		ev := c.Ev
		if ev.Kind == event.KindInvalid || ev.Kind > event.KindFaultRead && ev.Kind != event.KindMarker {
			return fmt.Errorf("event kind %d out of range", ev.Kind)
		}
		if ev.Kind == event.KindMarker && (len(ev.Name) > maxMarkerName || stepclock.ClassOf(ev.Name) == stepclock.MarkerNone) {
			return fmt.Errorf("marker %.80q is not a step marker of at most %d bytes", ev.Name, maxMarkerName)
		}
		if ev.Kind == event.KindCommInit && (ev.Count > uint64(ranks.MaxRanks) || ev.PeerRank < -1 || ev.PeerRank >= ranks.MaxRanks) {
			return fmt.Errorf("communicator of %d ranks, rank %d, out of range", ev.Count, ev.PeerRank)
		}
		return errors.Join(inTime("event start", ev.Start), inTime("event end", ev.End))
	case c.Win != nil:
		if c.Win.Device < 0 || c.Win.Device >= maxCallDevice || c.Win.End < c.Win.Start {
			return fmt.Errorf("GPU window of device %d from %d to %d out of range", c.Win.Device, c.Win.Start, c.Win.End)
		}
		return errors.Join(inTime("window start", c.Win.Start), inTime("window end", c.Win.End))
	case c.Advance != 0:
		return inTime("advance", c.Advance)
	case c.Close != 0:
		return inTime("close", c.Close)
	case c.Device != nil:
		if c.Device.Device < 0 || c.Device.Device >= maxCallDevice {
			return fmt.Errorf("device %d out of range", c.Device.Device)
		}
	case c.Rank != nil:
		if c.Rank.Rank < -1 || c.Rank.Rank >= int(ranks.MaxRanks) || c.Rank.Size < 0 || c.Rank.Size > int(ranks.MaxRanks) {
			return fmt.Errorf("rank %d of %d out of range", c.Rank.Rank, c.Rank.Size)
		}
	case c.Probes != nil:
		return inTime("probes", c.Probes.At)
	case c.Peer != nil:
		if len(c.Peer.From) > maxCallName || len(c.Peer.Recs) > maxCallPeerRecs {
			return fmt.Errorf("peer batch of %d records from a %d-byte name out of range", len(c.Peer.Recs), len(c.Peer.From))
		}
		for i := range c.Peer.Recs {
			if err := c.Peer.Recs[i].Check(); err != nil {
				return err
			}
		}
	}
	return nil
}
