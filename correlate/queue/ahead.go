package queue

// Ahead tracks a possible CPU-ahead stall: a feeder that blocked while its
// queue still held work. The blocking counts in total, not per call: a
// data read is a loop of calls of a fraction of a millisecond each, no one
// of which reaches MinGap. The zero value tracks nothing.
type Ahead struct {
	start   int64  // the first blocking's start; 0: none
	tid     uint32 // the feeder that blocked first
	blocked int64  // how long feeders were blocked since start
}

// Block notes that thread tid blocked from start for dur while the queue
// held work.
func (a *Ahead) Block(tid uint32, start, dur int64) {
	if a.start == 0 || start < a.start {
		a.start, a.tid = start, tid
	}
	a.blocked += dur
}

// Start is when the tracked blocking began, 0 when none is tracked.
func (a *Ahead) Start() int64 { return a.start }

// End stops tracking at hi. When ok, hi is after the start and the feeder
// was blocked for at least minGap in all, [lo, hi] is a candidate stall
// of thread tid (found).
func (a *Ahead) End(hi int64, ok bool, minGap int64) (tid uint32, lo int64, found bool) {
	if a.start != 0 && ok && hi > a.start && a.blocked >= minGap {
		tid, lo, found = a.tid, a.start, true
	}
	a.Reset()
	return tid, lo, found
}

// Reset forgets the tracked blocking: the queue drained, or the process
// closed.
func (a *Ahead) Reset() { *a = Ahead{} }
