package tracer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// copyAPIs are simtrain's --copy-api entry points in the order --copy-api
// all takes them, one per step.
var copyAPIs = []string{
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync", "cuMemcpyDtoDAsync_v2",
	"cuMemcpyPeerAsync", "cuMemcpy2DAsync_v2", "cuMemcpy3DAsync_v2", "cuMemsetD8Async",
	"cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
	"cuMemsetD2D32Async",
}

// TestSimtrainCopyAPIs drives every asynchronous copy and memset entry
// point (simtrain --copy-api all: one per step, steps alternating between
// the legacy default stream and a created one) and checks each decoded
// size and stream against the truth.
func TestSimtrainCopyAPIs(t *testing.T) { testCopyAPIs(t) }

// TestSimtrainCopyAPIsSingleUprobes does the same through the attach path
// of kernels without uprobe_multi (cookies per link, not per array slot).
func TestSimtrainCopyAPIsSingleUprobes(t *testing.T) {
	disableUprobeMulti = true
	defer func() { disableUprobeMulti = false }()
	testCopyAPIs(t)
}

func testCopyAPIs(t *testing.T) {
	// Two rounds: with two streams each entry point runs once on each.
	steps := 2 * len(copyAPIs)
	r := runSimtrain(t, ProbesFull, "--steps", fmt.Sprint(steps), "--kernels-per-step", "2",
		"--kernel-us", "300", "--streams", "2", "--workers", "0", "--copy-api", "all")
	main := r.meta.PID

	// Every probed async entry point and its per-thread-stream variant is
	// attached, and no driver symbol of the probe table is reported absent.
	for _, api := range copyAPIs {
		for _, sym := range []string{api, api + "_ptsz"} {
			if !r.probed(sym, "uprobe") {
				t.Errorf("%s not probed", sym)
			}
		}
	}
	for _, m := range r.stats.Missing {
		if strings.HasPrefix(m, libCUDA.String()) {
			t.Errorf("the simulated driver lacks a probed symbol: %s", m)
		}
	}

	truth := r.calls("copy")
	onDefault, onCreated := map[string]int{}, map[string]int{}
	for i, tr := range truth {
		if want := copyAPIs[i%len(copyAPIs)]; tr.API != want || tr.Step != i+1 {
			t.Fatalf("truth copy %d: %s at step %d, want %s at step %d", i, tr.API, tr.Step, want, i+1)
		}
		if tr.Stream == 0 {
			onDefault[tr.API]++
		} else {
			onCreated[tr.API]++
		}
	}
	if len(truth) != steps {
		t.Fatalf("truth has %d copies for %d steps", len(truth), steps)
	}
	for _, api := range copyAPIs {
		if onDefault[api] == 0 || onCreated[api] == 0 {
			t.Errorf("%s called %d times on the default stream and %d on a created one, want both", api, onDefault[api], onCreated[api])
		}
	}

	var evs []event.Event
	for _, ev := range r.events {
		if ev.TID == main && (ev.Kind == event.KindMemcpyAsync || ev.Kind == event.KindMemset) {
			evs = append(evs, ev)
		}
	}
	// Paired in order; each event inside its step (the call itself lasts
	// microseconds, too short to hold a timestamp on a loaded machine).
	stepOf := map[int]truthRec{}
	for _, rec := range r.truth {
		if rec.Type == "step" {
			stepOf[rec.Step] = rec
		}
	}
	inStep := func(ev event.Event, step int) bool {
		st, ok := stepOf[step]
		return ok && ev.Start >= mono(st.Start)-tolerance && ev.Start <= mono(st.End)+tolerance
	}
	if len(evs) != len(truth) {
		// Name the calls that left no event (or more than one).
		for _, tr := range truth {
			n := 0
			for _, ev := range evs {
				if inStep(ev, tr.Step) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s (step %d, stream %#x): %d events", tr.API, tr.Step, tr.Stream, n)
			}
		}
		t.Fatalf("%d async copy/memset events, truth has %d", len(evs), len(truth))
	}
	for i, tr := range truth {
		ev := evs[i]
		kind, fn := event.KindMemcpyAsync, event.CUMemcpyAsync
		if strings.HasPrefix(tr.API, "cuMemset") {
			kind, fn = event.KindMemset, event.CUMemsetAsync
		}
		if ev.Kind != kind || ev.CUDA != fn {
			t.Errorf("%s (step %d): event %v %v, want %v %v", tr.API, tr.Step, ev.Kind, ev.CUDA, kind, fn)
		}
		if ev.Bytes != tr.Bytes {
			t.Errorf("%s (step %d): decoded %d bytes, truth %d", tr.API, tr.Step, ev.Bytes, tr.Bytes)
		}
		if ev.Stream != tr.Stream {
			t.Errorf("%s (step %d): decoded stream %#x, truth %#x", tr.API, tr.Step, ev.Stream, tr.Stream)
		}
		if !inStep(ev, tr.Step) || ev.TID != tr.TID {
			st := stepOf[tr.Step]
			t.Errorf("%s (step %d): event at %d on tid %d, step [%d,%d] on tid %d", tr.API, tr.Step, ev.Start, ev.TID, mono(st.Start), mono(st.End), tr.TID)
		}
	}
}

// TestSimtrainStagedCopies: a copy from pageable memory that keeps the host
// is reported by the copy's return probe (full and lite), with the bytes,
// the direction and the entry's start; a pinned batch copy, which returns at
// once, is not; launches never get a return probe.
func TestSimtrainStagedCopies(t *testing.T) {
	for _, set := range []ProbeSet{ProbesFull, ProbesLite} {
		t.Run(string(set), func(t *testing.T) {
			r := runSimtrain(t, set, "--steps", "12", "--kernels-per-step", "4", "--kernel-us", "50",
				"--batch-copies", "1", "--batch-bytes", "1048576", "--stall", "pageable:every=3:ms=5")
			main := r.meta.PID
			var truth []truthRec
			for _, c := range r.calls("copy") {
				if c.Bytes > 4<<20 {
					truth = append(truth, c)
				}
			}
			if len(truth) != 4 {
				t.Fatalf("truth has %d pageable copies, want 4", len(truth))
			}
			// A pinned copy held inside the call on a loaded machine is
			// reported too: it kept the host. It must have been off a CPU
			// for all but the threshold, or the job's own clock must say
			// its call took that long (a virtual CPU the hypervisor
			// stopped is never off a CPU to the guest's scheduler).
			var pinned []truthRec
			for _, c := range r.calls("copy") {
				if c.Bytes <= 4<<20 {
					pinned = append(pinned, c)
				}
			}
			var staged []event.Event
			for _, ev := range r.kind(event.KindMemcpyStaged, main) {
				if ev.Bytes > 4<<20 {
					staged = append(staged, ev)
					continue
				}
				d := r.descheduled(ev.TID, ev.Start, ev.End)
				if ev.Duration()-d <= 200*int64(time.Microsecond)+tolerance {
					continue
				}
				measured := int64(-1)
				for _, c := range pinned {
					if c.Bytes == ev.Bytes && mono(c.Start) <= ev.Start+tolerance && mono(c.End) >= ev.End-tolerance {
						measured = c.End - c.Start
					}
				}
				if measured >= ev.Duration()-tolerance {
					t.Logf("pinned copy of %d bytes reported staged for %d ns, %d ns of it off a CPU; the job measured its call at %d ns",
						ev.Bytes, ev.Duration(), d, measured)
					continue
				}
				t.Errorf("pinned copy of %d bytes reported staged for %d ns, %d ns of it off a CPU; the job measured its call at %d ns (-1: no such call)",
					ev.Bytes, ev.Duration(), d, measured)
			}
			entries := map[int64]bool{}
			for _, ev := range r.kind(event.KindMemcpyAsync, main) {
				entries[ev.Start] = true
			}
			r.matchIntervals(t, "staged copy", staged, truth, func(ev event.Event, tr truthRec) {
				if ev.Bytes != tr.Bytes || ev.CUDA != event.CUMemcpyHtoD || ev.Stream != tr.Stream {
					t.Errorf("staged copy: bytes %d %v stream %#x, truth %d HtoD %#x", ev.Bytes, ev.CUDA, ev.Stream, tr.Bytes, tr.Stream)
				}
				if !entries[ev.Start] {
					t.Errorf("staged copy starting %d has no async copy entry at that time", ev.Start)
				}
				if len(ev.Stack) == 0 {
					t.Errorf("staged copy has no stack")
				}
			})
			for _, sym := range []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync"} {
				if !r.probed(sym, "uretprobe") {
					t.Errorf("%s has no return probe", sym)
				}
			}
			for _, p := range r.attached {
				if p.Kind == "uretprobe" && (strings.HasPrefix(p.Symbol, "cuLaunch") || strings.HasPrefix(p.Symbol, "cuMemset") ||
					strings.HasPrefix(p.Symbol, "cuMemcpyDtoDAsync") || strings.HasPrefix(p.Symbol, "cuMemcpyPeerAsync")) {
					t.Errorf("%s has a return probe", p.Symbol)
				}
			}
		})
	}
}
