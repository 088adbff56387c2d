package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/cli"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/workload"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/gpusample"
	"github.com/gaptrace/gaptrace/internal/safefile"
	"github.com/gaptrace/gaptrace/otel"
	"github.com/gaptrace/gaptrace/tracer"
)

// Timing of the feed loop. Advance lets the engine finalise gaps whose
// late events can no longer arrive; the snapshot feeds the live view; the
// device scan maps newly started processes (DDP ranks, restarts) to GPUs.
const (
	advanceEvery  = 100 * time.Millisecond
	snapshotEvery = time.Second
	deviceEvery   = 2 * time.Second
	eventQueue    = 64 // batches of up to 512 events, one per pass over the ring
	windowQueue   = 256
	// windowDrain is how long GPU sampling goes on after tracing is told
	// to stop: NVML utilization samples arrive up to ~0.7 s after the
	// window they describe (sample period plus poll interval), and the
	// last steps' micro-gap idle comes from those windows.
	windowDrain = time.Second
)

// pipeline wires tracer → correlate ← gpusample and correlate → otel +
// the session's sink. One goroutine (Run's) owns the engine: every
// Event/Window/Advance and therefore every Sink call happens there, which
// is what correlate and otel require.
type pipeline struct {
	cfg     *cli.PipelineConfig
	log     *slog.Logger
	tr      *tracer.Tracer
	lagged  bool              // the reader was once maxReaderLag behind (logged once)
	gpu     *gpusample.Source // nil without NVML
	eng     *correlate.Engine // its outputs: snapshots, losses, peer records
	in      correlate.Input   // its inputs: the engine, or it recorded (--record)
	exp     *otel.Exporter
	events  chan []event.Event
	windows chan event.GPUWindow
	devices map[uint32]int
	mu      sync.Mutex
	targets []int
	winOut  *windowsWriter // --windows-out, nil when off
	// endRecording closes the --record file and returns what recording
	// met; it does nothing when not recording.
	endRecording func(now int64) error
	work         *workload.Resolver
	// ranked: processes whose rank the engine was told (or that have
	// none), at their first collective.
	ranked map[uint32]bool

	// Probe set auto: the schedule, the attach/detach in flight (one at a
	// time) and what the toggles cost.
	auto     *autoSchedule
	toggles  chan autoToggle
	toggling bool
	autoCost autoCost

	detachDelay time.Duration // detachDelayEnv

	// peers: the exchange with the job's other sidecars (--peers), nil
	// when off.
	peers *peers.Exchange

	hangs *hangWatch // hang.go
}

// withWorkload names the container, pod and rank of each gap's and step's
// process before the sinks see them.
type withWorkload struct {
	next correlate.Sink
	work *workload.Resolver
}

func (w withWorkload) Gap(g correlate.Gap) {
	g.Workload = w.work.Of(g.PID)
	w.next.Gap(g)
}

func (w withWorkload) Step(s correlate.StepResult) {
	s.Workload = w.work.Of(s.PID)
	for i := range s.GapList {
		s.GapList[i].Workload = s.Workload
	}
	w.next.Step(s)
}

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

