package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/workload"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/wake"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/tracer"
)

// hangEvery is how often the hang watch looks at what is in flight.
const hangEvery = time.Second

// hangWatch runs the hang detector on a timer of its own, apart from the
// engine (whose reorder window would hold a report back): each tick reads
// the tracer's per-thread in-flight state and /proc, and reports a hang the
// moment it is found. The pipeline tells it, from the events it already
// routes, the few facts the BPF state lacks: collectives (their
// communicator and sequence), communicator ranks, exits, peers' records and
// GPU windows. None of that adds work per event beyond a kind comparison in
// the pipeline's existing switch.
type hangWatch struct {
	log  *slog.Logger
	tr   *tracer.Tracer
	det  *hang.Detector
	exp  *otel.Exporter
	out  func(*hang.Report) // the session's side (gaps file, live view); nil: none
	work *workload.Resolver
	host string
	// detMu serializes the detector and the reports it holds between the
	// ticks and a dump.
	detMu sync.Mutex

	mu      sync.Mutex
	comms   map[commKey]*commState
	streams map[streamKey]commKey // the last collective on each (pid, stream)
	exited  map[uint32]hang.Proc
	remote  map[remoteKey]*hang.Member
	windows map[windowKey]event.GPUWindow
	devices map[uint32]int
	ranks   map[uint32]int32 // from the environment (-1: none), read once

	// The process states told to and heard from the other sidecars
	// (hangpeers.go); send is nil without --peers.
	send        func(correlate.PeerRecord)
	told        map[uint32]toldState
	lastRefresh int64
	remoteProcs map[procKey]hang.Proc

	// checkCost: the time each tick took, for the bench and the logs.
	ticks     int64
	tickNanos int64
}

type commKey struct {
	pid  uint32
	comm uint64
}

type streamKey struct {
	pid    uint32
	stream uint64
}

type remoteKey struct {
	from string
	pid  uint32
	comm uint64
}

type windowKey struct {
	device int
	source event.WindowSource
}

// commState is one communicator of a local process.
type commState struct {
	n     int64 // collectives issued on it
	last  hang.Collective
	rank  int32 // -1: unknown
	ranks int32
}

func newHangWatch(after time.Duration, tr *tracer.Tracer, exp *otel.Exporter, out func(*hang.Report),
	work *workload.Resolver, log *slog.Logger) *hangWatch {
	host, err := os.Hostname()
	if err != nil {
		host = ""
	}
	return &hangWatch{log: log.With("component", "hang"), tr: tr, det: hang.New(after), exp: exp, out: out, work: work,
		host: host, comms: map[commKey]*commState{}, streams: map[streamKey]commKey{}, exited: map[uint32]hang.Proc{},
		remote: map[remoteKey]*hang.Member{}, windows: map[windowKey]event.GPUWindow{}, devices: map[uint32]int{},
		ranks: map[uint32]int32{}, told: map[uint32]toldState{}, remoteProcs: map[procKey]hang.Proc{}}
}

// collective notes a collective issued (engine goroutine).
func (h *hangWatch) collective(ev *event.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := commKey{ev.PID, ev.Comm}
	c := h.comms[k]
	if c == nil {
		c = &commState{rank: -1}
		h.comms[k] = c
	}
	c.last = hang.Collective{Op: ev.Op.String(), Comm: ev.Comm, Seq: c.n, Bytes: ev.Bytes, Stream: ev.Stream,
		Rank: c.rank, Ranks: c.ranks, Issued: ev.Start}
	c.n++
	h.streams[streamKey{ev.PID, ev.Stream}] = k
}

// commInit notes a communicator's creation: its rank and size.
func (h *hangWatch) commInit(ev *event.Event) {
	if ev.Comm == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := commKey{ev.PID, ev.Comm}
	c := h.comms[k]
	if c == nil {
		c = &commState{}
		h.comms[k] = c
	}
	c.rank, c.ranks = ev.PeerRank, int32(ev.Count)
}

// exit notes a local process's exit.
func (h *hangWatch) exit(ev *event.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.exited[ev.PID] = hang.Proc{PID: ev.PID, Host: h.host, State: hang.StateExited, Since: ev.Start, Comm: ev.TaskComm,
		Exit: waitText(int(ev.Ret))}
}

// window keeps the latest GPU window of each device and source.
func (h *hangWatch) window(w *event.GPUWindow) {
	h.mu.Lock()
	h.windows[windowKey{w.Device, w.Source}] = *w
	h.mu.Unlock()
}

