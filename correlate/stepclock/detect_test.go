package stepclock

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// BenchmarkDetectClock: one detection over a full ring of an eager loop
// (a batch copy and fifteen per-parameter copies per step); it runs every
// Recheck operations, so it must stay well under a millisecond.
func BenchmarkDetectClock(b *testing.B) {
	var toks []Token
	for i := int64(0); len(toks) < TokMax; i++ {
		toks = append(toks, Token{Key: Key{Kind: event.KindMemcpyAsync, Bytes: 16 << 10}, T: i * 1e7, Launches: 280, Syncs: 2})
		for k := int64(1); k <= 15; k++ {
			toks = append(toks, Token{Key: Key{Kind: event.KindMemcpyAsync, Bytes: 4 << 20}, T: i*1e7 + k*1e5})
		}
	}
	toks = toks[:TokMax]
	if cf, _ := Detect(toks, Input{LaunchesSeen: true, Posts: func(lo, hi int64) int64 { return -1 }}); cf.Key.Bytes != 16<<10 {
		b.Fatalf("clock %s, want the batch copy", cf.Key)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Detect(toks, Input{LaunchesSeen: true, Posts: func(lo, hi int64) int64 { return -1 }})
	}
}

// TestPhasesDifferByLaunches: occurrences of a clock's operation, m a
// step, differ by position when the launches between them do: a loop runs
// the same kernels at the same place of every iteration, so each position
// launches one or two counts (an occurrence a checkpoint inserted mixes
// two positions; a lagging flush moves a few launches across). Counts
// that the loop's data picks spread at every position, and their medians
// differ by chance: no phases.
func TestPhasesDifferByLaunches(t *testing.T) {
	units := func(counts ...uint64) []SegSum {
		u := make([]SegSum, len(counts))
		for i, n := range counts {
			u[i] = SegSum{Ops: 1, Launches: n}
		}
		return u
	}
	for _, c := range []struct {
		name   string
		unit   []SegSum
		m      int
		differ bool
	}{
		// A batch copy then a copy into a graph's input: the replay's
		// launches after the second only.
		{"graph replay", units(0, 768, 0, 768, 0, 768, 0, 768, 0, 768), 2, true},
		// An inserted occurrence shifted the positions once.
		{"shifted by an insertion", units(0, 768, 0, 768, 0, 0, 768, 0, 768, 0, 768, 0, 768, 0, 768, 0, 768, 0), 2, true},
		// Micro-batches' backward flushed by another thread.
		{"flush lag", units(0, 86, 0, 125, 0, 125, 0, 171, 0, 125, 0, 2, 0, 125, 0, 86), 2, true},
		{"alike", units(40, 40, 41, 40, 39, 40, 40, 40, 40, 41), 2, false},
		// 3 to 24 kernels a step, drawn.
		{"picked by data", units(4, 17, 9, 22, 13, 6, 24, 11, 3, 19, 15, 8, 21, 5, 12, 18), 2, false},
		{"picked by data, m=3", units(4, 17, 9, 22, 13, 6, 24, 11, 3, 19, 15, 8, 21, 5, 12, 18, 7, 10), 3, false},
	} {
		if got := PhasesDiffer(c.unit, c.m, true); got != c.differ {
			t.Errorf("%s: phases differ %v, want %v", c.name, got, c.differ)
		}
	}
}

// aheadLoop is a loop that copies its batch (async, 1 MiB) and launches
// six kernels an iteration, and reads its loss every tenth: the host runs
// ahead, so nine iterations enqueue within a few hundred microseconds and
// the tenth waits 45 ms at its sync. Launches are seen (seen) but flushed
// only at the sync; each copy reports the six launches before it pending
// (Pos). A checkpoint of perTensor copies, nothing launched between them,
// follows every tenth iteration where ckpt.
func aheadLoop(iters int, seen bool, ckpt int) []Token {
	var toks []Token
	var t int64
	var pos uint64
	batch := Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyHtoD, Bytes: 1 << 20}
	for i := 1; i <= iters; i++ {
		tk := Token{Key: batch, T: t, Seen: seen, Pos: pos, PosFrom: pos}
		if n := len(toks); n > 0 {
			tk.From, tk.PosFrom = toks[n-1].T, toks[n-1].Pos
		}
		if i%10 == 1 && i > 1 {
			// The sync before it flushed the ten iterations' launches.
			tk.Launches, tk.Syncs = 60, 2
		}
		toks = append(toks, tk)
		pos += 6
		t += 30_000
		if i%10 == 0 {
			t += 45_000_000
			for k := 0; k < ckpt; k++ {
				toks = append(toks, Token{Key: Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyDtoH, Bytes: 4 << 20}, T: t, Seen: seen, Pos: pos, PosFrom: pos, From: toks[len(toks)-1].T})
				t += 20_000
			}
		}
	}
	return toks
}

