package correlate

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// A recording is the engine's whole input, call by call, as gzip-compressed
// JSON lines: one header line with the configuration, then one line per
// Event, Window, Advance, SetDevice, SetRank and the final Close, in the order the
// sidecar made them. Replaying it through a fresh Engine gives exactly the
// gaps, steps and summary of the run (the engine is deterministic in its
// input), so a user's recording reproduces a mis-attribution offline, and
// the golden replay tests use the same format.

// Call is one recorded call to an Engine; exactly one field is set.
type Call struct {
	Header  *RecordHeader    `json:"header,omitempty"`
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
	From string       `json:"from"`
	Recs []PeerRecord `json:"recs,omitempty"`
	Left bool         `json:"left,omitempty"`
}

// RecordHeader is the first line of a recording: what the engine was
// configured with.
type RecordHeader struct {
	Version string `json:"version,omitempty"` // gaptrace's version
	Probes  string `json:"probes"`
	MinGap  int64  `json:"min_gap_ns,omitempty"`
	// NoGPUWindows: the run had no NVML (Config.NoGPUWindows).
	NoGPUWindows bool `json:"no_gpu_windows,omitempty"`
}

// Config is the engine configuration the recording was made with (its
// Logger left for the caller).
func (h RecordHeader) Config() Config {
	cfg := Config{Probes: h.Probes, NoGPUWindows: h.NoGPUWindows}
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

// Recorder writes a recording. Its methods mirror the Engine's and are
// safe for concurrent use; the first write error is kept and returned by
// Close, and later calls are dropped, so recording never stops tracing.
type Recorder struct {
	mu  sync.Mutex
	zw  *gzip.Writer
	bw  *bufio.Writer
	enc *json.Encoder
	err error
}

// NewRecorder starts a recording on w with its header.
func NewRecorder(w io.Writer, h RecordHeader) *Recorder {
	bw := bufio.NewWriterSize(w, 256<<10)
	zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed) // level is valid
	r := &Recorder{zw: zw, bw: bw, enc: json.NewEncoder(zw)}
	r.put(Call{Header: &h})
	return r
}

func (r *Recorder) put(c Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = r.enc.Encode(c)
	}
}

// Event records an Engine.Event call.
func (r *Recorder) Event(ev *event.Event) { r.put(Call{Ev: ev}) }

// Window records an Engine.Window call.
func (r *Recorder) Window(w *event.GPUWindow) { r.put(Call{Win: w}) }

// Advance records an Engine.Advance call.
func (r *Recorder) Advance(now int64) { r.put(Call{Advance: now}) }

// SetDevice records an Engine.SetDevice call.
func (r *Recorder) SetDevice(pid uint32, dev int) {
	r.put(Call{Device: &DeviceCall{PID: pid, Device: dev}})
}

// SetRank records an Engine.SetRank call.
func (r *Recorder) SetRank(pid uint32, rank, size int) {
	r.put(Call{Rank: &RankCall{PID: pid, Rank: rank, Size: size}})
}

// Peer records an Engine.Peer call.
func (r *Recorder) Peer(from string, recs []PeerRecord) {
	r.put(Call{Peer: &PeerCall{From: from, Recs: recs}})
}

// PeerLeft records Engine.PeerLeft.
func (r *Recorder) PeerLeft(from string) { r.put(Call{Peer: &PeerCall{From: from, Left: true}}) }

// ProbesLive records an Engine.ProbesLive call.
func (r *Recorder) ProbesLive(full bool, at int64) {
	r.put(Call{Probes: &ProbesCall{Full: full, At: at}})
}

// Close records the Engine.Close call at now and flushes the recording; it
// returns the first error met while recording.
func (r *Recorder) Close(now int64) error {
	r.put(Call{Close: now})
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.err
	r.err = errors.New("recording closed")
	return errors.Join(err, r.zw.Close(), r.bw.Flush())
}

// ReadRecording reads a whole recording. A recording cut short (the
// sidecar was killed) yields the calls before the damage and an error
// that says so; a missing Close is not an error (Replay adds one).
func ReadRecording(rd io.Reader) (RecordHeader, []Call, error) {
	var h RecordHeader
	zr, err := gzip.NewReader(rd)
	if err != nil {
		return h, nil, fmt.Errorf("not a gaptrace recording (gzip): %w", err)
	}
	var calls []Call
	dec := json.NewDecoder(zr)
	for n := 1; ; n++ {
		var c Call
		if err := dec.Decode(&c); err != nil {
			if errors.Is(err, io.EOF) {
				return h, calls, nil
			}
			return h, calls, fmt.Errorf("recording damaged at line %d (kept the %d calls before it): %w", n, len(calls), err)
		}
		if c.Header != nil {
			h = *c.Header
			continue
		}
		calls = append(calls, c)
	}
}

// Replay runs calls through a fresh Engine configured by cfg and returns
// its summary; gaps and steps go to sink. Without a recorded Close the
// engine is closed one second after the last Advance, like a sidecar's
// shutdown.
func Replay(cfg Config, sink Sink, calls []Call) Summary {
	e := New(cfg, sink)
	var last int64
	for _, c := range calls {
		switch {
		case c.Ev != nil:
			e.Event(*c.Ev)
			last = max(last, c.Ev.End)
		case c.Win != nil:
			e.Window(*c.Win)
		case c.Device != nil:
			e.SetDevice(c.Device.PID, c.Device.Device)
		case c.Rank != nil:
			e.SetRank(c.Rank.PID, c.Rank.Rank, c.Rank.Size)
		case c.Probes != nil:
			e.ProbesLive(c.Probes.Full, c.Probes.At)
		case c.Peer != nil && c.Peer.Left:
			e.PeerLeft(c.Peer.From)
		case c.Peer != nil:
			e.Peer(c.Peer.From, c.Peer.Recs)
		case c.Advance != 0:
			e.Advance(c.Advance)
			last = max(last, c.Advance)
		case c.Close != 0:
			return e.Close(c.Close)
		}
	}
	return e.Close(last + int64(time.Second))
}