func (h *hangWatch) setDevice(pid uint32, dev int) {
	h.mu.Lock()
	h.devices[pid] = dev
	h.mu.Unlock()
}

// run ticks until ctx is done, then ends the hangs still in progress.
func (h *hangWatch) run(ctx context.Context) {
	t := wake.NewTicker(hangEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			h.finish()
			return
		case <-t.C:
			t.Next()
			h.tick(time.Now())
		}
	}
}

// tick takes one snapshot and reports what changed.
func (h *hangWatch) tick(now time.Time) {
	h.detMu.Lock()
	defer h.detMu.Unlock()
	t0 := time.Now()
	s, err := h.snapshot(now.UnixNano())
	if err != nil {
		h.log.Debug("hang check skipped", "err", err)
		return
	}
	started, ended := h.det.Check(s)
	h.tellStates(s.Procs, s.Now)
	h.mu.Lock()
	h.ticks++
	h.tickNanos += time.Since(t0).Nanoseconds()
	h.mu.Unlock()
	if len(started) > 0 {
		stacks := h.allStacks(s.Calls)
		for _, r := range started {
			r.GPU = h.gpuView(r.PID)
			r.Stacks = stacks
			h.log.Warn("hang: "+r.Reason, "pid", r.PID, "tid", r.TID, "rank", r.Rank, "call", r.Call.Name,
				"since", time.Unix(0, r.Since).UTC().Format(time.RFC3339Nano), "seconds", r.Seconds,
				"missing_ranks", len(r.Missing), "id", r.ID)
			h.report(r, true)
		}
	}
	for _, r := range h.det.Active() {
		if r.Detected != s.Now { // the new ones were just reported
			h.report(r, false)
		}
	}
	for _, r := range ended {
		h.log.Warn("hang ended", "pid", r.PID, "tid", r.TID, "call", r.Call.Name, "seconds", r.Seconds, "id", r.ID)
		h.report(r, false)
	}
}

func (h *hangWatch) report(r *hang.Report, started bool) {
	if h.exp != nil {
		h.exp.Hang(r, started)
	}
	if h.out != nil {
		h.out(r)
	}
}

// finish ends the hangs in progress when tracing stops: their time so far
// is what the summary counts.
func (h *hangWatch) finish() {
	h.detMu.Lock()
	defer h.detMu.Unlock()
	now := time.Now().UnixNano()
	for _, r := range h.det.Active() {
		r.Status, r.End = hang.Ended, now
		r.Seconds = float64(now-r.Since) / 1e9
		h.log.Warn("hang still in progress when tracing stopped", "pid", r.PID, "tid", r.TID, "seconds", r.Seconds, "id", r.ID)
		h.report(r, false)
	}
}

// cost is the mean time of one tick.
func (h *hangWatch) cost() (ticks int64, mean time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ticks == 0 {
		return 0, 0
	}
	return h.ticks, time.Duration(h.tickNanos / h.ticks)
}

// dump is every traced thread's state now, as JSON: `gaptrace dump`.
func (h *hangWatch) dump() ([]byte, error) {
	h.detMu.Lock()
	defer h.detMu.Unlock()
	s, err := h.snapshot(time.Now().UnixNano())
	if err != nil {
		return nil, err
	}
	d := struct {
		At        int64          `json:"at_unix_nano"`
		Host      string         `json:"host,omitempty"`
		HangAfter string         `json:"hang_after"`
		InFlight  []hang.Call    `json:"in_flight"`
		Hangs     []*hang.Report `json:"hangs"`
		Stacks    []hang.Stacks  `json:"processes"`
	}{At: s.Now, Host: h.host, HangAfter: h.det.After.String(), InFlight: s.Calls, Hangs: h.det.Active(),
		Stacks: h.allStacks(s.Calls)}
	if d.InFlight == nil {
		d.InFlight = []hang.Call{}
	}
	return json.MarshalIndent(d, "", "  ")
}

// watchHangs starts the hang watch beside Run; the function it returns
// stops it and waits until it ended the hangs in progress, so the session
// has them before its summary.
func (p *pipeline) watchHangs(ctx context.Context) func() {
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.hangs.run(hctx)
	}()
	return func() {
		cancel()
		<-done
		if n, mean := p.hangs.cost(); n > 0 {
			p.log.Info("hang watch", "ticks", n, "tick_mean", mean)
		}
	}
}

// Dump is every traced thread's in-flight call and stacks now (cli.Dumper).
func (p *pipeline) Dump() ([]byte, error) { return p.hangs.dump() }
