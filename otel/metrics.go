package otel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/gaptrace/gaptrace/correlate"
)

// Metric names are chosen so that the Prometheus translation (prom.go: unit
// suffix, _total for counters) yields the documented names:
//
//	gaptrace_gpu_idle_seconds_total{cause}  idle (and stalled) GPU time by cause
//	gaptrace_steps_total                    steps (or windows) seen
//	gaptrace_step_duration_seconds          step time histogram
//	gaptrace_gap_duration_seconds{cause}    gap duration histogram
//	gaptrace_gpu_idle_ratio                 idle ratio of the last step
//	gaptrace_events_dropped_total           host events lost before correlation
//	gaptrace_spans_dropped_total            spans lost (queue full, export failed)
//	gaptrace_spans_exported_total
//	gaptrace_gaps_dropped_total             gaps lost (buffer full, step never came)
//	gaptrace_events_late_total              host events past the watermark (evidence only)
//	gaptrace_events_forced_total            host events processed early (reorder queue full)
//	gaptrace_intervals_dropped_total        thread intervals dropped past the timeline cap
//	gaptrace_steps_incomplete_total         steps emitted before their inputs were final
//	gaptrace_gaps_after_step_total          gaps delivered after their step (in no step)
var (
	stepBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	gapBuckets  = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
)

type metrics struct {
	mp      *sdkmetric.MeterProvider
	promSrv *http.Server
	promLn  net.Listener
	idle    metric.Float64Counter
	steps   metric.Int64Counter
	stepDur metric.Float64Histogram
	gapDur  metric.Float64Histogram
	gaps    metric.Int64Counter
	ratio   metric.Float64Gauge
	job     string
	rank    int
	uuid    func(int) string

	// What the counters hold so far, so that Summary can top them up to
	// the run's final totals without double counting.
	mu          sync.Mutex
	countedIdle map[correlate.Cause]int64
	countedStep int64
	// The labels of the series with the most steps: the remainder the
	// summary adds (a last partial step) is that process's.
	mainLabels []attribute.KeyValue
	mainSteps  int64
	stepsBy    map[seriesKey]int64

	droppedEvents atomic.Uint64
	// losses: the correlator's cumulative counts (correlate.Losses).
	lossMu sync.Mutex
	losses correlate.Losses
	// events: the records the tracer read, by kind (guarded by lossMu).
	events map[string]uint64

	setsMu sync.Mutex
	sets   map[labelKey]*labelSets
}

// labelKey is everything labels depend on.
type labelKey struct {
	device             int
	pid                uint32
	rank               int
	container, pod, ns string
}

// labelSets are one series' labels as the measurement options each step
// and gap records with, built once: a step records a handful of
// measurements, and building and hashing their attribute sets anew was a
// tenth of the exporter's time per step.
type labelSets struct {
	labels  []attribute.KeyValue
	all     metric.MeasurementOption
	byCause map[correlate.Cause]metric.MeasurementOption
}

func (ls *labelSets) cause(c correlate.Cause) metric.MeasurementOption {
	o, ok := ls.byCause[c]
	if !ok {
		o = withCause(ls.labels, c)
		ls.byCause[c] = o
	}
	return o
}

// maxLabelSets bounds the cache against pid churn (every key is a process
// that had steps or gaps on a GPU); past it the cache starts over.
const maxLabelSets = 4096

func (m *metrics) labelSets(device int, pid uint32, w *correlate.Workload) *labelSets {
	k := labelKey{device: device, pid: pid, rank: m.rank}
	if w != nil {
		if w.Rank != nil {
			k.rank = *w.Rank
		}
		k.container, k.pod, k.ns = w.ContainerID, w.PodName, w.PodNamespace
	}
	m.setsMu.Lock()
	defer m.setsMu.Unlock()
	if ls, ok := m.sets[k]; ok {
		return ls
	}
	if m.sets == nil || len(m.sets) >= maxLabelSets {
		m.sets = map[labelKey]*labelSets{}
	}
	labels := m.labels(device, pid, w)
	ls := &labelSets{labels: labels, all: metric.WithAttributeSet(attribute.NewSet(labels...)),
		byCause: map[correlate.Cause]metric.MeasurementOption{}}
	m.sets[k] = ls
	return ls
}

