package stepclock

import (
	"fmt"

	"github.com/gaptrace/gaptrace/event"
)

// The work clock's tunables.
const (
	TokMax = 256 // enqueue tokens remembered for clock detection
	// ScalarBytes: copies and memsets this small are host code reading or
	// setting scalars, which it does at will; they neither clock steps nor
	// make two steps differ.
	ScalarBytes = 4096
	MaxM        = 4 // most occurrences of the clock per step considered
	SegMin      = 4 // segments compared at least before a clock is trusted
	MaxKeys     = 16
	// Every: tokens between detection attempts.
	Every = 4
	// JitterRel: launch counts of two steps this close are the same
	// step (data-dependent control flow). Launches reach the tracer late
	// besides, in per-thread batches flushed at the thread's next CUDA
	// call: LagFit follows what that moves from one step to the next.
	JitterRel = 0.3
	// Recheck: tokens between checks that a running clock still
	// qualifies.
	Recheck = 16
)

// Key identifies an enqueued operation across steps. A copy's
// direction is part of it: a checkpoint's device-to-host copy of a tensor
// the size of the batch is not the batch's copy to the device.
type Key struct {
	Kind   event.Kind
	Dir    event.CUDA
	Stream uint64
	Bytes  uint64
	Op     event.NCCLOp
	Comm   uint64
	// fn: a marked launch's function (event.Event.Mark), 0 for copies,
	// memsets and collectives.
	Fn uint64
}

// markRarer: how many times more rarely than a marked function another
// may be launched and still count in its steps' operations (rarerMarks):
// a layer's function launched four times an iteration is judged with the
// iteration's once-launched ones, a loop's once-launched function without
// a metric computed every fifth iteration;
// markMatch: the share of its steps that must match (MatchMin for other
// operations).
// MarkWait: marked launches the ring holds at least before the sync
// period may lock while no step is decided: enough for a clock of
// MaxM occurrences a step to show 2*SegMin steps and the first.
const (
	markRarer = 4.5
	markMatch = 0.9
	MarkWait  = (2*SegMin + 2) * MaxM
)

// Marked says whether the operation is a marked launch. The tracer marks
// a few functions of each rarity it finds (tracer/marks.go), among them
// functions a loop launches every tenth iteration or once per checkpoint:
// such launches may clock steps, but like scalar reads they come as host
// code chooses, so they never make two steps differ.
func (k Key) Marked() bool { return k.Fn != 0 }

// Token is one enqueued operation that can clock steps.
type Token struct {
	Key      Key
	T        int64
	Launches uint64 // kernels launched since the previous token
	Syncs    int    // syncs since the previous token
	// seen: every launch since the previous token was seen (full, or a
	// window of auto), so launches == 0 means none ran.
	Seen bool
	// mlaunches (marked launches only): the process's kernels launched
	// since the previous marked launch, exactly: what its threads
	// flushed and what they reported unflushed (Event.Pending). A marked
	// launch amid a burst flushes nothing, so launches, counted at
	// flushes, may lag by a step; a clock on marked launches compares
	// steps by these.
	MLaunches uint64
	// pos: the process's launch position at the token, what its threads
	// flushed and reported unflushed; the difference between two tokens'
	// is the launches made between them, where launches counts what was
	// flushed between them (a sync flushes the step's tail early, which
	// the next step's first launch would have flushed).
	Pos uint64
	// PosFrom: the launch position at the previous token (Pos where
	// none came before). A launch reported unflushed in between (an
	// async copy's Event.Pending) is compute, though no flush counted it
	// in Launches yet.
	PosFrom uint64
	// occ: for a collective on a communicator seen from its creation, how
	// many like it the communicator issued before; -1 otherwise.
	Occ int64
	// from is the previous token's time. quiet: launches unseen, GPM read
	// no SM activity on the device from then to this one; gpmWait: its
	// verdict is not in yet (askGPM).
	From           int64
	Quiet, GPMWait bool
}

// Idle says whether the token is known to follow no compute: no launch
// since the previous token, flushed or reported pending, all launches
// seen, and no collective itself;
// or, launches unseen, GPM saw no compute on the device meanwhile.
func (t *Token) Idle() bool {
	if t.Key.Marked() {
		return false // a launch itself
	}
	return t.Key.Kind != event.KindCollective && (t.Quiet || t.Seen && t.Launches == 0 && t.Pos <= t.PosFrom)
}

// Seg is what one step enqueued, for comparing steps.
type Seg struct {
	Launches uint64
	// ByPos: the launches made in the step by position (Token.Pos),
	// where Launches counts what was flushed in it.
	ByPos  uint64
	Counts map[Key]int
	Syncs  int
}

// SameOps says whether two steps enqueued the same operations.
func (a *Seg) SameOps(b *Seg) bool {
	if len(a.Counts) != len(b.Counts) {
		return false
	}
	for k, n := range a.Counts {
		if b.Counts[k] != n {
			return false
		}
	}
	return true
}

// LagFit says whether a sequence of steps' launch counts is that of steps
// of ref launches each, given that launches reach the tracer late: the
// BPF side emits the first launch after a blocking call as an event and
// counts the rest, flushing the count at the thread's next sync or at its
// first launch after its next blocking call. A step's launches after the
// last such point before its closing operation (a copy or collective,
// which flush nothing) are counted in the next step: on a busy host,
// where a preemption mid-step re-arms the event, a step of 8 counts 15
// and the next 1. The lag, launches of a step counted in the next, lies
// between none and all of a step's; LagFit keeps the lags consistent with
// every count so far and refuses a count that none makes fit. A count
// that is simply wrong (alternating 100 and 20 for a median of 100) runs
// the lag out of that range within a step or two.
type LagFit struct {
	lo, hi float64
	set    bool
}

