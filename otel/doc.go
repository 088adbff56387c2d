// Package otel turns gaptrace's results (correlate.Step, correlate.Gap,
// correlate.Summary) into OpenTelemetry spans and metrics and ships them:
// OTLP over gRPC or HTTP when an endpoint is configured (flag or the
// standard OTEL_EXPORTER_OTLP_* variables), otherwise a local JSON-lines
// spans file; metrics over OTLP and, on request, a Prometheus endpoint.
//
// # Span model
//
// One trace per training step (or per fixed window when no step period was
// found):
//
//	train.step                      root; step number, duration, idle ratio, idle by cause, hw context
//	└── rank <N>                    only with a job ID: one per rank, all ranks share the trace
//	    └── gpu.idle                one per gap; gpu.gap.cause, breakdown, evidence
//	        └── read / write / ...  one per host operation that explains the gap
//
// Without a job ID the trace and span IDs are random and gpu.idle spans hang
// directly under train.step. With a job ID the trace ID and the root's span
// ID are derived from (job ID, step), so every rank's sidecar computes the
// same IDs without talking to the others; only rank 0 (or a process of
// unknown rank) emits the root span itself, every rank emits its own
// "rank <N>" span with the derived root as its remote parent.
//
// A process that drives several GPUs emits one step per device: the root
// once per step, then one "rank <N>" (or, rank unknown, "device <D>") span
// per device. Sampling (OTEL_TRACES_SAMPLER=traceidratio) decides by trace
// ID, so it keeps or drops whole steps, identically on every rank; metrics
// always count everything.
//
// Step, rank, device, gap and host-operation spans are built as finished
// spans and handed to the span processors directly (direct.go), not through
// the SDK's tracer, whose Start and End copied each span's attributes four
// times: the provider's sampler, ID generator, resource (with
// OTEL_RESOURCE_ATTRIBUTES) and default limits still apply, and a span's
// attributes never repeat a key. Other spans go through the SDK.
//
// Hangs (hang.go) are spans of their own, outside the step traces: a
// gpu.hang span when a hang is detected (ended at detection, status
// "ongoing", with a gpu.hang.thread event per thread carrying its stacks)
// and another when it ends, each flushed at once rather than with the next
// batch; gaptrace_hangs_total counts them and gaptrace_hang_duration_seconds
// is each process's ongoing hang.
//
// # Outputs
//
// OTLP when an endpoint is set (Config.Endpoint or the environment); a
// spans file given as well is written as a local copy through its own
// queue. Without an endpoint the spans file (FileSpan per line) is the
// output, and Replay can send it to a collector later. Metrics: OTLP push
// beside traces (unless OTEL_METRICS_EXPORTER excludes otlp) and a
// Prometheus endpoint when Config.PrometheusAddr is set (a bare port binds
// loopback only).
//
// # Lifecycle and invariants
//
// New resolves the configuration (defaults → environment → Config fields),
// builds the resource, the exporters and the metric readers. Gap and Step are
// called by the correlation goroutine: the gaps of step n arrive before
// Step(n), so Gap only buffers (bounded, per process/device/step; overflow
// is counted) and Step emits the whole trace. Neither ever blocks on the
// network or the disk: finished spans go to a bounded queue that a single
// goroutine batches to the exporter; a full queue drops spans and counts
// them (Stats.SpansDropped). A failed export is retried by that goroutine
// with exponential backoff (1 s to 30 s), its batches kept, bounded, in
// order; the OTLP trace exporters' own retries are off, so the first
// failure is logged at once (then at most every 30 s) and counted
// (Stats.ExportErrors, Stats.ExportFailing). Shutdown flushes what is
// queued within its context's deadline and counts what it could not send.
package otel
