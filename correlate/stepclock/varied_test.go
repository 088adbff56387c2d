package stepclock

import "testing"

// ks: micro-batches per optimizer step, as a token budget packs them.
var ks = []int{3, 3, 4, 2, 6, 2, 3, 5, 4, 2, 3, 4, 2, 3, 2, 4, 6, 3, 5, 2}

func TestPickSiteVariedMicroBatches(t *testing.T) {
	// Each step copies 2-6 micro-batches (2 launches each) and ends with
	// the optimizer's 2 launches and an event sync in a helper (line 10)
	// called from the step (line 40); every 25 steps an evaluation of 10
	// batches syncs through the same helper from line 70.
	var s stream
	for i := 0; i < 100; i++ {
		k := ks[i%len(ks)]
		for m := 0; m < k; m++ {
			s.tok(4096)
		}
		s.call(pid, uint64(2*k+2), 10, 40)
		if i%25 == 24 {
			for b := 0; b < 10; b++ {
				s.tok(4096)
				s.call(pid, 1, 10, 70)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Key != SiteOf(pyStack(10, 40)).Key {
		t.Fatalf("picked %+v %v, want the helper as called from line 40", p, ok)
	}
}

func TestPickSiteNoneVaryingEveryNth(t *testing.T) {
	// A loss read every 2-6 iterations (every few seconds): each
	// iteration copies its batch and launches 6, optimizer included, so
	// the launches between reads are a multiple of one iteration's and
	// nothing is launched once per read: no site clocks. Nor under lite,
	// where no launch is seen.
	for _, per := range []uint64{6, 0} {
		var s stream
		for i := 0; i < 100; i++ {
			k := ks[i%len(ks)]
			for m := 0; m < k; m++ {
				s.tok(4096)
			}
			s.call(pid, per*uint64(k), 40)
		}
		if p, ok := PickSite(s.items, pid); ok {
			t.Fatalf("launches %d an iteration: picked %+v, want none", per, p)
		}
	}
}

func TestVariedGoodFit(t *testing.T) {
	var xs []sized
	for _, k := range ks {
		xs = append(xs, sized{k, uint64(200*k + 30)})
	}
	if n, _ := variedGood(xs); n != len(ks) {
		t.Fatalf("%d intervals of a·k+b fit, want %d", n, len(ks))
	}
	xs = xs[:0]
	for i, k := range ks {
		xs = append(xs, sized{k, uint64(200*k + i%3)}) // b ~ 1 within the scatter
	}
	if n, _ := variedGood(xs); n != 0 {
		t.Fatalf("%d intervals fit with no fixed part, want 0", n)
	}
}

func TestSameWork(t *testing.T) {
	// Eager steps (line 40) and then graph replays (line 50) both copy
	// one batch an interval; a checkpoint's reads (line 60) copy none.
	var s stream
	s.intervals(10, 5, 40, 4096)
	s.intervals(10, 0, 50, 4096)
	s.intervals(10, 0, 60)
	key := func(l int) string { return SiteOf(pyStack(l)).Key }
	if !SameWork(s.items, key(40), key(50), pid) {
		t.Fatal("the eager steps and the replays copy the same batch: want same work")
	}
	if SameWork(s.items, key(40), key(60), pid) {
		t.Fatal("a checkpoint's reads copy no batch: want no same work")
	}
}

func TestSameData(t *testing.T) {
	// Eager steps (line 40) and graph replays (line 50) copy an input
	// and a target an interval; an evaluation (line 70) copies the input
	// alone; a checkpoint's reads (line 60) copy nothing.
	var s stream
	s.intervals(10, 0, 40, 4096, 64)
	s.intervals(10, 0, 50, 4096, 64)
	s.intervals(10, 0, 70, 4096)
	s.intervals(10, 0, 60)
	key := func(l int) string { return SiteOf(pyStack(l)).Key }
	if !SameData(s.items, key(40), key(50), pid) {
		t.Fatal("the eager steps and the replays copy the same batch: want the same data")
	}
	if SameData(s.items, key(40), key(70), pid) {
		t.Fatal("the evaluation copies the input alone: want other data")
	}
	if SameData(s.items, key(60), key(60), pid) {
		t.Fatal("a checkpoint's reads copy no batch: want no data to compare")
	}
}

func TestUndecidedVariedMicroBatches(t *testing.T) {
	// The data picked 3 micro-batches in most of the first 15 steps and 2
	// in two: two counts, too few to fit a·k + b. No site is picked yet,
	// and the check says one may be (Undecided); with the counts the
	// later steps bring, the site is picked and nothing is undecided.
	first := []int{3, 2, 3, 3, 3, 3, 3, 3, 3, 3, 2, 3, 3, 3, 3}
	var s stream
	add := func(k int) {
		for m := 0; m < k; m++ {
			s.tok(4096)
		}
		s.call(pid, uint64(2*k+1), 10, 40)
	}
	for _, k := range first {
		add(k)
	}
	sc := Score(s.items)
	if p, ok := sc.Pick(pid); ok {
		t.Fatalf("15 steps of 2 or 3 micro-batches: picked %+v, want none yet", p)
	}
	if !sc.Undecided(pid) {
		t.Fatal("15 steps of 2 or 3 micro-batches: not undecided, want undecided")
	}
	for _, k := range ks {
		add(k)
	}
	sc = Score(s.items)
	if _, ok := sc.Pick(pid); !ok {
		t.Fatal("with 4, 5 and 6 micro-batches too: no pick, want the step's site")
	}
	if sc.Undecided(pid) {
		t.Fatal("picked, and still undecided")
	}
	// A loop whose every step holds 3 micro-batches varies in nothing.
	var same stream
	for range 15 {
		for m := 0; m < 3; m++ {
			same.tok(4096)
		}
		same.call(pid, 7, 10, 40)
	}
	if Score(same.items).Undecided(pid) {
		t.Fatal("3 micro-batches every step: undecided, want decided")
	}
}