// seriesKey identifies a process on a device.
type seriesKey struct {
	device int
	pid    uint32
}

// labels says whose time a measurement is, so that one sidecar on an
// 8-GPU node (a DaemonSet) can be split per GPU, process, rank and pod:
// gpu, gpu_uuid, pid, rank, job, container_id, k8s_pod_name,
// k8s_namespace_name. Every metric attribute is built here and made valid
// UTF-8, as span attributes are: a container or pod name is the
// runtime's bytes, and one invalid string fails the whole OTLP export.
func (m *metrics) labels(device int, pid uint32, w *correlate.Workload) []attribute.KeyValue {
	return validAttributes(m.rawLabels(device, pid, w))
}

func (m *metrics) rawLabels(device int, pid uint32, w *correlate.Workload) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, 8)
	if device >= 0 {
		a = append(a, attribute.String("gpu", strconv.Itoa(device)))
		if m.uuid != nil {
			if u := m.uuid(device); u != "" {
				a = append(a, attribute.String("gpu_uuid", u))
			}
		}
	}
	if pid != 0 {
		a = append(a, attribute.String("pid", strconv.FormatUint(uint64(pid), 10)))
	}
	rank := m.rank
	if w != nil && w.Rank != nil {
		rank = *w.Rank
	}
	if rank >= 0 {
		a = append(a, attribute.String("rank", strconv.Itoa(rank)))
	}
	if m.job != "" {
		a = append(a, attribute.String("job", m.job))
	}
	if w != nil {
		for _, kv := range []struct{ k, v string }{
			{"container_id", w.ContainerID}, {"k8s_pod_name", w.PodName}, {"k8s_namespace_name", w.PodNamespace},
		} {
			if kv.v != "" {
				a = append(a, attribute.String(kv.k, kv.v))
			}
		}
	}
	return a
}

func withCause(labels []attribute.KeyValue, c correlate.Cause) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(slices.Clone(labels), attribute.String("cause", string(c)))...))
}

func newMetrics(ctx context.Context, r *resolved, res *resource.Resource, stats func() Stats) (*metrics, error) {
	m := &metrics{countedIdle: map[correlate.Cause]int64{},
		job: r.JobID, rank: r.Rank, uuid: r.DeviceUUID, stepsBy: map[seriesKey]int64{}}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	if r.mode == "otlp" && r.otlpMetrics {
		exp, err := newOTLPMetricExporter(ctx, r)
		if err != nil {
			return nil, err
		}
		var ropts []sdkmetric.PeriodicReaderOption
		if r.MetricsInterval > 0 {
			ropts = append(ropts, sdkmetric.WithInterval(r.MetricsInterval))
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, ropts...)))
	}
	var ln net.Listener
	if r.PrometheusAddr != "" {
		var err error
		if ln, err = net.Listen("tcp", r.PrometheusAddr); err != nil {
			// Metrics are an aid: a taken port must never keep the job
			// from running or from being traced.
			r.Logger.Warn("prometheus endpoint not served; tracing continues without it",
				"addr", r.PrometheusAddr, "err", err)
		}
	}
	if ln != nil {
		reader := sdkmetric.NewManualReader()
		opts = append(opts, sdkmetric.WithReader(reader))
		m.promLn = ln
		var capped net.Listener
		m.promSrv, capped = newPromServer(ln, reader)
		go func() {
			if err := m.promSrv.Serve(capped); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.Logger.Error("prometheus endpoint stopped", "addr", ln.Addr().String(), "err", err)
			}
		}()
		r.Logger.Info("prometheus metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	}
	m.mp = sdkmetric.NewMeterProvider(opts...)
	if err := m.instruments(m.mp.Meter(instrumentationName), stats); err != nil {
		return nil, err
	}
	return m, nil
}

