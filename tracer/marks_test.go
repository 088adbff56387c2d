package tracer

import (
	"slices"
	"testing"
	"time"
)

// loopCounts is what launch_fns holds after iters iterations of a loop
// that launches fn i mult[i] times an iteration (0: not at all), after a
// setup that launched fn 0x99 five times.
func loopCounts(iters int, mult map[uint64]int) fnSnap {
	s := fnSnap{0x99: 5}
	for h, m := range mult {
		s[h] = uint64(iters * m)
	}
	return s
}

// TestPickMarksOnePerRarity: of a loop's functions, the rarest still
// launched are marked, one per rarity (a function launched once per
// iteration and another launched as often are the same rarity), up to
// markMax; the setup's, launched no more, and one launched too often to
// emit every launch are not.
func TestPickMarksOnePerRarity(t *testing.T) {
	mult := map[uint64]int{0x10: 1, 0x11: 1, 0x20: 2, 0x30: 3, 0x40: 4, 0x50: 8, 0x60: 16}
	var snaps []fnSnap
	for i := 0; i <= 8; i++ {
		snaps = append(snaps, loopCounts(10*i, mult))
	}
	got := pickMarks(candidates(snaps, time.Second))
	want := []uint64{0x10, 0x20, 0x30, 0x40}
	if !slices.Equal(got, want) {
		t.Errorf("picked %#x, want %#x", got, want)
	}
	// 16 launches an iteration at 80 iterations a second: too often.
	got = pickMarks(candidates(snaps, time.Second/8))
	if slices.Contains(got, 0x60) || len(got) == 0 {
		t.Errorf("picked %#x at 80 iterations a second", got)
	}
	if cs := candidates(snaps[:1], time.Second); cs != nil {
		t.Errorf("candidates from one scan: %v", cs)
	}
}

// TestMarkStateFirstPick: the first marks wait while a function was just
// launched for the first time (it may be the loop's rarest, one iteration
// in: without it, one launched three times an iteration would clock
// thirds), then for two scans to agree, unless the rarest function picked
// was launched markSettled times.
func TestMarkStateFirstPick(t *testing.T) {
	var s markState
	// One iteration and a third: 0x10 (once an iteration) launched once,
	// 0x30 (three times) four times.
	if mark, _ := s.update(fnSnap{}, time.Second); mark != nil {
		t.Fatalf("marked %#x with no launches", mark)
	}
	if mark, _ := s.update(fnSnap{0x10: 1, 0x30: 2}, time.Second); mark != nil {
		t.Fatalf("marked %#x after one partial iteration", mark)
	}
	if mark, _ := s.update(fnSnap{0x10: 1, 0x30: 4}, time.Second); mark != nil {
		t.Fatalf("marked %#x before two scans agreed", mark)
	}
	if mark, _ := s.update(fnSnap{0x10: 2, 0x30: 6}, time.Second); mark != nil {
		t.Fatalf("marked %#x before two scans agreed", mark)
	}
	mark, _ := s.update(fnSnap{0x10: 3, 0x30: 9}, time.Second)
	if !slices.Equal(mark, []uint64{0x10, 0x30}) {
		t.Fatalf("marked %#x, want 0x10 and 0x30", mark)
	}

	// A loop seen four times over in the first scan: marked at once.
	var f markState
	f.update(fnSnap{}, time.Second)
	if mark, _ := f.update(fnSnap{0x10: 4, 0x30: 12}, time.Second); !slices.Equal(mark, []uint64{0x10, 0x30}) {
		t.Fatalf("marked %#x, want 0x10 and 0x30 at once", mark)
	}
}

// TestMarkStateKeepsAndDrops: marks stay while their functions are still
// launched, and are dropped once one is no longer (a warm-up's function),
// its place taken by the loop's.
func TestMarkStateKeepsAndDrops(t *testing.T) {
	var s markState
	c := fnSnap{}
	s.update(c, time.Second)
	// Warm-up: 0x77 (autotuning) and the loop's 0x10, 0x20.
	c = fnSnap{0x77: 6, 0x10: 6, 0x20: 12}
	mark, _ := s.update(c, time.Second)
	if !slices.Equal(mark, []uint64{0x10, 0x20}) {
		t.Fatalf("marked %#x", mark)
	}
	var unmark []uint64
	for i := 0; i < markHorizon+2; i++ {
		c = fnSnap{0x77: 6, 0x10: c[0x10] + 5, 0x20: c[0x20] + 10, 0x05: uint64(i / 4)}
		m, u := s.update(c, time.Second)
		mark = append(mark, m...)
		unmark = append(unmark, u...)
	}
	if len(unmark) != 0 {
		t.Errorf("unmarked %#x of a loop still running", unmark)
	}
	if !s.marked[0x10] || !s.marked[0x20] || !s.marked[0x05] {
		t.Errorf("marks %v: want the loop's two and the rarer 0x05 as well", s.marked)
	}
	// The loop stops launching 0x20.
	for i := 0; i < markHorizon+1; i++ {
		c[0x10] += 5
		_, u := s.update(c, time.Second)
		unmark = append(unmark, u...)
	}
	if !slices.Contains(unmark, 0x20) || s.marked[0x20] {
		t.Errorf("0x20 not unmarked once no longer launched (unmarked %#x)", unmark)
	}
}
