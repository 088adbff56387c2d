// Package attribute says why the host left the GPU idle over an interval:
// it keeps each traced thread's activity timeline (Thread), names the
// cause of one blocking interval (BaseCause), accumulates what the threads
// that explain an interval did over it (Attribution: a wait on a sibling
// is charged to what the sibling did, a wait on a data-loader worker to
// the worker's I/O or compute, a lock to its holder), and turns that into
// the result a gap carries: its dominant cause, its breakdown by cause, the
// evidence a user checks it by (files, peers, workers, lock holders, the
// code location behind it) and its host operations, bounded to the top
// entries. Cause, Evidence and HostOp are defined here; correlate names
// them too (type aliases), so callers of Gap need not import this package.
//
// # Rule
//
// Attribution is a function of the timelines and the world it reads: the
// engine owns the threads and adds each event to its thread's timeline; an
// Attribution reads the threads it is given and the World (threads,
// processes, who is a loader worker) and changes neither. A Thread owns its
// timeline (sorted by end, capped at MaxIntervals, trimmed by the engine),
// and answers questions about it. The package decides no gap: where a gap
// begins and ends is the GPU queue model's. It imports only event,
// correlate/interval and the standard library, never correlate.
//
// # Files
//
//	timeline.go  Thread: the activity timeline, what dominates when
//	             (Segments), when the thread could not run
//	causes.go    what cause one host interval is, and its name
//	attribute.go Attribution and World: accumulating one interval's
//	             activity, following wakers to siblings, lock holders and
//	             loader workers
//	waits.go     what a wait waited on: its waker, or for a wait a timer
//	             ended, the wait it was retried in or the sibling that
//	             computed; the interpreter's own lock waits
//	queued.go    a thread's wait for a CPU before a wait on a worker or a
//	             holder is that wait's, while they worked
//	evidence.go  an attribution's Result: cause, breakdown, evidence and
//	             host operations, bounded to the top entries; a staged
//	             copy's evidence
//	types.go     Cause and the evidence types (the --gaps-out contract)
//	stack.go     the code location behind a gap: the user frame, its
//	             call site, a stack as text
package attribute
