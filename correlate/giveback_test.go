package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

func TestSubdivides(t *testing.T) {
	for _, c := range []struct {
		name       string
		from       int64
		cuts, ends []int64
		want       bool
		varied     bool
	}{
		{"micro-batches, four a site iteration", 0, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, []int64{4, 8, 12, 16}, true, false},
		{"three before the site's first call", 1, []int64{2, 3, 4, 5, 6, 7, 8}, []int64{4, 8, 12}, true, false},
		{"the first steps emitted already", 6, []int64{7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, []int64{4, 8, 12, 16}, true, false},
		{"one step each: nothing to take back", 0, []int64{1, 2, 3, 4}, []int64{1, 2, 3, 4, 5}, false, false},
		{"a site call missing", 0, []int64{1, 2, 3, 4, 5, 6, 7}, []int64{1, 2, 3, 5, 6, 7}, false, false},
		{"uneven", 0, []int64{1, 2, 3, 4, 5, 6, 7}, []int64{2, 4, 7}, false, false},
		{"more before the first call than after", 0, []int64{1, 2, 3, 4, 5, 6}, []int64{4, 6}, false, false},
		{"no whole interval", 0, []int64{1, 2}, []int64{2, 4}, false, false},
		{"no cut", 0, nil, []int64{2, 4}, false, false},
		{"uneven, iterations of varying micro-batches", 0, []int64{1, 2, 3, 4, 5, 6, 7}, []int64{2, 4, 7}, true, true},
		{"varying, one step each", 0, []int64{1, 2, 3, 4}, []int64{1, 2, 3, 4, 5}, false, true},
		{"varying, an iteration without a cut", 0, []int64{1, 2, 3, 6, 7}, []int64{2, 4, 5, 7}, false, true},
	} {
		if got := subdivides(c.from, c.cuts, c.ends, c.varied); got != c.want {
			t.Errorf("%s: subdivides = %v, want %v", c.name, got, c.want)
		}
	}
}

// The work pattern's pending steps, four to each of the site's
// iterations, give way to the site's calls after its first call in the
// stream (40); a gap delivered to one keeps it and those before.
func TestGiveBackMicroSteps(t *testing.T) {
	lay := func(gapAt int, source string) *stepper {
		s := &stepper{pid: 1, next: 1, origin: 0}
		s.sites.trimmed = true
		s.open(0, false)
		for i := 1; i <= 12; i++ {
			if i == gapAt {
				s.steps[len(s.steps)-1].Gaps = 1
			}
			s.boundary(int64(10*i), false)
		}
		for _, st := range s.steps {
			if st.closed {
				st.ClockSource = source
			}
		}
		return s
	}
	// The micro-batch read's site ended them (picked before the
	// launches showed the grouping), or the work pattern: both give way.
	for _, src := range []string{stepclock.SourceWork, stepclock.SourceCallSite} {
		s := lay(0, src)
		s.giveBack([]int64{40, 80, 120})
		if n := len(s.steps); n != 5 || s.steps[4].closed || s.steps[4].Start != 40 || s.next != 6 {
			t.Fatalf("%s: after give-back: %d steps, open %v from %d, next %d; want steps 1-4 kept and 5 open from 40",
				src, n, !s.steps[n-1].closed, s.steps[n-1].Start, s.next)
		}
	}
	// A declared site's steps stay.
	s := lay(0, stepclock.SourceDeclared)
	s.giveBack([]int64{40, 80, 120})
	if n := len(s.steps); n != 13 {
		t.Fatalf("declared steps: %d steps after give-back, want all 13 kept", n)
	}
	s = lay(10, stepclock.SourceWork)
	s.giveBack([]int64{40, 80, 120})
	if n := len(s.steps); n != 13 {
		t.Fatalf("a gap in step 10: %d steps, want all 13 kept (nothing after it to take back)", n)
	}
}

// TestGiveBackAfterUnseenSiteCalls: attached mid-run, the steps before the
// site's first sited call cut it more often than any of its iterations
// (an iteration went by there, its site call without a stack): those
// steps stay, and the ones from the site's first call on are given back.
func TestGiveBackAfterUnseenSiteCalls(t *testing.T) {
	// Twelve work-pattern steps of 10 from the stream's first call at 0.
	lay := func() *stepper {
		s := &stepper{pid: 1, next: 1, origin: 0}
		s.open(0, false)
		for i := 1; i <= 12; i++ {
			s.boundary(int64(10*i), false)
		}
		for _, st := range s.steps {
			if st.closed {
				st.ClockSource = stepclock.SourceWork
			}
		}
		return s
	}
	// Six cuts before the first call at 60, four in each iteration after.
	s := lay()
	s.giveBack([]int64{60, 100, 140})
	n := len(s.steps)
	if n != 7 || s.steps[n-1].closed || s.steps[n-1].Start != 60 || s.next != 8 {
		t.Fatalf("after give-back: %d steps, open %v from %d, next %d; want steps 1-6 kept and 7 open from 60",
			n, !s.steps[n-1].closed, s.steps[n-1].Start, s.next)
	}
	// Where the first interval holds no more cuts than an iteration (the
	// process's first), everything from its start is given back.
	s = lay()
	s.giveBack([]int64{40, 80, 120})
	if n := len(s.steps); n != 1 || s.steps[0].closed || s.steps[0].Start != 0 || s.next != 2 {
		t.Fatalf("process's first iteration: %d steps, next %d; want one open from 0", n, s.next)
	}
}
