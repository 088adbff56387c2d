package otel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials"

	"github.com/gaptrace/gaptrace/correlate"
)

const instrumentationName = "github.com/gaptrace/gaptrace/otel"

// Stats are the exporter's counters since New.
type Stats struct {
	SpansExported uint64
	// SpansDropped: queue full, export failed after retries, or left
	// queued when Shutdown's deadline passed.
	SpansDropped uint64
	ExportErrors uint64 // failed export calls (each drops one batch)
	// ExportFailing: the last export failed (spans wait for a retry).
	ExportFailing bool
	QueueLen      int
	// GapsDropped: gaps that never became spans because they came after
	// Shutdown.
	GapsDropped uint64
}

// Exporter maps correlate results to spans and metrics. It implements
// correlate.Sink: a step's trace is emitted with the gaps its StepResult
// carries, so the exporter holds no gap waiting for its step. Gap and Step
// must be called from one goroutine; Stats, Summary and Shutdown are safe
// from any.
type Exporter struct {
	cfg     *resolved
	log     *slog.Logger
	tp      *sdktrace.TracerProvider
	tracer  trace.Tracer
	direct  *directOut // steps, gaps and their operations (direct.go)
	batcher *batcher
	copy    *batcher // spans file beside OTLP; nil when there is none
	metrics *metrics
	res     *resource.Resource

	mu sync.Mutex
	// emitted holds the span each recent step's gaps hang under, for a
	// gap that arrives after its step was emitted; emittedOrder bounds it.
	emitted      map[stepKey]trace.SpanContext
	emittedOrder []stepKey
	gapDropped   atomic.Uint64
	closed       atomic.Bool

	rootMu    sync.Mutex
	roots     map[int64]struct{} // steps whose root this process emitted (job mode)
	rootOrder []int64

	hangs hangMetrics // hang.go
}

// stepKey names a step of a process. Not its device: one engine gives a
// process one device at a time, and learns it late (NVML lists a process
// on its GPU after it created its context): gaps decided before that carry
// the device the engine assumed, their step the one it knew by then.
type stepKey struct {
	pid  uint32
	step int64
}

// emittedMax bounds the steps remembered for gaps that arrive late.
const emittedMax = 4096

// New builds the exporter. It fails on an invalid configuration or when an
// output cannot be opened; it never waits for a collector to be reachable.
func New(ctx context.Context, cfg Config) (*Exporter, error) {
	r, err := resolve(cfg)
	if err != nil {
		return nil, fmt.Errorf("otel config: %w", err)
	}
	res, err := buildResource(ctx, r)
	if err != nil {
		return nil, err
	}
	x := &Exporter{cfg: r, log: r.Logger, res: res, emitted: map[stepKey]trace.SpanContext{}}

	// The primary output is OTLP when configured, else the spans file. A
	// spans file next to OTLP is a local copy with its own queue, so a
	// slow collector never costs the copy and the reverse.
	var exp sdktrace.SpanExporter
	switch {
	case r.mode == "otlp" && r.otlpTraces:
		exp, err = newOTLPTraceExporter(ctx, r)
		if err != nil {
			return nil, err
		}
	case r.SpansFile != "":
		exp, err = newFileExporter(r.SpansFile, serviceName(res), r.SpansMaxSize, r.SpansKeep)
		if err != nil {
			return nil, err
		}
	default:
		exp = discardExporter{}
	}
	exp = utf8Exporter{exp}
	x.batcher = newBatcher(exp, r.QueueSize, r.BatchSize, r.BatchTimeout, r.Logger)
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(x.batcher),
		sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithSampler(sampler(r.sampleRatio)),
	}
	if r.mode == "otlp" && r.otlpTraces && r.SpansFile != "" {
		fe, err := newFileExporter(r.SpansFile, serviceName(res), r.SpansMaxSize, r.SpansKeep)
		if err != nil {
			_ = x.batcher.Shutdown(ctx)
			return nil, err
		}
		x.copy = newBatcher(utf8Exporter{fe}, r.QueueSize, r.BatchSize, r.BatchTimeout, r.Logger)
		opts = append(opts, sdktrace.WithSpanProcessor(x.copy))
	}
	x.tp = sdktrace.NewTracerProvider(opts...)
	x.tracer = x.tp.Tracer(instrumentationName)
	x.direct = newDirectOut(sampler(r.sampleRatio), res, x.processors()...)

	x.metrics, err = newMetrics(ctx, r, res, x.Stats)
	if err != nil {
		_ = x.tp.Shutdown(ctx)
		return nil, err
	}
	attrs := []any{"mode", r.mode, "service", serviceName(res), "queue", r.QueueSize}
	if r.mode == "otlp" {
		ep := "from environment"
		if r.endpointURL != nil {
			ep = r.endpointURL.Host
			if r.endpointURL.Scheme != "" {
				ep = RedactURL(r.endpointURL.String())
			}
		}
		attrs = append(attrs, "protocol", r.protocol, "endpoint", ep, "otlp_metrics", r.otlpMetrics, "otlp_traces", r.otlpTraces)
		if r.SpansFile != "" {
			attrs = append(attrs, "spans_file", r.SpansFile)
		}
	} else {
		attrs = append(attrs, "spans_file", r.SpansFile)
	}
	if r.JobID != "" {
		attrs = append(attrs, "job_id", r.JobID, "rank", r.Rank)
	}
	r.Logger.Info("span export configured", attrs...)
	return x, nil
}

