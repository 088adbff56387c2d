// Package ranks holds what the engine knows of a distributed job's NCCL
// communicators: each process's communicators and the groups that link
// those of different processes (from their creation when it was seen,
// else from their collectives), each communicator's recent collectives,
// the ranks' verdict on a collective wait (which rank was late, and by
// how much; when every rank's sync saw it complete), and the communicators
// of processes other sidecars of the job trace, mirrored from their
// records.
//
// # Lifecycle
//
// The engine owns one Registry. It feeds it a communicator's creation
// (Add), each collective as it is processed (Issue, which returns the
// collective's Ref), what a process's environment says of its rank
// (SetRank), the records of other sidecars (Peer, PeerLeft) and the exit
// of a process (Forget); it asks for the ranks' verdict on a wait
// (Lateness, Completion, AwaitsLink) and for the half-step prologue vote
// of a process's groups (Vote). SetOut makes the registry report every
// change to this engine's own communicators as Records for the job's
// other sidecars. One goroutine uses it.
//
// # Rule
//
// The Registry owns its tables: nothing outside this package reads or
// changes a communicator, a group or a mirror; the engine holds Refs and
// asks. What the registry needs of the engine's state, whether a process
// is alive, it gets as a function at New. The package imports only event
// and the standard library (the linter's depguard rule "ranks" says so),
// and it decides no gap and no step: it says what the ranks show, the
// engine decides what that makes of a wait.
//
// # Files
//
//	registry.go  Registry: its tables, creation, issue, forgetting,
//	             SetRank, the own communicators' reports
//	comm.go      a communicator, its ring of recent collectives, its
//	             group; Ref and Late
//	verdict.go   the ranks' verdict on a wait: Lateness, Completion,
//	             AwaitsLink; the prologue Vote
//	link.go      linking communicators whose creation was not seen by
//	             their collectives; realigning those whose was
//	mirror.go    communicators of other sidecars' processes, mirrored
//	             from their Records
//	record.go    Record, what sidecars exchange, and its Check
package ranks
