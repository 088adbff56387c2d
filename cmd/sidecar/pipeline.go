package main

import (
	"cmp"
	"context"
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
	"github.com/gaptrace/gaptrace/correlate/record"
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
	p.openGPU(cfg.NVMLLib, pc.Logger)
	autoOn, err := p.openTracer(pc)
	if err != nil {
		p.closeGPU()
		return nil, err
	}
	tr := p.tr

	exp, err := otel.New(ctx, p.exporterConfig(pc))
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
	ccfg := correlate.Config{Probes: probes, MinGap: cfg.MinGap, StepAt: cfg.StepAt, NoGPUWindows: p.gpu == nil, Logger: pc.Logger}
	if p.gpu != nil {
		ccfg.HW = p.gpu.HWContext
		for _, d := range p.gpu.Devices() {
			if d.GPMSupported {
				ccfg.GPMDevices = append(ccfg.GPMDevices, d.Index)
			}
		}
	}
	rec, err := p.openRecording(cfg.Record, record.Header{Version: version, Probes: probes, MinGap: int64(cfg.MinGap),
		NoGPUWindows: p.gpu == nil, GPMDevices: ccfg.GPMDevices})
	if err != nil {
		_ = p.tr.Close() // reporting the recording's error
		p.closeGPU()
		return nil, err
	}
	// The exporter first, then the session (live view, gaps file).
	sinks := correlate.Tee{exp, pc.Sink}
	if p.auto != nil {
		sinks = append(sinks, autoSink{p.auto})
	}
	p.eng = correlate.New(ccfg, withWorkload{sinks, p.work})
	p.in = p.eng
	if rec != nil {
		p.in = record.Wrap(p.eng, rec)
	}
	p.hangs = newHangWatch(cfg.HangAfter, tr, exp, pc.Hang, p.work, pc.Logger)
	if err := p.startPeers(ctx, job, pc.Logger); err != nil {
		_ = p.tr.Close() // reporting the exchange's error
		p.closeGPU()
		return nil, err
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

// openGPU opens NVML for GPU sampling; without it gaptrace traces the
// host alone and says why.
func (p *pipeline) openGPU(lib string, logger *slog.Logger) {
	src, err := gpusample.Open(gpusample.Config{LibPath: lib, Logger: logger})
	if err != nil {
		f := gpusample.Unavailable(err)
		p.log.Warn(f.Detail, "fix", f.Fix)
		return
	}
	p.gpu = src
	for _, d := range src.Devices() {
		p.log.Info("GPU", "index", d.Index, "name", d.Name, "uuid", d.UUID, "gpm", d.GPMSupported)
	}
	for _, f := range src.Health() {
		if f.Level != gpusample.OK {
			p.log.Warn("GPU health: "+f.Detail, "device", f.Device, "check", f.Check, "fix", f.Fix)
		}
	}
}

// openTracer loads the probes and, for the auto probe set, attaches the
// per-launch ones from the start; it returns when they went live.
func (p *pipeline) openTracer(pc cli.PipelineConfig) (tracer.LaunchToggle, error) {
	cfg := pc.Config
	tr, err := tracer.New(tracer.Config{
		Probes:           tracer.ProbeSet(cfg.Probes),
		SyscallThreshold: cfg.SyscallThreshold,
		LibCUDA:          cfg.CUDALib,
		LibNCCL:          cfg.NCCLLib,
		RingPoll:         cfg.RingPoll,
		CPUSampleHz:      cmp.Or(cfg.CPUSampleHz, -1), // 0: off
		Logger:           pc.Logger,
	})
	if err != nil {
		return tracer.LaunchToggle{}, fmt.Errorf("load probes: %w", err)
	}
	var autoOn tracer.LaunchToggle
	if cfg.Probes == string(tracer.ProbesAuto) {
		// Full from the start: the probes of the libraries Trace finds
		// attach with the per-launch ones.
		if autoOn, err = tr.SetLaunchProbes(true); err != nil {
			_ = tr.Close() // reporting the toggle error
			return tracer.LaunchToggle{}, fmt.Errorf("auto probes: %w", err)
		}
		p.auto = newAutoSchedule(cfg.AutoWindow, cfg.AutoEvery, time.Now(), p.log)
		p.toggles = make(chan autoToggle, 1)
	}
	p.tr = tr
	return autoOn, nil
}

// exporterConfig is the exporter's configuration: the options, the
// traced target and the GPUs NVML found.
func (p *pipeline) exporterConfig(pc cli.PipelineConfig) otel.Config {
	cfg := pc.Config
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
	return ocfg
}

// openRecording starts the --record file (path "": none, a nil recorder)
// and sets what Close does with it.
func (p *pipeline) openRecording(path string, h record.Header) (*record.Writer, error) {
	p.endRecording = func(int64) error { return nil }
	if path == "" {
		return nil, nil
	}
	f, err := safefile.CreateStream(path)
	if err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	f.OnError = func(err error) {
		p.log.Error("recording write failed; nothing more is recorded (the file keeps what was written before)", "err", err)
	}
	rec := record.NewWriter(f, h)
	p.endRecording = func(now int64) error { return closeRecording(rec, f, path, now) }
	return rec, nil
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