func newPipeline(ctx context.Context, pc cli.PipelineConfig) (cli.Pipeline, error) {
	cfg := pc.Config
	log := pc.Logger.With("component", "pipeline")
	p := &pipeline{cfg: &pc, log: log, devices: map[uint32]int{}, ranked: map[uint32]bool{},
		work:   workload.New("/proc", workload.PodFromEnv(os.Getenv)),
		events: make(chan []event.Event, eventQueue), windows: make(chan event.GPUWindow, windowQueue)}
	if v := os.Getenv(detachDelayEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("$%s: %q is not a duration", detachDelayEnv, v)
		}
		p.detachDelay = d
	}

	// config refuses --peers without a job ID.
	job := otel.JobID(cfg.JobID)
	if cfg.WindowsOut != "" {
		ww, err := newWindowsWriter(cfg.WindowsOut, log)
		if err != nil {
			return nil, err
		}
		p.winOut = ww
	}
	src, err := gpusample.Open(gpusample.Config{LibPath: cfg.NVMLLib, Logger: pc.Logger})
	if err != nil {
		f := gpusample.Unavailable(err)
		log.Warn(f.Detail, "fix", f.Fix)
	} else {
		p.gpu = src
		for _, d := range src.Devices() {
			log.Info("GPU", "index", d.Index, "name", d.Name, "uuid", d.UUID, "gpm", d.GPMSupported)
		}
		for _, f := range src.Health() {
			if f.Level != gpusample.OK {
				log.Warn("GPU health: "+f.Detail, "device", f.Device, "check", f.Check, "fix", f.Fix)
			}
		}
	}

	tr, err := tracer.New(tracer.Config{
		Probes:           tracer.ProbeSet(cfg.Probes),
		SyscallThreshold: cfg.SyscallThreshold,
		LibCUDA:          cfg.CUDALib,
		LibNCCL:          cfg.NCCLLib,
		RingPoll:         cfg.RingPoll,
		Logger:           pc.Logger,
	})
	if err != nil {
		p.closeGPU()
		return nil, fmt.Errorf("load probes: %w", err)
	}
	p.tr = tr
	var autoOn tracer.LaunchToggle
	if cfg.Probes == string(tracer.ProbesAuto) {
		// Full from the start: the probes of the libraries Trace finds
		// attach with the per-launch ones.
		if autoOn, err = tr.SetLaunchProbes(true); err != nil {
			_ = tr.Close() // reporting the toggle error
			p.closeGPU()
			return nil, fmt.Errorf("auto probes: %w", err)
		}
		p.auto = newAutoSchedule(cfg.AutoWindow, cfg.AutoEvery, time.Now(), log)
		p.toggles = make(chan autoToggle, 1)
	}

	res := otel.ResourceInfo{TargetPID: pc.TargetPID, TargetCmdline: pc.TargetCmdline}
	if p.gpu != nil {
		if ds := p.gpu.Devices(); len(ds) > 0 {
			res.GPUName, res.GPUUUID = ds[0].Name, ds[0].UUID
		}
	}
	ocfg := otel.Config{
		ServiceName:    cfg.ServiceName,
		Endpoint:       cfg.OTLPEndpoint,
		Protocol:       cfg.OTLPProtocol,
		SpansFile:      pc.Spans,
		SpansMaxSize:   cfg.SpansMaxSize,
		SpansKeep:      cfg.SpansKeep,
		PrometheusAddr: cfg.Prometheus,
		JobID:          cfg.JobID,
		Rank:           cfg.Rank,
		Resource:       res,
		Logger:         pc.Logger,
	}
	if p.gpu != nil {
		uuids := map[int]string{}
		for _, d := range p.gpu.Devices() {
			uuids[d.Index] = d.UUID
		}
		ocfg.DeviceUUID = func(i int) string { return uuids[i] }
	}
	if cfg.OTLPInsecureOK {
		ocfg.Insecure = &cfg.OTLPInsecure
	}
	exp, err := otel.New(ctx, ocfg)
	if err != nil {
		_ = p.tr.Close() // reporting the exporter error
		p.closeGPU()
		return nil, fmt.Errorf("exporter: %w", err)
	}
	p.exp = exp

	probes := cfg.Probes
	if probes == string(tracer.ProbesNull) {
		probes = string(tracer.ProbesFull) // no events arrive: nothing to correlate
	}
	ccfg := correlate.Config{Probes: probes, MinGap: cfg.MinGap, NoGPUWindows: p.gpu == nil, Logger: pc.Logger}
	if p.gpu != nil {
		ccfg.HW = p.gpu.HWContext
	}
	p.endRecording = func(int64) error { return nil }
	var rec *correlate.Recorder
	if cfg.Record != "" {
		f, err := safefile.CreateStream(cfg.Record)
		if err != nil {
			_ = p.tr.Close() // reporting the recording's error
			p.closeGPU()
			return nil, fmt.Errorf("recording: %w", err)
		}
		f.OnError = func(err error) {
			log.Error("recording write failed; nothing more is recorded (the file keeps what was written before)", "err", err)
		}
		rec = correlate.NewRecorder(f, correlate.RecordHeader{Version: version, Probes: probes, MinGap: int64(cfg.MinGap), NoGPUWindows: p.gpu == nil})
		p.endRecording = func(now int64) error { return closeRecording(rec, f, cfg.Record, now) }
	}
	// The exporter first, then the session (live view, gaps file).
	sinks := correlate.Tee{exp, pc.Sink}
	if p.auto != nil {
		sinks = append(sinks, autoSink{p.auto})
	}
	p.eng = correlate.New(ccfg, withWorkload{sinks, p.work})
	p.in = p.eng
	if rec != nil {
		p.in = correlate.Recording(p.eng, rec)
	}
	p.hangs = newHangWatch(cfg.HangAfter, tr, exp, pc.Hang, p.work, pc.Logger)
	if cfg.Peers != "" {
		secret, err := peers.LoadSecret(cfg.PeersSecret)
		var x *peers.Exchange
		if err == nil {
			x, err = peers.Start(ctx, peers.Config{Addr: cfg.Peers, Job: job, ID: sidecarID(cfg.Rank), Secret: secret, Log: pc.Logger})
		}
		if err != nil {
			_ = p.tr.Close() // reporting the exchange's error
			p.closeGPU()
			return nil, err
		}
		p.peers = x
		p.eng.SetPeerOut(x.Send)
	}
	if p.auto != nil {
		p.probesLive(true, autoOn.At)
		log.Debug("auto: per-launch probes attached", "at", autoOn.At, "reason", "start")
	}

	var attached []string
	for _, a := range tr.Stats().Attached {
		attached = append(attached, a.Symbol)
	}
	log.Debug("probes attached", "count", len(attached))
	return p, nil
}