// Reset forgets the lag: the next count starts a new sequence.
func (f *LagFit) Reset() { f.set = false }

// Fit takes a step's launch count n; it reports whether n is a step of ref
// launches give or take what the neighbouring steps lent and borrowed.
func (f *LagFit) Fit(n uint64, ref float64) bool {
	if !f.set {
		// The lag before the first step is unknown.
		f.lo, f.hi, f.set = 0, ref, true
	}
	tol := max(LaunchJitter, JitterRel*ref)
	lo, hi := f.lo+ref-float64(n), f.hi+ref-float64(n)
	if hi < -tol || lo > ref+tol {
		f.lo, f.hi = 0, ref
		return false
	}
	// Jitter of the step's own count is absorbed here, not accumulated:
	// the lag stays within a step's launches.
	f.lo, f.hi = min(max(lo, 0), ref), max(min(hi, ref), 0)
	return true
}

func launchesClose(x, y uint64) bool {
	if x < y {
		x, y = y, x
	}
	return x-y <= LaunchJitter || float64(x-y) <= JitterRel*float64(x)
}

// TokenOf is the clock token of an enqueue, if it can be one.
func TokenOf(ev *event.Event) (Key, bool) {
	switch ev.Kind {
	case event.KindMemcpyAsync, event.KindMemset, event.KindMemcpy:
		if ev.Bytes <= ScalarBytes {
			return Key{}, false
		}
		return Key{Kind: ev.Kind, Dir: ev.CopyDir, Stream: ev.Stream, Bytes: ev.Bytes}, true
	case event.KindCollective:
		return Key{Kind: ev.Kind, Stream: ev.Stream, Bytes: ev.Bytes, Op: ev.Op, Comm: ev.Comm}, true
	case event.KindEnqueue:
		if ev.Mark != 0 {
			return Key{Kind: ev.Kind, Stream: ev.Stream, Fn: ev.Mark}, true
		}
	}
	return Key{}, false
}

// Found is a detected clock and how steps look under it.
type Found struct {
	Key      Key
	M, Phase int
	SegLen   float64 // tokens per step
	// span: time per step, to compare a marked launch's clock with a
	// copy's (StepLens).
	Span         float64
	SyncsVary    bool    // the syncs per step differ between steps
	SyncsPerStep int     // when they do not
	Launches     float64 // a step's launches (median), where seen
	// ByPosition: Launches counts by launch position (Token.Pos), not by
	// flush: a grouping that launches alone showed (a loop that syncs
	// once in several steps flushes its counts only then).
	ByPosition bool
	Occ        int64 // occurrences of key in the ring, numbered from 0
	// work is the median work of a step (launches where they are seen,
	// else its duration); concentrated: the median step holds far less
	// than the mean (the work happens in a few of them).
	Work         float64
	Concentrated bool
	MedSyncs     int // median syncs per step
	// unproven: no sync came between its first and last occurrence, and
	// they span less time than the ring held before the first.
	Unproven   bool
	SyncCounts []int // syncs of the last steps, oldest first
}

// SyncsRing: steps whose sync counts say whether positions name syncs.
const SyncsRing = 8

// CopiesComing says whether an operation other than a marked launch
// repeats in toks, still, but too few times yet for Detect to judge
// it as a clock of up to MaxM occurrences a step.
func CopiesComing(toks []Token) bool {
	n := map[Key]int{}
	last := map[Key]int{}
	for i := range toks {
		if k := toks[i].Key; !k.Marked() {
			n[k]++
			last[k] = i
		}
	}
	// Still occurring: among the latest tokens (a model's setup copies its
	// parameters, and that never becomes a clock).
	recent := len(toks) - 4*MaxM*(SegMin+1)
	for k, c := range n {
		if c >= 2 && c <= MaxM*(SegMin+1) && last[k] >= recent {
			return true
		}
	}
	return false
}

// Add counts tok in the step: its operation (a marked launch's only
// through launches), its syncs and the launches since the token before
// it (exactly, MLaunches, under a marked launch's clock).
func (f *Seg) Add(tok *Token, marked bool) {
	if marked {
		f.Launches += tok.MLaunches
	} else {
		f.Launches += tok.Launches
	}
	f.ByPos += tok.Pos - min(tok.Pos, tok.PosFrom)
	f.Syncs += tok.Syncs
	if !tok.Key.Marked() {
		f.Counts[tok.Key]++
	}
}

// String names the operation for logs.
func (k Key) String() string {
	switch k.Kind {
	case event.KindEnqueue:
		return fmt.Sprintf("launch of function %#x on stream %#x", k.Fn, k.Stream)
	case event.KindCollective:
		return fmt.Sprintf("%s %d bytes on stream %#x", k.Op, k.Bytes, k.Stream)
	case event.KindMemset:
		return fmt.Sprintf("memset %d bytes on stream %#x", k.Bytes, k.Stream)
	}
	switch k.Dir {
	case event.CUMemcpyHtoD:
		return fmt.Sprintf("copy %d bytes to the device on stream %#x", k.Bytes, k.Stream)
	case event.CUMemcpyDtoH:
		return fmt.Sprintf("copy %d bytes to the host on stream %#x", k.Bytes, k.Stream)
	}
	return fmt.Sprintf("copy %d bytes on stream %#x", k.Bytes, k.Stream)
}