// instruments creates the metric instruments and registers the callback
// that observes the counters kept elsewhere (stats, losses, own cost).
func (m *metrics) instruments(meter metric.Meter, stats func() Stats) error {
	var err error
	var errs []error
	m.idle, err = meter.Float64Counter("gaptrace.gpu.idle", metric.WithUnit("s"),
		metric.WithDescription("GPU idle or stalled time by cause"))
	errs = append(errs, err)
	m.steps, err = meter.Int64Counter("gaptrace.steps", metric.WithUnit("{step}"),
		metric.WithDescription("Training steps (or fixed windows) seen"))
	errs = append(errs, err)
	m.stepDur, err = meter.Float64Histogram("gaptrace.step.duration", metric.WithUnit("s"),
		metric.WithDescription("Training step time"), metric.WithExplicitBucketBoundaries(stepBuckets...))
	errs = append(errs, err)
	m.gapDur, err = meter.Float64Histogram("gaptrace.gap.duration", metric.WithUnit("s"),
		metric.WithDescription("GPU idle gap duration by cause"), metric.WithExplicitBucketBoundaries(gapBuckets...))
	errs = append(errs, err)
	m.gaps, err = meter.Int64Counter("gaptrace.gaps", metric.WithUnit("{gap}"),
		metric.WithDescription("GPU idle gaps reported, by cause"))
	errs = append(errs, err)
	sidecarCPU, err := meter.Float64ObservableCounter("gaptrace.sidecar.cpu", metric.WithUnit("s"),
		metric.WithDescription("CPU time gaptrace itself used (user + system)"))
	errs = append(errs, err)
	sidecarEvents, err := meter.Int64ObservableCounter("gaptrace.sidecar.events", metric.WithUnit("{event}"),
		metric.WithDescription("Records gaptrace read from the kernel, by kind (its rate is the events a second it handles)"))
	errs = append(errs, err)
	sidecarRSS, err := meter.Int64ObservableGauge("gaptrace.sidecar.memory.rss", metric.WithUnit("By"),
		metric.WithDescription("gaptrace's resident memory"))
	errs = append(errs, err)
	m.ratio, err = meter.Float64Gauge("gaptrace.gpu.idle_ratio", metric.WithUnit("1"),
		metric.WithDescription("GPU idle ratio of the last step"))
	errs = append(errs, err)
	droppedEvents, err := meter.Int64ObservableCounter("gaptrace.events.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("Host events lost before correlation (ring buffer full)"))
	errs = append(errs, err)
	spansDropped, err := meter.Int64ObservableCounter("gaptrace.spans.dropped", metric.WithUnit("{span}"),
		metric.WithDescription("Spans lost: export queue full or export failed"))
	errs = append(errs, err)
	spansExported, err := meter.Int64ObservableCounter("gaptrace.spans.exported", metric.WithUnit("{span}"),
		metric.WithDescription("Spans exported"))
	errs = append(errs, err)
	gapsDropped, err := meter.Int64ObservableCounter("gaptrace.gaps.dropped", metric.WithUnit("{gap}"),
		metric.WithDescription("Gaps not turned into spans: they came after shutdown"))
	errs = append(errs, err)
	type lossCounter struct {
		inst metric.Int64ObservableCounter
		n    func(*correlate.Losses) uint64
	}
	var losses []lossCounter
	observed := []metric.Observable{}
	for _, l := range []struct {
		name, unit, desc string
		n                func(*correlate.Losses) uint64
	}{
		{"gaptrace.events.late", "{event}", "Host events that reached the correlator after its watermark: evidence only, their gaps were decided",
			func(l *correlate.Losses) uint64 { return l.LateEvents }},
		{"gaptrace.events.forced", "{event}", "Host events processed before the watermark reached them: the reorder queue was full",
			func(l *correlate.Losses) uint64 { return l.ForcedEvents }},
		{"gaptrace.intervals.dropped", "{interval}", "Thread activity intervals dropped past the per-thread timeline cap",
			func(l *correlate.Losses) uint64 { return l.DroppedIntervals }},
		{"gaptrace.steps.incomplete", "{step}", "Steps emitted before every input was final (too many steps waiting)",
			func(l *correlate.Losses) uint64 { return l.IncompleteSteps }},
		{"gaptrace.gaps.after_step", "{gap}", "Gaps delivered after their step was emitted: in the idle totals, in no step",
			func(l *correlate.Losses) uint64 { return l.GapsAfterStep }},
	} {
		inst, err := meter.Int64ObservableCounter(l.name, metric.WithUnit(l.unit), metric.WithDescription(l.desc))
		errs = append(errs, err)
		losses = append(losses, lossCounter{inst, l.n})
		observed = append(observed, inst)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("create instruments: %w", err)
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := stats()
		o.ObserveInt64(droppedEvents, int64(m.droppedEvents.Load()))
		o.ObserveInt64(spansDropped, int64(st.SpansDropped))
		o.ObserveInt64(spansExported, int64(st.SpansExported))
		o.ObserveInt64(gapsDropped, int64(st.GapsDropped))
		m.lossMu.Lock()
		l := m.losses
		for k, n := range m.events {
			o.ObserveInt64(sidecarEvents, int64(n), metric.WithAttributes(attribute.String("kind", k)))
		}
		m.lossMu.Unlock()
		for _, c := range losses {
			o.ObserveInt64(c.inst, int64(c.n(&l)))
		}
		if cpu, rss, ok := selfCost(); ok {
			o.ObserveFloat64(sidecarCPU, cpu)
			o.ObserveInt64(sidecarRSS, rss)
		}
		return nil
	}, append(observed, droppedEvents, spansDropped, spansExported, gapsDropped, sidecarCPU, sidecarRSS, sidecarEvents)...)
	if err != nil {
		return fmt.Errorf("register metric callback: %w", err)
	}
	return nil
}