func (p *pipeline) closeGPU() {
	if p.gpu != nil {
		st := p.gpu.Stats()
		p.log.Debug("gpu sampling", "sample_calls", st.SampleCalls, "gpm_samples", st.GPMSamples, "gpm_misses", st.GPMMisses,
			"gpm_cost_mean_us", st.GPMCostMeanUS, "windows", st.Windows, "errors", st.Errors)
		if err := p.gpu.Close(); err != nil {
			p.log.Warn("close NVML", "err", err)
		}
		p.gpu = nil
	}
}

func (p *pipeline) Trace(pid int) error {
	if err := p.tr.Trace(pid); err != nil {
		return err
	}
	for _, q := range append([]int{pid}, proc.Descendants(pid)...) {
		p.work.Of(uint32(q))
		p.named(uint32(q), "")
	}
	p.mu.Lock()
	p.targets = append(p.targets, pid)
	p.mu.Unlock()
	return nil
}

// processes returns the traced roots and their live descendants: the
// tracer's own set (it follows forks and exits), or, under the null probe
// set whose programs report no fork, a walk of /proc (every process on the
// node, every 2 s: the tracer's set costs nothing).
func (p *pipeline) processes() []int {
	if p.cfg.Config.Probes != string(tracer.ProbesNull) {
		return p.tr.Processes()
	}
	p.mu.Lock()
	roots := slices.Clone(p.targets)
	p.mu.Unlock()
	var all []int
	for _, r := range roots {
		if !proc.Exists(r) {
			continue
		}
		all = append(all, r)
		all = append(all, proc.Descendants(r)...)
	}
	return all
}

// ProcessesAfter is the set processes() returns once the tracer has read
// every event recorded before after (a zero time: at once), waiting at most
// wait: attach follows a target's new descendants with it instead of
// walking /proc every look, and a fork is in the set once its event is read.
func (p *pipeline) ProcessesAfter(after time.Time, wait time.Duration) []int {
	deadline := time.Now().Add(wait)
	for !after.IsZero() && p.tr.Delivered() < after.UnixNano() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return p.processes()
}