// TestDetectAheadLoop: a loop that reads its loss every tenth iteration
// lets the host run ahead, so by time its batch copy's steps look like a
// burst (nine short, one long). Where their launches were seen (auto's
// windows, lite's rules), the launches made between the copies, reported
// pending, say each step holds the same work: the copy clocks it. A
// token after launches reported pending follows compute (Idle).
func TestDetectAheadLoop(t *testing.T) {
	in := Input{Posts: func(lo, hi int64) int64 { return -1 }}
	cf, _ := Detect(aheadLoop(80, true, 0), in)
	if cf.Key.Bytes != 1<<20 || cf.M != 1 {
		t.Fatalf("clock %s ×%d, want the batch copy ×1", cf.Key, cf.M)
	}
	// Unseen launches (lite): time is all there is, and it says burst.
	if cf, _ := Detect(aheadLoop(80, false, 0), in); cf.Key.Bytes == 1<<20 && cf.M == 1 {
		t.Errorf("clock %s ×%d with no launch seen, want none by time alone", cf.Key, cf.M)
	}
	toks := aheadLoop(3, true, 0)
	if toks[1].Idle() {
		t.Errorf("a copy after six launches reported pending is idle")
	}
	if tk := (Token{Key: toks[0].Key, Seen: true, Pos: 6, PosFrom: 6}); !tk.Idle() {
		t.Errorf("a copy with no launch since the previous token is not idle")
	}
}

// evalAmidMicroBatches is what an attach just before an evaluation sees
// of a loop of 8 micro-batches an optimizer step, each copying x and then
// y (1 MiB each) and launching its forward and backward after y: 22
// launches after every second copy, 26 more at each optimizer step. The
// evaluation copies one batch at a time, launches 5 kernels and reads its
// metric (a sync). before and after micro-batches of training frame the
// evaluation's evals batches. Every launch is seen and flushed at the
// next token.
func evalAmidMicroBatches(before, evals, after int) []Token {
	batch := Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyHtoD, Bytes: 1 << 20}
	var toks []Token
	var t int64
	var pos uint64
	add := func(launches uint64, syncs int, dt int64) {
		t += dt
		toks = append(toks, Token{Key: batch, T: t, Launches: launches, Syncs: syncs, Seen: true, PosFrom: pos, Pos: pos + launches})
		pos += launches
	}
	micro := func(i int) {
		n := uint64(22)
		if i%8 == 0 {
			n += 26
		}
		add(n, 0, 1_200_000) // x, after the previous micro-batch's work
		add(0, 0, 30_000)    // y
	}
	for i := range before {
		micro(i)
	}
	for range evals {
		add(5, 1, 300_000)
	}
	for i := range after {
		micro(i)
	}
	return toks
}

// TestDetectEvaluationAmidMicroBatches: the training's copies alternate
// 0 and 22 launches after them, the evaluation's come with 5 each. Their
// counts together are too varied for one step's, as a loop whose data
// picks its kernels would launch, but they differ by position within the
// training: each copy is half a micro-batch, not a step, in full's rules
// and in lite's where a window saw the launches. Counts that the loop's
// data picks, spread at every position, still clock at every copy.
func TestDetectEvaluationAmidMicroBatches(t *testing.T) {
	posts := func(lo, hi int64) int64 { return -1 }
	toks := evalAmidMicroBatches(10, 15, 10)
	for _, seen := range []bool{true, false} {
		cf, valid := Detect(toks, Input{LaunchesSeen: seen, Posts: posts})
		for _, v := range valid {
			if v.M == 1 {
				t.Errorf("launches seen %v: the batch copy qualifies at every copy (best %s ×%d)", seen, cf.Key, cf.M)
			}
		}
	}
	batch := Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyHtoD, Bytes: 1 << 20}
	var picked []Token
	var pos uint64
	for i, n := range []uint64{4, 17, 9, 22, 13, 6, 24, 11, 3, 19, 15, 8, 21, 5, 12, 18, 7, 10, 16, 14, 20, 2, 23, 9} {
		picked = append(picked, Token{Key: batch, T: int64(i) * 1_000_000, Launches: n, Syncs: 1, Seen: true, PosFrom: pos, Pos: pos + n})
		pos += n
	}
	if cf, _ := Detect(picked, Input{LaunchesSeen: true, Posts: posts}); cf.Key != batch || cf.M != 1 {
		t.Errorf("counts picked by data: clock %s ×%d, want the batch copy at every copy", cf.Key, cf.M)
	}
}