func serviceName(res *resource.Resource) string {
	if v, ok := res.Set().Value(semconv.ServiceNameKey); ok {
		return v.AsString()
	}
	return DefaultServiceName
}

// PrometheusAddr is the address the Prometheus endpoint listens on ("" when
// off); with port 0 in the config it tells the chosen port.
func (x *Exporter) PrometheusAddr() string { return x.metrics.promAddrActual() }

// JobID is the job ID in use ("" → random trace IDs).
func (x *Exporter) JobID() string { return x.cfg.JobID }

func buildResource(ctx context.Context, r *resolved) (*resource.Resource, error) {
	host := r.Resource.Host
	if host == "" {
		host, _ = os.Hostname()
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(DefaultServiceName)}
	if host != "" {
		attrs = append(attrs, semconv.HostName(host))
	}
	if r.Resource.TargetPID > 0 {
		attrs = append(attrs, semconv.ProcessPID(r.Resource.TargetPID))
	}
	if len(r.Resource.TargetCmdline) > 0 {
		attrs = append(attrs, semconv.ProcessCommandLine(strings.Join(r.Resource.TargetCmdline, " ")),
			semconv.ProcessExecutableName(baseName(r.Resource.TargetCmdline[0])))
	}
	if r.Resource.GPUName != "" {
		attrs = append(attrs, attribute.String("gpu.name", r.Resource.GPUName))
	}
	if r.Resource.GPUUUID != "" {
		attrs = append(attrs, attribute.String("gpu.uuid", r.Resource.GPUUUID))
	}
	for _, k := range k8sEnv {
		if v := envFirst(k.vars...); v != "" {
			attrs = append(attrs, attribute.String(k.key, v))
		}
	}
	if r.JobID != "" {
		attrs = append(attrs, attribute.String("gaptrace.job.id", r.JobID))
	}
	if r.Rank >= 0 {
		attrs = append(attrs, attribute.Int("gaptrace.rank", r.Rank))
	}
	// Later sources win: detected attributes, then OTEL_RESOURCE_ATTRIBUTES
	// and OTEL_SERVICE_NAME, then an explicit service name.
	opts := []resource.Option{
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attrs...),
		resource.WithFromEnv(),
	}
	// "gaptrace" is what a CLI flag default looks like: it must not beat
	// OTEL_SERVICE_NAME.
	if r.ServiceName != "" && r.ServiceName != DefaultServiceName {
		opts = append(opts, resource.WithAttributes(semconv.ServiceName(r.ServiceName)))
	}
	res, err := resource.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("build otel resource: %w", err)
	}
	return validResource(res), nil
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

func credentialsFromTLS(tc *tls.Config) credentials.TransportCredentials {
	return credentials.NewTLS(tc)
}