// mapDevices tells the engine which GPU each traced process uses, as NVML
// reports the contexts processes hold.
func (p *pipeline) mapDevices() {
	if p.gpu == nil {
		return
	}
	pids := p.processes()
	p.gpu.SetTraced(pids)
	for _, pid := range pids {
		devs := p.gpu.DevicesForPID(pid)
		if len(devs) == 0 {
			continue
		}
		if d, ok := p.devices[uint32(pid)]; ok && d == devs[0] {
			continue
		}
		p.devices[uint32(pid)] = devs[0]
		p.in.SetDevice(uint32(pid), devs[0])
		p.hangs.setDevice(uint32(pid), devs[0])
		p.log.Debug("process uses GPU", "pid", pid, "device", devs[0])
	}
}

// named tells the session a traced process's name (comm; read from /proc
// when not given) while the process lives.
func (p *pipeline) named(pid uint32, comm string) {
	if p.cfg.Named == nil {
		return
	}
	if comm == "" {
		comm = proc.Comm(int(pid), int(pid))
	}
	p.cfg.Named(pid, comm)
}

// event feeds one host event to the engine. A new or exec'd process's
// workload is read while it lives: its last gaps are emitted after it exited.
func (p *pipeline) event(ev *event.Event) {
	switch {
	case ev.Kind == event.KindFork && !ev.IsThread:
		p.work.Of(ev.ChildPID)
		p.named(ev.ChildPID, ev.TaskComm) // the fork record holds the child's comm
	case ev.Kind == event.KindExec:
		p.work.Forget(ev.PID)
		p.work.Of(ev.PID)
		p.named(ev.PID, ev.TaskComm)
		delete(p.ranked, ev.PID)
	case ev.Kind == event.KindExit && ev.TID == ev.PID:
		delete(p.ranked, ev.PID)
		p.hangs.exit(ev)
	case ev.Kind == event.KindCommInit:
		p.hangs.commInit(ev)
	case ev.Kind == event.KindCollective:
		p.hangs.collective(ev)
		if p.ranked[ev.PID] {
			break
		}
		// A communicator the engine did not see created is linked to
		// the other ranks' by its collectives; the environment names the
		// rank and the job's size.
		p.ranked[ev.PID] = true
		if rank, size, ok := p.work.RankOf(ev.PID); ok {
			p.in.SetRank(ev.PID, rank, size)
		}
	}
	p.in.Event(*ev)
}

// batch feeds a batch of the tracer's events to the engine and hands the
// slice back for reuse.
func (p *pipeline) batch(evs []event.Event) {
	for i := range evs {
		p.event(&evs[i])
	}
	p.tr.Recycle(evs)
}

// delivered is the latest time, at most now, before which the engine has
// every traced event: the tracer's delivered bound, once the events it had
// sent into p.events (sent before it set that bound) are taken. 0 while the
// tracer has not yet caught up with its ring buffer.
func (p *pipeline) delivered(now int64) int64 {
	d := p.tr.Delivered()
	for range len(p.events) {
		p.batch(<-p.events)
	}
	at := engineClock(now, d)
	if at != min(now, d) && !p.lagged {
		p.lagged = true
		p.log.Warn("the ring buffer reader has not caught up for "+maxReaderLag.String()+
			"; the engine's clock trails the wall clock by that much, and later events count as late",
			"delivered_ns", d)
	}
	return at
}

// maxReaderLag bounds how far the engine's clock trails the wall clock for
// a reader that never finds the ring buffer empty (a probe firing faster
// than it is read, or an attach that lands in a burst): the engine then
// still emits steps and gaps, a window behind.
const maxReaderLag = 2 * time.Second