func newOTLPMetricExporter(ctx context.Context, r *resolved) (sdkmetric.Exporter, error) {
	switch r.protocol {
	case ProtocolGRPC:
		var o []otlpmetricgrpc.Option
		if r.endpointURL != nil {
			o = append(o, otlpmetricgrpc.WithEndpoint(r.endpointURL.Host))
		}
		if r.insecure != nil && *r.insecure {
			o = append(o, otlpmetricgrpc.WithInsecure())
		}
		if r.tlsConfig != nil {
			o = append(o, otlpmetricgrpc.WithTLSCredentials(credentialsFromTLS(r.tlsConfig)))
		}
		if len(r.headers) > 0 {
			o = append(o, otlpmetricgrpc.WithHeaders(r.headers))
		}
		o = append(o, otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig(retryConfig)))
		exp, err := otlpmetricgrpc.New(ctx, o...)
		if err != nil {
			return nil, fmt.Errorf("create otlp grpc metric exporter: %w", err)
		}
		return exp, nil
	default:
		var o []otlpmetrichttp.Option
		if r.endpointURL != nil {
			o = append(o, otlpmetrichttp.WithEndpoint(r.endpointURL.Host),
				otlpmetrichttp.WithURLPath(signalURLPath(r.endpointURL.Path, "metrics")))
		}
		if r.insecure != nil && *r.insecure {
			o = append(o, otlpmetrichttp.WithInsecure())
		}
		if r.tlsConfig != nil {
			o = append(o, otlpmetrichttp.WithTLSClientConfig(r.tlsConfig))
		}
		if len(r.headers) > 0 {
			o = append(o, otlpmetrichttp.WithHeaders(r.headers))
		}
		o = append(o, otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig(retryConfig)))
		exp, err := otlpmetrichttp.New(ctx, o...)
		if err != nil {
			return nil, fmt.Errorf("create otlp http metric exporter: %w", err)
		}
		return exp, nil
	}
}

func (m *metrics) gap(ctx context.Context, g correlate.Gap) {
	set := m.labelSets(g.Device, g.PID, g.Workload).cause(g.Cause)
	m.gapDur.Record(ctx, float64(gapDuration(&g))/1e9, set)
	m.gaps.Add(ctx, 1, set)
}

