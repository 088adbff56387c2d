// Package stepclock holds the pure part of the step clock: functions from
// the sequence of a process's enqueued operations (Token, Key) and
// synchronisations (Sync) to step boundaries. Detect finds the work clock,
// the operation that occurs a fixed number of times per iteration with
// the same work between; DetectPeriod finds the sync period, the number of
// syncs per step, where no clock is found; Seg, LagFit and SameSync
// compare one step with the next. PickSite finds the call site that
// recurs once an iteration in a stream of sited calls and tokens,
// Spec is a step site the user declared (spec.go), and FrameworkClock
// says which framework marker ends steps (framework.go).
//
// # Rule
//
// Nothing here holds state across calls: every function is deterministic
// in its arguments, and the types are values the caller owns. The engine's
// stepper (correlate/steps.go, clock.go) keeps the token ring, the sync
// history and the running clock, and asks this package what they mean.
// The package imports only event and the standard library.
//
// # Files
//
//	tokens.go    Key, Token, Seg, LagFit, Found: what the clock compares
//	detect.go    Detect: the clock in a token ring, judged operation by
//	             operation; positional: occurrences of which one
//	             position runs no kernel are slices of a step
//	segments.go  what the segments between occurrences hold, compared
//	period.go    Sync, SameSync, DetectPeriod: the sync period and its phase
//	site.go      Site, PickSite: steps from the code's call sites; Score: a stream scored once for a check's questions
//	micro.go     MicroSites, microBatches, encloses: gradient accumulation
//	             told by the launches between a site's calls
//	weight.go    Weights, Heavier: the launches of a site's iterations,
//	             which tell a training loop from an evaluation's;
//	             SameWork, SameData: a loop that changed its site
//	varied.go    iterations of a varying number of micro-batches: the
//	             launches against the copies between a site's calls;
//	             variedShort (Scored.Undecided): too few counts yet
//	unclocked.go Scored.Unclocked: a site whose iterations' work the loop
//	             enqueues again and again with no sited call at all is a
//	             phase inside the loop (an evaluation met first), not its
//	             step site
//	spec.go      Spec, ParseSpec: a step site the user declared
//	framework.go FrameworkClock: steps from a framework's own markers
//	             (PyTorch's optimizer step, its profiler step)
package stepclock