// engineClock is the engine's time at wall-clock now when the tracer has
// delivered every event that ended before delivered (0: not yet known).
func engineClock(now, delivered int64) int64 {
	return min(now, max(delivered, now-int64(maxReaderLag)))
}

func (p *pipeline) Run(ctx context.Context) error {
	trDone := make(chan error, 1)
	go func() { trDone <- p.tr.RunBatches(ctx, p.events) }()
	var gpuDone chan error
	var changes <-chan gpusample.Finding
	// GPU sampling outlives ctx by windowDrain, so that the windows
	// covering the last steps still reach the engine.
	gctx, gcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer gcancel()
	stopping, drained := ctx.Done(), (<-chan time.Time)(nil)
	if p.gpu != nil {
		gpuDone = make(chan error, 1)
		go func() { gpuDone <- p.gpu.Run(gctx, p.windows) }()
		changes = p.gpu.Changes()
	} else {
		gcancel()
	}
	var fromPeers <-chan peers.Batch
	if p.peers != nil {
		fromPeers = p.peers.Recv()
	}
	defer p.watchHangs(ctx)()
	advance := time.NewTicker(advanceEvery)
	defer advance.Stop()
	lastSnap, lastDev := time.Time{}, time.Time{}
	p.mapDevices()

	var runErr error
	for trDone != nil || gpuDone != nil {
		select {
		case evs := <-p.events:
			p.batch(evs)
		case w := <-p.windows:
			p.window(w)
		case <-stopping:
			stopping, drained = nil, time.After(windowDrain)
		case <-drained:
			drained = nil
			gcancel()
		case f, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			lvl := slog.LevelInfo
			if f.Level != gpusample.OK {
				lvl = slog.LevelWarn
			}
			p.log.Log(ctx, lvl, "GPU health changed: "+f.Detail, "device", f.Device, "check", f.Check, "fix", f.Fix)
		case tg := <-p.toggles:
			p.toggled(tg)
		case b, ok := <-fromPeers:
			if !ok {
				fromPeers = nil
				continue
			}
			p.peerBatch(b)
		case now := <-advance.C:
			at := now.UnixNano()
			if trDone != nil {
				// While the tracer runs, the engine's clock is what it
				// has delivered: on a busy host the reader lags the wall
				// clock, and events behind the watermark come too late
				// to move the queue model.
				at = p.delivered(at)
			}
			if at > 0 {
				p.in.Advance(at)
			}
			p.autoTick(now)
			if now.Sub(lastDev) >= deviceEvery {
				lastDev = now
				p.mapDevices()
			}
			if now.Sub(lastSnap) >= snapshotEvery {
				lastSnap = now
				st := p.tr.Stats()
				p.exp.DroppedEvents(st.RingDrops)
				p.exp.Events(st.EventsByKind)
				p.exp.Losses(p.eng.Losses())
				if p.cfg.Snapshot != nil {
					sum := p.eng.Snapshot()
					sum.DroppedEvents = st.RingDrops
					p.cfg.Snapshot(sum)
				}
			}
		case err := <-trDone:
			trDone = nil
			if err != nil {
				p.log.Error("tracer stopped", "err", err)
				runErr = errors.Join(runErr, err)
			}
		case err := <-gpuDone:
			gpuDone = nil
			if err != nil && ctx.Err() == nil {
				// The GPU view is an accuracy aid, not a requirement:
				// keep tracing with host evidence.
				p.log.Warn("GPU sampling stopped; continuing with host evidence only", "err", err)
			}
		}
	}
	// Both producers have returned: what they queued is all there is.
	for {
		select {
		case evs := <-p.events:
			p.batch(evs)
		case w := <-p.windows:
			p.window(w)
		default:
			return runErr
		}
	}
}

// peerBatch hands another sidecar's records, or its leaving, to the engine.
func (p *pipeline) peerBatch(b peers.Batch) {
	p.hangs.peer(b)
	if b.Left {
		p.in.PeerLeft(b.From)
		return
	}
	p.in.Peer(b.From, b.Recs)
}

