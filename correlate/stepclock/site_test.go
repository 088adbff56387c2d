package stepclock

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// A call stream as a trainer makes it, built line by line.
type stream struct{ items []Item }

func pyStack(lines ...int) []event.Frame {
	var st []event.Frame
	st = append(st, event.Frame{Function: "cuStreamSynchronize", File: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"})
	for _, l := range lines {
		st = append(st, event.Frame{Function: "main", File: "/job/train.py", Line: l})
	}
	return st
}

func (s *stream) call(tid uint32, launches uint64, lines ...int) {
	s.items = append(s.items, Item{Site: SiteOf(pyStack(lines...)), TID: tid, Launches: launches})
}

func (s *stream) tok(bytes uint64) {
	s.items = append(s.items, Item{Key: Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyHtoD, Bytes: bytes}})
}

// intervals adds n intervals of the main thread, each the tokens of
// toks' sizes and then a call at line with launches.
func (s *stream) intervals(n int, launches uint64, line int, toks ...uint64) {
	for i := 0; i < n; i++ {
		for _, b := range toks {
			s.tok(b)
		}
		s.call(pid, launches, line)
	}
}

const pid = 100

func TestPickSiteLossRead(t *testing.T) {
	// Eager loop: batch copy, launches, loss read at line 40; a metric
	// read every 5 iterations at line 44; a checkpoint copying 30 tensors
	// one by one at line 60 every 12 iterations; a background thread
	// saving at line 80 once an iteration.
	var s stream
	for i := 0; i < 60; i++ {
		s.tok(4096)
		s.call(pid, 50, 40, 100)
		if i%5 == 4 {
			s.call(pid, 0, 44, 100)
		}
		s.call(pid+1, 0, 80, 200)
		if i%12 == 11 {
			for k := 0; k < 30; k++ {
				s.call(pid, 0, 60, 100)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:40 main" || p.TID != pid || p.Pin != "train.py:40 main" {
		t.Fatalf("picked %+v %v, want train.py:40 on the main thread", p, ok)
	}
}

func TestPickSiteLiteNoLaunches(t *testing.T) {
	// Lite sees no launches: the batch copy token between loss reads is
	// the iteration's work; the checkpoint's copies have none.
	var s stream
	for i := 0; i < 40; i++ {
		s.tok(4096)
		s.tok(4096) // input and target of one size
		s.call(pid, 0, 40, 100)
		if i%10 == 9 {
			for k := 0; k < 50; k++ {
				s.call(pid, 0, 60, 100)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:40 main" {
		t.Fatalf("picked %+v %v, want train.py:40", p, ok)
	}
}

func TestPickSiteNoneEveryTenth(t *testing.T) {
	// The loop reads its loss every tenth iteration only: that site holds
	// ten iterations and must not clock steps; nothing else recurs.
	var s stream
	for i := 0; i < 200; i++ {
		s.tok(4096)
		if i%10 == 9 {
			s.call(pid, 500, 40, 100)
		}
	}
	if p, ok := PickSite(s.items, pid); ok {
		t.Fatalf("picked %+v, want none", p)
	}
}

func TestPickSiteCallerTellsApart(t *testing.T) {
	// One helper (line 10) syncs for the training step (called from line
	// 40) and for each evaluation batch (called from line 70, four
	// batches every 10 iterations): the caller tells them apart.
	var s stream
	for i := 0; i < 50; i++ {
		s.tok(4096)
		s.call(pid, 50, 10, 40)
		if i%10 == 9 {
			for k := 0; k < 4; k++ {
				s.tok(2048)
				s.call(pid, 20, 10, 70)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Key != SiteOf(pyStack(10, 40)).Key || p.Pin != "train.py:40 main" {
		t.Fatalf("picked %+v %v, want the helper as called from line 40, pinned there", p, ok)
	}
}

func TestPickSiteDeepSharedChain(t *testing.T) {
	// A fit loop logs its loss every step through four frames of its own
	// (log, update, sync, item: lines 13..10) from a callback (line 40),
	// and its validation logs each of 12 batches every 30 steps through
	// the same four frames from validation_step (line 70): only the fifth
	// frame tells them apart, and the validation's batches are no steps.
	var s stream
	train, val := []int{10, 11, 12, 13, 40, 90, 100}, []int{10, 11, 12, 13, 70, 91, 100}
	for i := 0; i < 90; i++ {
		s.tok(4096)
		s.call(pid, 4, train...)
		if i%30 == 29 {
			for k := 0; k < 12; k++ {
				s.tok(4096)
				s.call(pid, 1, val...)
			}
		}
	}
	if SiteOf(pyStack(train...)).Key == SiteOf(pyStack(val...)).Key {
		t.Fatalf("the training's and the validation's reads are one site %q", SiteOf(pyStack(train...)).Key)
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Key != SiteOf(pyStack(train...)).Key || p.Pin != "train.py:40 main" {
		t.Fatalf("picked %+v %v, want the chain as called from line 40, pinned there", p, ok)
	}
}

func TestPickSiteLastOfTwo(t *testing.T) {
	// Two reads an iteration: the later one ends it.
	var s stream
	for i := 0; i < 20; i++ {
		s.tok(4096)
		s.call(pid, 30, 40, 100)
		s.call(pid, 1, 41, 100)
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:41 main" {
		t.Fatalf("picked %+v %v, want train.py:41", p, ok)
	}
}

func TestSiteOfSystemOnly(t *testing.T) {
	st := []event.Frame{{Function: "cudaStreamSynchronize", File: "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13"},
		{Function: "copy_", File: "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so"}}
	if s := SiteOf(st); s.Key != "" {
		t.Fatalf("site %+v of library frames only, want none", s)
	}
}

func TestParseSpec(t *testing.T) {
	good := map[string]Spec{
		"train.py:142":                  {File: "train.py", Line: 142},
		"/job/src/train.py:7":           {File: "/job/src/train.py", Line: 7},
		"train_step":                    {Func: "train_step"},
		"Trainer.train_step":            {Func: "Trainer.train_step"},
		"ns::Loop::step":                {Func: "ns::Loop::step"},
		"_ZN4loop4stepEv":               {Func: "_ZN4loop4stepEv"},
		"simtrain.c:88":                 {File: "simtrain.c", Line: 88},
		"dir/with:colon/f.py:3":         {File: "dir/with:colon/f.py", Line: 3},
		"train.py:0001":                 {File: "train.py", Line: 1},
		"a:b":                           {Func: "a:b"},
		"step_fn_2":                     {Func: "step_fn_2"},
		"ns::f":                         {Func: "ns::f"},
		"Trainer.train_step.<locals>.f": {Func: "Trainer.train_step.<locals>.f"},
	}
	good["\trun_iteration "] = Spec{Func: "run_iteration"} // spaces around are trimmed
	for in, want := range good {
		got, err := ParseSpec(in)
		if err != nil || got != want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "  ", "train.py:", "train.py:0", ":12", "train py:3", "train.py", "src/train", "train.py:99999999999999999999"} {
		if s, err := ParseSpec(in); err == nil {
			t.Errorf("ParseSpec(%q) = %+v, want an error", in, s)
		}
	}
}

func TestSpecMatch(t *testing.T) {
	st := []event.Frame{
		{Function: "cuStreamSynchronize", File: "/usr/lib/libcuda.so.1"},
		{Function: "Trainer.train_step", File: "/job/src/train.py", Line: 42},
		{Function: "main", File: "/job/src/train.py", Line: 90},
	}
	for _, v := range []string{"train.py:42", "src/train.py:90", "/job/src/train.py:42", "train_step", "Trainer.train_step", "main"} {
		s, _ := ParseSpec(v)
		if _, ok := s.Match(st); !ok {
			t.Errorf("%s does not match", v)
		}
	}
	for _, v := range []string{"train.py:43", "ain.py:42", "step", "rain_step"} {
		s, _ := ParseSpec(v)
		if f, ok := s.Match(st); ok {
			t.Errorf("%s matches %+v", v, f)
		}
	}
}

func TestSiteOfNativeWithoutLines(t *testing.T) {
	st := []event.Frame{{Function: "cuStreamSynchronize", File: "/usr/lib/libcuda.so.1"}, {Function: "main", File: "/job/simtrain"}}
	if s := SiteOf(st); s.Key != "" {
		t.Fatalf("site %+v of a native frame without a line, want none", s)
	}
	st[1].Line, st[1].Source = 88, "/src/simtrain.c"
	if s := SiteOf(st); s.Name != "simtrain.c:88 main" {
		t.Fatalf("site %+v, want simtrain.c:88 main", s)
	}
}

func TestPickSiteRivalLoops(t *testing.T) {
	// An evaluation every 10 iterations runs 15 batches, each read at its
	// own line: more calls than the training's, apart from them. Where
	// the evaluation's batches launch as much as the training's
	// iterations, no pick: the stream alone cannot say which loop is the
	// iteration. Where they launch clearly less (a forward only, against
	// the training's forward, backward and optimizer), the training's
	// site is picked over it, whichever came first in the stream (an
	// attach during an evaluation).
	for _, c := range []struct {
		name       string
		evalL      uint64
		evalFirst  bool
		want, over string
	}{
		{"alike", 25, false, "", ""},
		{"forward only", 8, false, "train.py:97 main", "train.py:104 main<train.py:100 main"},
		{"forward only, attached mid-evaluation", 8, true, "train.py:97 main", "train.py:104 main<train.py:100 main"},
	} {
		var s stream
		eval := func() {
			for k := 0; k < 15; k++ {
				s.tok(1024)
				s.call(pid, c.evalL, 104, 100)
			}
		}
		if c.evalFirst {
			eval()
		}
		for i := 0; i < 60; i++ {
			s.tok(4096)
			s.call(pid, 27, 97, 100)
			if i%10 == 9 {
				eval()
			}
		}
		p, ok := PickSite(s.items, pid)
		if c.want == "" {
			if ok || p.Rival.Key == "" {
				t.Errorf("%s: picked %+v %v, want none with a rival", c.name, p, ok)
			}
			continue
		}
		if !ok || p.Site.Name != c.want || len(p.Over) != 1 || p.Over[0] != c.over {
			t.Errorf("%s: picked %+v %v, want %s over %s", c.name, p, ok, c.want, c.over)
		}
	}
}

func TestPickSiteCheckpointAsyncReads(t *testing.T) {
	// Lite: each tensor of a checkpoint is an async copy to the host and
	// a sync at line 264; the loop's loss read is at line 120.
	var s stream
	d2h := func(b uint64) {
		s.items = append(s.items, Item{Key: Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyDtoH, Bytes: b}})
	}
	for i := 0; i < 40; i++ {
		s.tok(4096)
		d2h(4)
		s.call(pid, 0, 120, 300)
		if i%4 == 3 {
			for k := 0; k < 8; k++ {
				d2h(uint64(1000 + k))
				s.call(pid, 0, 264, 300)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:120 main" {
		t.Fatalf("picked %+v %v, want train.py:120", p, ok)
	}
}

func TestPickSiteMicroBatches(t *testing.T) {
	// Four micro-batches an iteration, the loss read after each, the
	// optimizer's launches after the fourth: the read's site counts
	// micro-batches, so it is no step site.
	var s stream
	for i := 0; i < 40; i++ {
		s.tok(4096)
		n := uint64(20)
		if i%4 == 3 {
			n += 6
		}
		s.call(pid, n, 50, 100)
	}
	if p, ok := PickSite(s.items, pid); ok {
		t.Fatalf("picked %+v, want none", p)
	}
}

func TestPinInMovesOut(t *testing.T) {
	var s stream
	s.call(pid, 5, 10, 40)
	key := s.items[0].Site.Key
	if p := PinIn(s.items, key); p != "train.py:10 main" {
		t.Fatalf("pin %q alone, want the helper's line", p)
	}
	s.call(pid, 5, 10, 70) // the same helper, called from an evaluation
	if p := PinIn(s.items, key); p != "train.py:40 main" {
		t.Fatalf("pin %q beside another caller, want the loop's call", p)
	}
	if p := PinIn(s.items, "none"); p != "" {
		t.Fatalf("pin %q of a key not in the stream", p)
	}
}

func TestPickSiteOptimizerStepEnclosesMicroBatches(t *testing.T) {
	// Four micro-batches a step, each copying its batch and reading its
	// loss at line 50; then the optimizer's launches and an event wait at
	// line 70; every 15 steps an evaluation of 10 batches at line 90. The
	// update's site is the step: its intervals hold the batch copy four
	// times, one per micro-batch read, not a read every fourth iteration.
	var s stream
	for i := 0; i < 30; i++ {
		for k := 0; k < 4; k++ {
			s.tok(1 << 20)
			s.call(pid+1, 3, 50, 100)
		}
		s.call(pid+1, 2, 70, 100)
		if i%15 == 14 {
			for k := 0; k < 10; k++ {
				s.tok(1 << 20)
				s.call(pid+1, 1, 90, 100)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:70 main" || p.TID != pid+1 {
		t.Fatalf("picked %+v %v, want the update's train.py:70", p, ok)
	}
	if !Qualifies(s.items, p.Site.Key, p.TID) {
		t.Fatal("the picked update site does not qualify on the same stream")
	}
}

func TestPickSiteMetricEveryNthNotEnclosing(t *testing.T) {
	// A loss read every iteration at line 40, launches alike each time,
	// and a metric read every fourth at line 44: the metric's site holds
	// four iterations, and no micro-batches tell it is an optimizer step.
	var s stream
	for i := 0; i < 60; i++ {
		s.tok(4096)
		s.call(pid, 20, 40, 100)
		if i%4 == 3 {
			s.call(pid, 0, 44, 100)
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:40 main" {
		t.Fatalf("picked %+v %v, want train.py:40", p, ok)
	}
}

func TestPickSiteBareGraphReplays(t *testing.T) {
	// Lite does not see a CUDA graph's replays: the loss copy (line 75)
	// and sync (line 76) of the main thread show nothing between them; a
	// saver thread copies twelve tensors every 20 iterations. The main
	// thread's one loop is the step site.
	var s stream
	for i := 0; i < 80; i++ {
		s.call(pid, 0, 75, 100)
		s.call(pid, 0, 76, 100)
		if i%20 == 19 {
			for k := 0; k < 12; k++ {
				s.items = append(s.items, Item{Key: Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyDtoH, Bytes: 4 << 20}})
				s.call(pid+1, 0, 40, 200)
			}
		}
	}
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:76 main" || p.TID != pid {
		t.Fatalf("picked %+v %v, want train.py:76 on the main thread", p, ok)
	}
}

func TestPickSiteBareTwoLoopsNone(t *testing.T) {
	// Nothing seen between calls, and the main thread runs two loops: the
	// loss read at line 130 and a checkpoint's per-tensor copies at line
	// 71 every 25 iterations. The stream cannot tell which is the
	// training's: no pick.
	var s stream
	for i := 0; i < 100; i++ {
		s.call(pid, 0, 130, 100)
		if i%25 == 24 {
			for k := 0; k < 48; k++ {
				s.call(pid, 0, 71, 100)
			}
		}
	}
	if p, ok := PickSite(s.items, pid); ok {
		t.Fatalf("picked %+v, want none", p)
	}
}

func TestMicroBatchesDespiteOutliers(t *testing.T) {
	// Four micro-batches, the optimizer's launches in the fourth interval;
	// one stall lost a count and one evaluation added launches elsewhere.
	var l []uint64
	for i := 0; i < 40; i++ {
		n := uint64(3)
		if i%4 == 3 {
			n = 5
		}
		l = append(l, n)
	}
	l[7], l[13] = 2, 13
	if g := microBatches(l); g != 4 {
		t.Fatalf("microBatches = %d, want 4", g)
	}
	flat := make([]uint64, 40)
	for i := range flat {
		flat[i] = 3
	}
	flat[9] = 7
	if g := microBatches(flat); g != 0 {
		t.Fatalf("microBatches of a flat loop = %d, want 0", g)
	}
}

func TestPickSiteNoneScalarReadsSomeSteps(t *testing.T) {
	// Scalar reads at line 50, made 0, 1 or 2 times a step after some
	// launches; each step ends with a sync per stream at line 70 (three
	// calls in a row, no work between). The reads recur about once a
	// step, but intervals within a step hold launches only while those
	// across steps hold the batch copies: they are no iteration.
	var s stream
	for i := 0; i < 90; i++ {
		s.tok(4096)
		s.tok(2048)
		for k := 0; k < (i*7+i/3)%3; k++ {
			s.call(pid, 3, 50, 100)
		}
		for k := 0; k < 3; k++ {
			s.call(pid, 0, 70, 100)
		}
	}
	if p, ok := PickSite(s.items, pid); ok && p.Site.Name == "train.py:50 main" {
		t.Fatalf("picked the scalar read %+v", p)
	}
}

// TestSiteWeights: each recurring site's launches an iteration, over the
// intervals that hold one iteration and launches seen: the training's
// loss read 27, the evaluation's batch read 8 (the interval that spans
// the other loop counts for neither); lite, no launch seen, no weight.
func TestSiteWeights(t *testing.T) {
	for _, launches := range []uint64{27, 0} {
		var s stream
		for i := 0; i < 40; i++ {
			s.tok(4096)
			s.call(pid, launches, 97, 100)
			if i%10 == 9 {
				for k := 0; k < 15; k++ {
					s.tok(1024)
					s.call(pid, launches*8/27, 104, 100)
				}
			}
		}
		w := Weights(s.items)
		train, eval := w[SiteID(pid, s.items[1].Site.Key)], w[SiteID(pid, "train.py:104 main<train.py:100 main")]
		if launches == 0 {
			if len(w) != 0 {
				t.Errorf("no launch seen: weights %v, want none", w)
			}
			continue
		}
		if train != 27 || eval != 8 || Heavier(train, eval) != 1 || Heavier(eval, train) != -1 || Heavier(27, 25) != 0 {
			t.Errorf("weights %v: training %v, evaluation %v, want 27 and 8, the training heavier", w, train, eval)
		}
	}
}

func TestPickSiteOptimizerStepOnceGroupsKnown(t *testing.T) {
	// A trainer thread: four micro-batches an optimizer step, each
	// copying its batch and reading its loss at line 50 (three
	// launches), then the optimizer's two launches and an event wait at
	// line 70. Once the micro-batch reads' launches show the grouping
	// (three groups), the update's site clocks with three runs: the
	// batch copy's clock would count micro-batches meanwhile.
	var s stream
	update := func(n int) {
		for i := 0; i < n; i++ {
			for k := 0; k < 4; k++ {
				s.tok(1 << 20)
				s.call(pid+1, 3, 50, 100)
			}
			s.call(pid+1, 2, 70, 100)
		}
	}
	update(4)
	p, ok := PickSite(s.items, pid)
	if !ok || p.Site.Name != "train.py:70 main" || p.Groups != 3 {
		t.Fatalf("picked %+v %v after four optimizer steps, want train.py:70 with 3 groups", p, ok)
	}
	if !Qualifies(s.items, p.Site.Key, p.TID) {
		t.Fatal("the update's site does not qualify on the stream it was picked from")
	}
}

func TestPickSiteFewRunsWithoutGroups(t *testing.T) {
	// Three runs of a loss read alone are too few: only a site that
	// encloses micro-batch reads clocks that early.
	var s stream
	for i := 0; i < 4; i++ {
		s.tok(1 << 20)
		s.call(pid, 12, 40, 100)
	}
	if p, ok := PickSite(s.items, pid); ok {
		t.Fatalf("picked %+v after three runs, want none", p)
	}
}

func TestWeightsAfterLaunchesStop(t *testing.T) {
	// Auto's full window ends as the stream begins: the micro-batch
	// read's first intervals saw launches, then lite sees none. The
	// update's site, called only after launches stopped, does not weigh
	// 0 (the rule for a checkpoint's per-tensor copies): it would give
	// way to the read.
	var s stream
	for i := 0; i < 40; i++ {
		for k := 0; k < 4; k++ {
			s.tok(1 << 20)
			n := uint64(0)
			if i == 0 {
				n = 3
			}
			s.call(pid+1, n, 50, 100)
		}
		s.call(pid+1, 0, 70, 100)
	}
	// The first update call after the full window's reads.
	s.items = s.items[2:]
	w := Weights(s.items)
	if v, ok := w[SiteID(pid+1, "train.py:70 main<train.py:100 main")]; ok {
		t.Fatalf("update site weighs %v with no launch seen after its first call, want unknown", v)
	}
}

func TestWeightsOptimizerStepGroup(t *testing.T) {
	// An optimizer step's site weighs its whole group of micro-batches.
	var s stream
	for i := 0; i < 12; i++ {
		for k := 0; k < 4; k++ {
			s.tok(1 << 20)
			s.call(pid+1, 3, 50, 100)
		}
		s.call(pid+1, 2, 70, 100)
	}
	w := Weights(s.items)
	if v := w[SiteID(pid+1, "train.py:70 main<train.py:100 main")]; v != 14 {
		t.Fatalf("update site weighs %v, want 14 (four micro-batches of 3, then 2)", v)
	}
}
