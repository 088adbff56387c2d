// Package hang decides, from what is in flight right now, whether a traced
// job is stuck, and describes it: the waiting call, since when, which ranks
// of its collective arrived and which did not, the missing ranks' state.
//
// It is pure: the caller (cmd/sidecar) samples the world on a timer, about
// once a second, and hands a Snapshot to Detector.Check. The sample costs
// nothing per traced event: the in-flight calls come from the tracer's
// per-thread BPF state (the entry half of every paired call, read from user
// space), the process states from /proc, the collectives from the events
// the pipeline already routes. So the hot path is as it was.
//
// # Rules
//
// A thread is hung when one call (a CUDA sync, a blocking CUDA call, or a
// blocking syscall of a thread that feeds the GPU) has been in flight for
// at least After, and no thread of its process enqueued work or finished a
// CUDA call since that call began (the device made no progress the host
// can see). A sync whose stream's last operation was a collective names
// that collective: its communicator, sequence number and bytes, and the
// ranks of the communicator that issued it (arrived) or not (missing),
// each with its pid, host and state: running, sleeping, stopped (T), in
// uninterruptible sleep (D, with the file it waits on) or exited.
//
// A wait outside NCCL (gloo, an all-reduce over TCP) has no collective:
// its ranks are named by sockets instead. A call blocked in a socket names
// the traced process at the other end of that socket (Call.PeerPID, a
// loopback TCP connection), whatever its state; any other long call names
// those of its process's socket peers that cannot answer (stopped, in D,
// gone), as gloo waits in a helper thread's poll, not in the caller. A
// rank traced by another sidecar is named with the state that sidecar
// tells (--peers).
//
// A hang is reported once when it begins (Started) and once when its call
// returns or its process goes (Ended); Active lists those in progress,
// with their duration, for the metrics and the live view.
//
// Sequence numbers count the collectives each engine saw on a
// communicator from when tracing began: ranks traced from their start (or
// attached together) agree; a rank attached much later than the others
// counts from there, and the arrived/missing split is then only as good as
// that alignment (the missing rank's process state still holds).
package hang