func sampler(ratio float64) sdktrace.Sampler {
	switch {
	case ratio >= 1:
		return sdktrace.AlwaysSample()
	case ratio <= 0:
		return sdktrace.NeverSample()
	default:
		// Not parent-based: rank spans have a remote parent flagged
		// sampled, yet must follow the same trace-ID decision as the root.
		return sdktrace.TraceIDRatioBased(ratio)
	}
}

// retryConfig: exponential backoff from 500 ms, capped at 5 s between
// attempts. The exporters' default starts at 5 s, which against a 10 s export
// timeout leaves a single retry; a collector restart usually takes less.
// Every export, retries included, still ends at the export timeout.
var retryConfig = struct {
	Enabled         bool
	InitialInterval time.Duration
	MaxInterval     time.Duration
	MaxElapsedTime  time.Duration
}{true, 500 * time.Millisecond, 5 * time.Second, 30 * time.Second}

func newOTLPTraceExporter(ctx context.Context, r *resolved) (sdktrace.SpanExporter, error) {
	// The batcher retries failed batches itself, with backoff and a
	// bounded stash (batcher.retry), so the exporter's own retries are
	// off: they kept each call retrying until the export timeout
	// (OTEL_EXPORTER_OTLP_TIMEOUT, default 10 s), and a dead collector
	// went unsaid for that long. Now a refused connection fails the first
	// export at once and is said at once; a silent one still ends at the
	// timeout, so a dead collector costs queue space, never a blocked
	// tracer.
	switch r.protocol {
	case ProtocolGRPC:
		var o []otlptracegrpc.Option
		if r.endpointURL != nil {
			o = append(o, otlptracegrpc.WithEndpoint(r.endpointURL.Host))
		}
		if r.insecure != nil && *r.insecure {
			o = append(o, otlptracegrpc.WithInsecure())
		}
		if r.tlsConfig != nil {
			o = append(o, otlptracegrpc.WithTLSCredentials(credentialsFromTLS(r.tlsConfig)))
		}
		if len(r.headers) > 0 {
			o = append(o, otlptracegrpc.WithHeaders(r.headers))
		}
		o = append(o, otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
		exp, err := otlptracegrpc.New(ctx, o...)
		if err != nil {
			return nil, fmt.Errorf("create otlp grpc span exporter: %w", err)
		}
		return exp, nil
	default:
		var o []otlptracehttp.Option
		if r.endpointURL != nil {
			o = append(o, otlptracehttp.WithEndpoint(r.endpointURL.Host),
				otlptracehttp.WithURLPath(signalURLPath(r.endpointURL.Path, "traces")))
		}
		if r.insecure != nil && *r.insecure {
			o = append(o, otlptracehttp.WithInsecure())
		}
		if r.tlsConfig != nil {
			o = append(o, otlptracehttp.WithTLSClientConfig(r.tlsConfig))
		}
		if len(r.headers) > 0 {
			o = append(o, otlptracehttp.WithHeaders(r.headers))
		}
		o = append(o, otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
		exp, err := otlptracehttp.New(ctx, o...)
		if err != nil {
			return nil, fmt.Errorf("create otlp http span exporter: %w", err)
		}
		return exp, nil
	}
}

// Gap updates the gap metrics. A gap a StepResult will carry becomes a
// span with its step (Step). A late one, which no step carries, becomes a
// span at once: under its step's span when that step was emitted (the
// correlator decided it after the step, as a wait on another rank can
// be), else an orphan.
func (x *Exporter) Gap(g correlate.Gap) {
	if x.closed.Load() {
		if g.Late {
			x.gapDropped.Add(1)
		}
		return
	}
	x.metrics.gap(context.Background(), g)
	if !g.Late {
		return
	}
	x.mu.Lock()
	sc, ok := x.emitted[stepKey{g.PID, g.Step}]
	x.mu.Unlock()
	if ok {
		x.emitGap(sc.WithRemote(true), nil, &g)
		return
	}
	x.emitOrphans([]correlate.Gap{g})
}

// Step emits the step's trace with the gaps it carries and remembers its
// span for the late gaps of that step.
func (x *Exporter) Step(s correlate.StepResult) {
	if x.closed.Load() {
		x.gapDropped.Add(uint64(len(s.GapList)))
		return
	}
	ctx := context.Background()
	x.metrics.step(ctx, s.Step)
	sc := x.emitStep(s.Step, s.GapList)
	k := stepKey{s.PID, s.Number}
	x.mu.Lock()
	if _, ok := x.emitted[k]; !ok {
		x.emittedOrder = append(x.emittedOrder, k)
		if len(x.emittedOrder) > emittedMax {
			delete(x.emitted, x.emittedOrder[0])
			x.emittedOrder = x.emittedOrder[1:]
		}
	}
	x.emitted[k] = sc
	x.mu.Unlock()
}

// emitOrphans emits gaps whose step was not emitted here, in time order:
// with a job ID under the root its step's trace would have (another rank's
// sidecar may emit it), else each as the root of a trace of its own.
func (x *Exporter) emitOrphans(gaps []correlate.Gap) {
	sort.SliceStable(gaps, func(i, j int) bool { return gaps[i].Start < gaps[j].Start })
	for i := range gaps {
		var parent trace.SpanContext
		if job := x.cfg.JobID; job != "" {
			parent = trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: StepTraceID(job, gaps[i].Step), SpanID: StepRootSpanID(job, gaps[i].Step),
				TraceFlags: trace.FlagsSampled, Remote: true})
		}
		x.emitGap(parent, nil, &gaps[i])
	}
}