// sidecarID names this sidecar to the job's others: the host (a pod's
// name), the rank where known, and the pid, which tells two sidecars of
// one host apart.
func sidecarID(rank int) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	if rank >= 0 {
		return fmt.Sprintf("%s/rank%d/%d", host, rank, os.Getpid())
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

func (p *pipeline) window(w event.GPUWindow) {
	p.in.Window(w)
	p.hangs.window(&w)
	if p.winOut != nil {
		p.winOut.write(w)
	}
}

func (p *pipeline) Stats() live.Stats {
	st := p.tr.Stats()
	p.mu.Lock()
	targets := slices.Clone(p.targets)
	p.mu.Unlock()
	s := live.Stats{Targets: targets, Attached: len(st.Attached), Missing: st.Missing,
		EventsRead: st.EventsRead, EventsByKind: st.EventsByKind, Drops: st.RingDrops}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.CPUNS = ru.Utime.Nano() + ru.Stime.Nano()
		s.RSSBytes = ru.Maxrss << 10 // KiB
	}
	if p.gpu != nil {
		s.GPUs = len(p.gpu.Devices())
	}
	es := p.exp.Stats()
	s.Export = live.ExportStats{Exported: es.SpansExported, Dropped: es.SpansDropped, Errors: es.ExportErrors, Failing: es.ExportFailing}
	if p.peers != nil {
		s.Peers = peersLine(p.cfg.Config.Peers, p.peers.Stats())
	}
	return s
}

// peersLine is the live view's line about the peer exchange.
func peersLine(addr string, st peers.Stats) string {
	others := func(n int) string {
		if n == 1 {
			return "1 other sidecar"
		}
		return fmt.Sprintf("%d other sidecars", n)
	}
	var s string
	switch st.Role {
	case "hub":
		s = "serving " + addr + ", " + others(st.Peers)
	case "member":
		s = fmt.Sprintf("joined %s, %s, clock offset %s", addr, others(st.Peers), time.Duration(st.OffsetNS).Round(time.Microsecond))
	default:
		s = "connecting to " + addr
	}
	if st.Dropped > 0 {
		s += fmt.Sprintf(", %d records dropped", st.Dropped)
	}
	if st.Rejected > 0 {
		s += fmt.Sprintf(", %d records rejected", st.Rejected)
	}
	return s
}

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

// inspectGPU is check's view of NVML.
func inspectGPU(_ context.Context, libPath string) cli.GPUReport {
	src, err := gpusample.Open(gpusample.Config{LibPath: libPath, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f := gpusample.Unavailable(err)
		return cli.GPUReport{Err: err, Fix: f.Fix}
	}
	defer src.Close()
	r := cli.GPUReport{Lib: libPath}
	for _, d := range src.Devices() {
		r.Devices = append(r.Devices, cli.GPUDevice{Index: d.Index, Name: d.Name, UUID: d.UUID})
	}
	for _, f := range src.Health() {
		lvl := cli.OK
		switch f.Level {
		case gpusample.WARN:
			lvl = cli.Warn
		case gpusample.FAIL:
			lvl = cli.Fail
		}
		name := "gpu " + f.Check
		if f.Device >= 0 {
			name = fmt.Sprintf("gpu%d %s", f.Device, f.Check)
		}
		r.Findings = append(r.Findings, cli.Finding{Level: lvl, Name: name, Detail: f.Detail, Fix: f.Fix})
	}
	return r
}

// closeRecording closes rec (already closed with the engine's inputs: this
// returns what it met) and then its file, and says once what went wrong,
// naming the file.
func closeRecording(rec *correlate.Recorder, f *safefile.Stream, path string, now int64) error {
	err := rec.Close(now)
	var we *safefile.WriteError
	if ferr := f.Close(); ferr != nil {
		err = ferr // what the recorder met writing, said once
	} else if err != nil && !errors.As(err, &we) {
		err = &safefile.WriteError{Path: path, Err: err}
	}
	return err
}
