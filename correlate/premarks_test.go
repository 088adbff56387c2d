package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// premarkRing is a loop's token ring: each iteration copies its batch
// (and, from iteration marksFrom on, launches a marked function after
// it), 10 time units apart, the first iteration at 10.
func premarkRing(iters, marksFrom int, launches bool) []stepclock.Token {
	batch := stepclock.Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyHtoD, Bytes: 1 << 20}
	mark := stepclock.Key{Kind: event.KindEnqueue, Fn: 0x4430}
	var toks []stepclock.Token
	for i := 1; i <= iters; i++ {
		toks = append(toks, stepclock.Token{Key: batch, T: int64(10 * i)})
		if i >= marksFrom {
			toks = append(toks, stepclock.Token{Key: mark, T: int64(10*i + 5)})
		}
		if launches && i%3 == 0 {
			toks = append(toks, stepclock.Token{Key: batch, T: int64(10*i + 7)})
		}
	}
	return toks
}

// A clock on a marked launch found once the tracer marked the function
// (iteration 11 of 30): the iterations before it are cut at the batch
// copy, which each of its steps holds once, not left in one window.
func TestRetroClockBeforeMarks(t *testing.T) {
	s := &stepper{pid: 1, next: 1, origin: 8}
	s.toks = premarkRing(30, 11, false)
	s.clock = &clockState{key: s.toks[21].Key, m: 1, seg: stepclock.Seg{Counts: map[stepclock.Key]int{}}}
	s.mode = modeClock
	s.retroClock()
	steps, windows := 0, 0
	for _, st := range s.steps {
		if st.Window {
			windows++
		} else if st.closed {
			steps++
		}
	}
	// Iterations 1-29 closed (the 30th is open), the first merged with
	// its sliver of a prologue; each closed step ends in the iteration
	// after its own (copies at 10i, marked launches at 10i+5 from 115).
	if steps != 29 || windows != 0 {
		t.Fatalf("%d steps and %d windows over 29 closed iterations, want 29 steps", steps, windows)
	}
	for i, st := range s.steps[:29] {
		if it := st.End / 10; it != int64(i+2) {
			t.Fatalf("step %d ends at %d, in iteration %d; want %d", st.Number, st.End, it, i+2)
		}
	}
	// A copy that some steps hold twice stands in for nothing.
	s = &stepper{pid: 1, next: 1, origin: 8}
	s.toks = premarkRing(30, 11, true)
	s.clock = &clockState{key: stepclock.Key{Kind: event.KindEnqueue, Fn: 0x4430}, m: 1, seg: stepclock.Seg{Counts: map[stepclock.Key]int{}}}
	s.mode = modeClock
	s.retroClock()
	if n := len(s.steps); n == 0 || !s.steps[0].Window || s.steps[0].End < 110 {
		t.Fatalf("uneven copies: first step %+v, want a window up to the first marked launch", s.steps[0].Step)
	}
}