// Summary updates the metrics with the run's final totals; dropped is the
// tracer's cumulative count of lost host events.
func (x *Exporter) Summary(s correlate.Summary, dropped uint64) {
	x.metrics.summary(context.Background(), s, dropped)
}

// DroppedEvents updates the cumulative count of host events the tracer
// lost, for the live metric; Summary sets the final value.
func (x *Exporter) DroppedEvents(total uint64) { x.metrics.setDropped(total) }

// Events updates the cumulative count of records the tracer read, by kind
// (tracer.RecordKind's names), for gaptrace.sidecar.events.
func (x *Exporter) Events(byKind map[string]uint64) { x.metrics.setEvents(byKind) }

// Losses updates the correlator's cumulative losses (late and forced
// events, dropped intervals, incomplete steps, gaps after their step), for
// the live metrics; Summary sets the final values.
func (x *Exporter) Losses(l correlate.Losses) { x.metrics.setLosses(l) }

// Stats returns the counters; cheap, safe from any goroutine. Exported
// counts the primary output (OTLP, else the file); drops and errors of a
// spans-file copy beside OTLP are included in SpansDropped and ExportErrors.
func (x *Exporter) Stats() Stats {
	st := Stats{
		SpansExported: x.batcher.exported.Load(),
		SpansDropped:  x.batcher.dropped.Load(),
		ExportErrors:  x.batcher.errors.Load(),
		ExportFailing: x.batcher.failing.Load(),
		QueueLen:      x.batcher.queueLen(),
		GapsDropped:   x.gapDropped.Load(),
	}
	if c := x.copy; c != nil {
		st.SpansDropped += c.dropped.Load()
		st.ExportErrors += c.errors.Load()
		st.QueueLen = max(st.QueueLen, c.queueLen())
	}
	return st
}

// Shutdown flushes spans and metrics within ctx's deadline. Later Gap and
// Step calls are ignored (their gaps counted in GapsDropped).
func (x *Exporter) Shutdown(ctx context.Context) error {
	if !x.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Spans and metrics flush side by side: each gets all of ctx's time,
	// so a collector that swallows the spans' time still gets the final
	// metrics (and the reverse).
	var errs []error
	merr := make(chan error, 1)
	go func() { merr <- x.metrics.shutdown(ctx) }()
	if err := x.tp.Shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := <-merr; err != nil {
		errs = append(errs, err)
	}
	st := x.Stats()
	if st.SpansDropped > 0 || st.GapsDropped > 0 {
		x.log.Warn("spans were lost", "spans_exported", st.SpansExported, "spans_dropped", st.SpansDropped,
			"export_errors", st.ExportErrors, "gaps_dropped", st.GapsDropped)
	}
	return errors.Join(errs...)
}
