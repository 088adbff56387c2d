package attribute

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/correlate/interval"
	"github.com/gaptrace/gaptrace/event"
)

// segmentsByCut is Segments as first written: every interval compared
// with every cut. The sweep must give the same segments.
func segmentsByCut(t *Thread, a, b int64, mask []interval.Span) []Segment {
	if b <= a {
		return nil
	}
	idx := t.Overlapping(a, b)
	pts := []int64{a, b}
	for _, i := range idx {
		if s := t.tl[i].Start; s > a {
			pts = append(pts, s)
		}
		if e := t.tl[i].End; e < b {
			pts = append(pts, e)
		}
	}
	for _, m := range mask {
		if m.A > a && m.A < b {
			pts = append(pts, m.A)
		}
		if m.B > a && m.B < b {
			pts = append(pts, m.B)
		}
	}
	slices.Sort(pts)
	var out []Segment
	mi := 0
	for k := 0; k+1 < len(pts); k++ {
		x, y := pts[k], pts[k+1]
		if y <= x {
			continue
		}
		for mi < len(mask) && mask[mi].B <= x {
			mi++
		}
		if mi < len(mask) && mask[mi].A <= x && mask[mi].B >= y {
			continue
		}
		var best *event.Event
		bp := 0
		for _, i := range idx {
			ev := &t.tl[i]
			if ev.Start <= x && ev.End >= y {
				if p := priority(ev); p > bp {
					best, bp = ev, p
				}
			}
		}
		if n := len(out); n > 0 && out[n-1].Ev == best && out[n-1].B == x {
			out[n-1].B = y
			continue
		}
		out = append(out, Segment{A: x, B: y, Ev: best})
	}
	return out
}

// randomThread: calls with waits for a CPU and syscalls nested in them,
// equal priorities overlapping, point events and kinds of no priority,
// all on a coarse clock so that ends and starts coincide.
func randomThread(rng *rand.Rand, n int) *Thread {
	kinds := []event.Kind{event.KindSync, event.KindRunqueue, event.KindSyscall, event.KindOffCPU,
		event.KindMemcpyStaged, event.KindEnqueue, event.KindCollective}
	th := NewThread(1, 1, nil)
	t0 := int64(0)
	for range n {
		t0 += rng.Int64N(8)
		ev := event.Event{Kind: kinds[rng.IntN(len(kinds))], Start: t0 - rng.Int64N(20)}
		ev.End = ev.Start + rng.Int64N(30)
		if rng.IntN(10) == 0 {
			ev.End = ev.Start
		}
		if len(th.tl) > 0 && ev.End < th.tl[len(th.tl)-1].End {
			th.Insert(&ev)
		} else {
			th.Add(&ev)
		}
	}
	return th
}

func TestSegmentsSweepMatchesCuts(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 300 {
		th := randomThread(rng, 1+rng.IntN(120))
		end := th.tl[len(th.tl)-1].End
		a := rng.Int64N(end+10) - 10
		b := a + rng.Int64N(end/2+20)
		var mask []interval.Span
		for m := a - 5; m < b; {
			m += rng.Int64N(40)
			w := rng.Int64N(15)
			mask = append(mask, interval.Span{A: m, B: m + w})
			m += w + 1
		}
		if rng.IntN(3) == 0 {
			mask = nil
		}
		got, want := th.Segments(a, b, mask), segmentsByCut(th, a, b, mask)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d, [%d,%d) mask %v:\n got  %v\n want %v", round, a, b, mask, got, want)
		}
	}
}

// BenchmarkSegments: one step's walk of a rank's main thread at its cap,
// waiting for a CPU every ~70 µs (8 ranks on 2 cores) with a sync every
// ~14 ms: a 20 ms step holds ~300 intervals.
func BenchmarkSegments(b *testing.B) {
	th := NewThread(1, 1, nil)
	for i := range int64(MaxIntervals) {
		t0 := i * 70_000
		if i%200 == 0 {
			th.Add(&event.Event{Kind: event.KindSync, Start: t0 - 1_000_000, End: t0 - 10_000})
		}
		th.Add(&event.Event{Kind: event.KindRunqueue, Start: t0, End: t0 + 20_000})
	}
	a := int64(MaxIntervals/2) * 70_000
	b.ReportAllocs()
	for b.Loop() {
		if segs := th.Segments(a, a+20_000_000, nil); len(segs) < 500 {
			b.Fatalf("%d segments", len(segs))
		}
	}
}
