package correlate

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

func faultBurst(tid uint32, from, to int64, count uint64, path, fn string) event.Event {
	ev := event.Event{Kind: event.KindFaultRead, PID: 1, TID: tid, Start: from, End: to, Count: count, Path: path, FDKind: event.FDFile}
	if fn != "" {
		ev.Stack = []event.Frame{{Function: fn, File: "/job/train.py", Line: 20}}
	}
	return ev
}

// TestMappedReads: the span of a gap's thread's bursts of page faults on
// mapped files inside the gap moves from its cpu time
// to io.read, each file named (op fault, merged with the blocks in faults
// already there); a burst that straddles the gap's edge counts for the
// part of its span inside; the cause is picked again and, the gap reading
// mostly through faults, its stack is the faulting code's. Bursts before
// the gap, of other threads or of an unknown file move nothing.
func TestMappedReads(t *testing.T) {
	var s samples
	for _, ev := range []event.Event{
		faultBurst(7, 1000, 5000, 8, "/data/index.bin", "scan_index"),    // before the gap
		faultBurst(7, 12000, 16000, 30, "/data/index.bin", "scan_index"), // inside: 4000
		faultBurst(7, 17000, 17500, 1, "/data/other.bin", ""),            // inside, another file: 500
		faultBurst(7, 18000, 22000, 10, "/data/index.bin", "scan_index"), // half inside: 2000
		faultBurst(8, 12000, 16000, 30, "/data/index.bin", "scan_index"), // another thread
		faultBurst(7, 16000, 17000, 3, "", ""),                           // file unknown
	} {
		s.reads.add(&ev)
	}
	g := Gap{TID: 7, Start: 10000, End: 20000, Cause: CauseCPU, Breakdown: map[Cause]int64{CauseCPU: 8000, CauseIORead: 500},
		Evidence: Evidence{Files: []attribute.FileEvidence{{Path: "/data/index.bin", Op: "fault", Calls: 2, NS: 500}},
			Stack: []event.Frame{{Function: "cuCtxSynchronize"}}}}
	s.mappedReads(&g)
	if g.Breakdown[CauseIORead] != 7000 || g.Breakdown[CauseCPU] != 1500 || g.Cause != CauseIORead {
		t.Fatalf("breakdown %v cause %s, want io.read 7000, cpu 1500, cause io.read", g.Breakdown, g.Cause)
	}
	f := g.Evidence.Files
	if len(f) != 2 || f[0].Path != "/data/index.bin" || f[0].Op != "fault" || f[0].Calls != 2+30+5 || f[0].NS != 6500 ||
		f[1].Path != "/data/other.bin" || f[1].Calls != 1 || f[1].NS != 500 {
		t.Errorf("files %+v, want index.bin fault ×37 6500 ns, other.bin ×1 500 ns", f)
	}
	if len(g.Evidence.Stack) != 1 || g.Evidence.Stack[0].Function != "scan_index" {
		t.Errorf("stack %+v, want the faulting code's (scan_index)", g.Evidence.Stack)
	}

	// Faults beyond the gap's cpu (timed on another clock) move its cpu only.
	capped := Gap{TID: 7, Start: 10000, End: 20000, Cause: CauseCPU, Breakdown: map[Cause]int64{CauseCPU: 1000}}
	s.mappedReads(&capped)
	if capped.Breakdown[CauseIORead] != 1000 || capped.Breakdown[CauseCPU] != 0 || capped.Cause != CauseIORead {
		t.Errorf("capped: breakdown %v cause %s, want io.read 1000 and no cpu", capped.Breakdown, capped.Cause)
	}

	// A gap reading mostly with read(2) keeps that call's stack.
	reads := Gap{TID: 7, Start: 10000, End: 20000, Cause: CauseIORead, Breakdown: map[Cause]int64{CauseCPU: 8000, CauseIORead: 20000},
		Evidence: Evidence{Files: []attribute.FileEvidence{{Path: "/data/shard.tar", Op: "read", Calls: 4, NS: 20000}},
			Stack: []event.Frame{{Function: "load_shard"}}}}
	s.mappedReads(&reads)
	if reads.Breakdown[CauseIORead] != 26500 || reads.Evidence.Stack[0].Function != "load_shard" {
		t.Errorf("read gap: io.read %d stack %+v, want 26500 and load_shard kept", reads.Breakdown[CauseIORead], reads.Evidence.Stack)
	}

	other := Gap{TID: 7, Start: 30000, End: 40000, Cause: CauseCPU, Breakdown: map[Cause]int64{CauseCPU: 3000}}
	s.mappedReads(&other)
	if other.Breakdown[CauseCPU] != 3000 || len(other.Evidence.Files) != 0 || other.Cause != CauseCPU {
		t.Errorf("a gap without faults changed: %v %+v", other.Breakdown, other.Evidence.Files)
	}
}

// TestFaultReadIn: a burst's read time in a window is its span's part
// inside; a burst of one fault has no span to count.
func TestFaultReadIn(t *testing.T) {
	f := faultRead{from: 0, to: 10000, count: 40}
	for _, c := range []struct {
		a, b  int64
		ns    int64
		calls uint64
	}{{0, 10000, 10000, 40}, {5000, 20000, 5000, 20}, {10000, 20000, 0, 0}} {
		if ns, calls := f.readIn(c.a, c.b); ns != c.ns || calls != c.calls {
			t.Errorf("[%d, %d): %d ns %d faults, want %d %d", c.a, c.b, ns, calls, c.ns, c.calls)
		}
	}
	one := faultRead{from: 500, to: 500, count: 1}
	if ns, calls := one.readIn(0, 1000); ns != 0 || calls != 1 {
		t.Errorf("one fault: %d ns %d faults, want 0 1", ns, calls)
	}
}

// TestFaultReadWithin: a burst counts in a window for the share of its
// span inside; one of no span, wholly when it lies in the window.
func TestFaultReadWithin(t *testing.T) {
	f := faultRead{from: 100, to: 200}
	for _, c := range []struct {
		a, b int64
		frac float64
	}{{0, 1000, 1}, {150, 1000, 0.5}, {0, 120, 0.2}, {200, 300, 0}, {0, 100, 0}} {
		if got := f.within(c.a, c.b); got != c.frac {
			t.Errorf("[%d, %d): %v, want %v", c.a, c.b, got, c.frac)
		}
	}
	point := faultRead{from: 100, to: 100}
	if got := point.within(100, 101); got != 1 {
		t.Errorf("point burst in the window: %v, want 1", got)
	}
	if got := point.within(101, 200); got != 0 {
		t.Errorf("point burst before the window: %v, want 0", got)
	}
}

// TestAddFileNSBounded: files that fault alike are listed by path
// whatever order they came in, and no more of them than a gap's evidence
// holds (8, as Attribution.Result leaves it).
func TestAddFileNSBounded(t *testing.T) {
	ev := Evidence{Files: []FileEvidence{{Path: "/data/labels", Op: "read", Calls: 1, NS: 2000}}}
	for i := range 10 {
		addFileNS(&ev, FileEvidence{Path: fmt.Sprintf("/data/shard%02d", 9-i), Op: "fault", Calls: 1, NS: 1000})
	}
	var got []string
	for _, f := range ev.Files {
		got = append(got, f.Path)
	}
	want := []string{"/data/labels", "/data/shard00", "/data/shard01", "/data/shard02", "/data/shard03",
		"/data/shard04", "/data/shard05", "/data/shard06"}
	if !slices.Equal(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
}