// selfCost is gaptrace's own CPU time (seconds) and resident memory
// (bytes), read at each collection.
func selfCost() (cpu float64, rss int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	cpu = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return cpu, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return cpu, 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return cpu, 0, false
	}
	return cpu, pages * int64(os.Getpagesize()), true
}

func (m *metrics) step(ctx context.Context, s correlate.Step) {
	ls := m.labelSets(s.Device, s.PID, s.Workload)
	labels, set := ls.labels, ls.all
	m.steps.Add(ctx, 1, set)
	m.stepDur.Record(ctx, float64(s.End-s.Start)/1e9, set)
	m.ratio.Record(ctx, s.IdleRatio, set)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countedStep++
	k := seriesKey{s.Device, s.PID}
	m.stepsBy[k]++
	if m.stepsBy[k] > m.mainSteps || m.mainLabels == nil {
		m.mainSteps, m.mainLabels = m.stepsBy[k], labels
	}
	for c, ns := range s.ByCause {
		if ns > 0 {
			m.idle.Add(ctx, float64(ns)/1e9, ls.cause(c))
			m.countedIdle[c] += ns
		}
	}
}

// summary tops the counters up to the run's final totals: time the
// correlator attributed outside any emitted step (a last partial step, gaps
// whose step never closed) is counted once, here, as the main process's
// (the one with the most steps; no process labels when none had a step).
func (m *metrics) summary(ctx context.Context, s correlate.Summary, dropped uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	labels := m.mainLabels
	if labels == nil {
		labels = m.labels(-1, 0, nil)
	}
	for c, ns := range s.ByCause {
		if d := ns - m.countedIdle[c]; d > 0 {
			m.idle.Add(ctx, float64(d)/1e9, withCause(labels, c))
			m.countedIdle[c] += d
		}
	}
	if d := s.Steps - m.countedStep; d > 0 {
		m.steps.Add(ctx, d, metric.WithAttributeSet(attribute.NewSet(labels...)))
		m.countedStep += d
	}
	m.setDropped(dropped)
	m.setLosses(s.Losses)
}

// setLosses records the correlator's cumulative losses; no count goes
// backwards (a snapshot taken before a later one cannot lower it).
func (m *metrics) setLosses(l correlate.Losses) {
	m.lossMu.Lock()
	defer m.lossMu.Unlock()
	c := &m.losses
	c.LateEvents = max(c.LateEvents, l.LateEvents)
	c.ForcedEvents = max(c.ForcedEvents, l.ForcedEvents)
	c.DroppedIntervals = max(c.DroppedIntervals, l.DroppedIntervals)
	c.IncompleteSteps = max(c.IncompleteSteps, l.IncompleteSteps)
	c.GapsAfterStep = max(c.GapsAfterStep, l.GapsAfterStep)
}

// setEvents records the tracer's cumulative records read by kind; a
// count never goes backwards.
func (m *metrics) setEvents(byKind map[string]uint64) {
	m.lossMu.Lock()
	defer m.lossMu.Unlock()
	if m.events == nil {
		m.events = make(map[string]uint64, len(byKind))
	}
	for k, n := range byKind {
		m.events[k] = max(m.events[k], n)
	}
}

// setDropped records a cumulative drop total; totals never go backwards.
func (m *metrics) setDropped(total uint64) {
	for {
		cur := m.droppedEvents.Load()
		if total <= cur || m.droppedEvents.CompareAndSwap(cur, total) {
			return
		}
	}
}

func (m *metrics) shutdown(ctx context.Context) error {
	var errs []error
	if m.promSrv != nil {
		// Keep serving until the final collection below was possible; a
		// scraper racing the exit gets the last values or a closed socket.
		if err := m.promSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop prometheus endpoint: %w", err))
		}
	}
	if err := m.mp.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("shut down meter provider: %w", err))
	}
	return errors.Join(errs...)
}

// promAddrActual is the bound Prometheus address (useful with port 0).
func (m *metrics) promAddrActual() string {
	if m.promLn == nil {
		return ""
	}
	return m.promLn.Addr().String()
}
