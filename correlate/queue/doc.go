// Package queue holds the GPU queue model of a process: per CUDA stream,
// whether work was enqueued since the stream was last known drained
// (Streams). Enqueues (launches, async copies, memsets, collectives) fill
// a stream; a synchronisation drains the streams it covers (Drain: a
// context sync or a free all of them, a stream sync its stream and the
// side streams' older work, an event sync the stream its thread last
// queued to). When every stream is drained the GPU has nothing to do: the
// engine opens a gap there. Burst is one thread's work since the queue
// was last empty (a trailing burst whose drain no sync shows), and
// FirstOps learns which operations lite sees are the first GPU work after
// a sync, so that a gap lite sees can end there as full's would. Ahead
// tracks a feeder blocked while its queue still held work: a possible
// CPU-ahead stall, which the engine's windows then judge.
//
// # Rule
//
// A type that owns its state and decides only what the queue holds: no
// engine state, no gaps, no attribution. The caller says what happened
// (an enqueue at t, a sync) and asks what is pending; what it keeps of a
// collective is its own (the type parameter). The package imports only
// event, correlate/stepclock (the operation keys) and the standard
// library, never correlate.
//
// # Files
//
//	streams.go  Streams: per-stream pending work, drains, the collective
//	            a drain completes
//	burst.go    Burst: one thread's trailing work since the queue was empty
//	ahead.go    Ahead: blocking while the queue held work, in total
//	firstop.go  FirstOps: which operation is the first GPU work after a
//	            sync
package queue
