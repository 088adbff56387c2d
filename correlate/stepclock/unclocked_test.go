package stepclock

import "testing"

// TestUnclockedEvaluationSite: attached as an evaluation began, the
// stream held the evaluation's batches, each a copy of the batch's size
// and a read at line 138; the loop's own iterations (8 micro-batches, 16
// copies, the loss read at line 111 every fifth) sync nowhere else. Once
// the stream shows the training's copies again, the evaluation's line is
// a phase (Unclocked), while a loop's own site beside an evaluation of
// the same shape, or one whose iterations copy several micro-batches, is
// not.
func TestUnclockedEvaluationSite(t *testing.T) {
	var s stream
	for b := 0; b < 15; b++ { // the evaluation: copy, forward, read
		s.tok(1 << 20)
		s.call(pid, 4, 138, 159)
	}
	if sc := Score(s.items); sc.Unclocked(SiteOf(pyStack(138, 159)).Key, pid) {
		t.Fatal("an evaluation alone in the stream: nothing shows the loop iterating without it yet")
	}
	for it := 0; it < 3; it++ { // the training resumes: no sync for 3 iterations
		for k := 0; k < 16; k++ {
			s.tok(1 << 20)
		}
	}
	sc := Score(s.items)
	if !sc.Unclocked(SiteOf(pyStack(138, 159)).Key, pid) {
		t.Error("48 batch copies with no read at all after the evaluation's: its line should be a phase")
	}

	// The loop's own site: a read at line 40 after each batch, an
	// evaluation of 15 batches read at line 70 every 20 iterations.
	var l stream
	for i := 0; i < 60; i++ {
		l.tok(1 << 20)
		l.call(pid, 50, 40, 100)
		if i%20 == 19 {
			for b := 0; b < 15; b++ {
				l.tok(1 << 20)
				l.call(pid, 4, 70, 100)
			}
		}
	}
	sc = Score(l.items)
	for _, line := range []int{40, 70} {
		if sc.Unclocked(SiteOf(pyStack(line, 100)).Key, pid) {
			t.Errorf("line %d: every batch copy is followed by a read; nothing is unclocked", line)
		}
	}

	// Varying micro-batches: 1 to 4 copies of the batch before each
	// optimizer step's read.
	var v stream
	for i := 0; i < 40; i++ {
		for k := 0; k <= i%4; k++ {
			v.tok(1 << 20)
		}
		v.call(pid, 30, 90, 100)
	}
	if Score(v.items).Unclocked(SiteOf(pyStack(90, 100)).Key, pid) {
		t.Error("4 micro-batch copies before a read, as its intervals hold: not unclocked")
	}
}
