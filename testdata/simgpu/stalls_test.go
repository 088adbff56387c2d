package simgpu_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestStallCauses injects every cause and checks that each stall lasted M
// ms on the main thread: none shorter than 80% of M, and the median within
// ±20% of M once overshoot explained by run-queue wait (recorded from
// schedstat for the main thread and the serving worker) is excused. On a
// loaded machine a thread whose blocking call finished may wait
// milliseconds for a CPU; that time is real (the truth interval includes
// it) but it is the machine's load, not the simulator.
func TestStallCauses(t *testing.T) {
	const ms, steps, every = 40, 6, 1
	causes := []string{
		"io.read", "io.write", "net", "net:via=poll", "loader.wait", "loader.wait.io", "loader.wait.cpu",
		"comm", "cuda.memcpy", "cuda.alloc", "cpu", "cpu.contention", "sleep",
	}
	for _, spec := range causes {
		cause, opts, _ := strings.Cut(spec, ":")
		if opts != "" {
			opts = ":" + opts
		}
		t.Run(spec, func(t *testing.T) {
			if cause == "cpu.contention" && os.Geteuid() != 0 {
				t.Skip("cpu.contention needs SCHED_FIFO: run as root")
			}
			tr := runSimtrain(t, "--steps", strconv.Itoa(steps), "--kernels-per-step", "2",
				"--kernel-us", "50", "--stall", fmt.Sprintf("%s:every=%d:ms=%d%s", cause, every, ms, opts))
			if len(tr.stalls) != steps/every {
				t.Fatalf("got %d stalls, want %d", len(tr.stalls), steps/every)
			}
			var durs []float64
			for i, s := range tr.stalls {
				if s.Cause != cause || s.Step != every*(i+1) || s.Tid != tr.meta.Tid || s.Ms != ms {
					t.Errorf("bad stall record %+v (main tid %d)", s, tr.meta.Tid)
				}
				d := float64(s.End-s.Start) / 1e6
				eff := d
				if cause != "cpu.contention" {
					waited := float64(s.RunDelayNs+s.WorkerRunDelayNs) / 1e6
					eff -= min(waited, max(0, d-ms))
				}
				durs = append(durs, eff)
				// Too long only past what the run queue explains. A stall
				// that ends in a write's fsync ends when the disk says:
				// the median below judges its length.
				disk := cause == "io.write"
				if d < 0.8*ms || eff > 3*ms && !disk {
					t.Errorf("stall %d of %s lasted %.1f ms (%.1f ms not waiting for a CPU), want about %d", i, cause, d, eff, ms)
				}
				// The stall precedes its step (comm: it is the end of its step).
				st := tr.steps[s.Step-1]
				if cause == "comm" {
					if s.End != st.End || s.Start < st.Start {
						t.Errorf("comm stall [%d,%d] not at the end of step [%d,%d]", s.Start, s.End, st.Start, st.End)
					}
				} else if s.End > st.Start {
					t.Errorf("stall ends at %d after its step starts at %d", s.End, st.Start)
				}
			}
			slices.Sort(durs)
			if med := durs[len(durs)/2]; med < 0.8*ms || med > 1.2*ms {
				t.Errorf("median %s stall %.1f ms, want %d ±20%%: %v", cause, med, ms, durs)
			}
			checkCauseEvidence(t, spec, tr)
		})
	}
}

func checkCauseEvidence(t *testing.T, cause string, tr truth) {
	t.Helper()
	switch cause {
	case "io.read", "io.write":
		for _, s := range tr.stalls {
			if s.Bytes <= 0 {
				t.Errorf("%s stall moved no bytes: %+v", cause, s)
			}
		}
	case "net", "net:via=poll":
		want := "recv"
		if cause == "net:via=poll" {
			want = "poll"
		}
		if tr.stalls[0].ServerPid <= 0 || tr.stalls[0].Via != want {
			t.Errorf("net stall names no server pid or not via %s: %+v", want, tr.stalls[0])
		}
	case "loader.wait", "loader.wait.io", "loader.wait.cpu":
		for _, s := range tr.stalls {
			if !slices.Contains(tr.meta.Workers, s.Worker) {
				t.Errorf("stall names worker %d, not one of %v", s.Worker, tr.meta.Workers)
			}
		}
	case "comm":
		// No --collectives: each stalled step still runs exactly one.
		if n := len(tr.callsOf("collective")); n != len(tr.stalls) {
			t.Errorf("got %d collectives, want %d", n, len(tr.stalls))
		}
	case "cuda.memcpy":
		if n := len(tr.callsOf("memcpy")); n != len(tr.stalls) {
			t.Errorf("got %d memcpy calls, want %d", n, len(tr.stalls))
		}
	case "cuda.alloc":
		if a, f := len(tr.callsOf("alloc")), len(tr.callsOf("free")); a != len(tr.stalls) || f != a {
			t.Errorf("got %d alloc and %d free calls, want %d each", a, f, len(tr.stalls))
		}
	case "cpu.contention":
		// The kernel's own accounting: the main thread waited on a run
		// queue for (almost) the whole stall.
		for _, s := range tr.stalls {
			if d := s.End - s.Start; s.RunDelayNs < d*7/10 {
				t.Errorf("run-queue delay %.1f ms in a %.1f ms contention stall", float64(s.RunDelayNs)/1e6, float64(d)/1e6)
			}
		}
	}
}

// TestPageableAndCheckpointStalls: an async copy from pageable memory keeps
// the host for its bytes at SIMGPU_PAGEABLE_GBPS, one from pinned memory
// (the batch) does not; a checkpoint writes its tensors to a file; each
// truth record names the cause gaptrace should report.
func TestPageableAndCheckpointStalls(t *testing.T) {
	t.Setenv("SIMGPU_PAGEABLE_GBPS", "3")
	const ms, steps = 20, 4
	tr := runSimtrain(t, "--steps", strconv.Itoa(steps), "--kernels-per-step", "2", "--kernel-us", "50",
		"--batch-bytes", strconv.Itoa(64<<20), "--batch-copies", "1",
		"--stall", fmt.Sprintf("pageable:every=1:ms=%d", ms), "--stall", fmt.Sprintf("checkpoint:every=2:ms=%d", ms))
	var pageable, ckpt []record
	for _, s := range tr.stalls {
		switch s.Kind {
		case "pageable":
			pageable = append(pageable, s)
		case "checkpoint":
			ckpt = append(ckpt, s)
		default:
			t.Errorf("stall of kind %q: %+v", s.Kind, s)
		}
	}
	if len(pageable) != steps || len(ckpt) != steps/2 {
		t.Fatalf("%d pageable and %d checkpoint stalls, want %d and %d", len(pageable), len(ckpt), steps, steps/2)
	}
	for _, s := range pageable {
		d := float64(s.End-s.Start) / 1e6
		if s.Cause != "cuda.memcpy" || s.Direction != "htod" || s.Bytes != ms*3e6 || d < 0.8*ms || d > 3*ms {
			t.Errorf("pageable stall %+v lasted %.1f ms, want cuda.memcpy, htod, %d bytes, about %d ms", s, d, ms*3000000, ms)
		}
	}
	for _, s := range ckpt {
		d := float64(s.End-s.Start) / 1e6
		if s.Cause != "io.write" || s.Tensors != 12 || s.Bytes != 12*(2<<20) || !strings.HasSuffix(s.Path, "/simtrain-state.pt") || d < 0.8*ms {
			t.Errorf("checkpoint stall %+v lasted %.1f ms, want io.write, 12 tensors to simtrain-state.pt, at least %d ms", s, d, ms)
		}
	}
	// The batch comes from pinned memory: its 64 MiB copy returns at once
	// (staged at 3 GB/s it would keep the host 22 ms).
	var batch int
	for _, c := range tr.callsOf("copy") {
		if c.Bytes == 64<<20 {
			batch++
			if d := c.End - c.Start; d > 2e6 {
				t.Errorf("pinned batch copy kept the host %.1f ms", float64(d)/1e6)
			}
		}
	}
	if batch != steps {
		t.Errorf("%d batch copies, want %d", batch, steps)
	}
}

// TestCombinedStalls checks that several --stall flags apply in order.
func TestCombinedStalls(t *testing.T) {
	tr := runSimtrain(t, "--steps", "6", "--kernel-us", "50",
		"--stall", "sleep:every=2:ms=10", "--stall", "cpu:every=3:ms=10")
	var got []string
	for _, s := range tr.stalls {
		got = append(got, fmt.Sprintf("%d:%s", s.Step, s.Cause))
	}
	want := []string{"2:sleep", "3:cpu", "4:sleep", "6:sleep", "6:cpu"}
	if !slices.Equal(got, want) {
		t.Errorf("stalls %v, want %v", got, want)
	}
}

// TestStallAhead checks at=ahead: the stall runs inside its step, after
// every launch and before the sync, while the GPU drains the queue and then
// idles with no sync to tell the host.
func TestStallAhead(t *testing.T) {
	const kernels, kernelUS, ms = 4, 2000, 20
	tr := runSimtrain(t, "--steps", "10", "--kernels-per-step", fmt.Sprint(kernels),
		"--kernel-us", fmt.Sprint(kernelUS), "--launch-gap-us", "0",
		"--stall", fmt.Sprintf("sleep:every=5:ms=%d:at=ahead", ms), "--stall", "cpu:every=4:ms=5")
	if len(tr.meta.Stalls) != 2 || tr.meta.Stalls[0]["at"] != "ahead" || tr.meta.Stalls[1]["at"] != nil {
		t.Errorf("meta stalls %v: want at=ahead on the first only", tr.meta.Stalls)
	}
	var ahead []record
	for _, s := range tr.stalls {
		switch s.Cause {
		case "sleep":
			if s.At != "ahead" {
				t.Errorf("sleep stall without at=ahead: %+v", s)
			}
			ahead = append(ahead, s)
		case "cpu":
			if s.At != "" {
				t.Errorf("before-step stall carries at=%q", s.At)
			}
		}
	}
	if len(ahead) != 2 || ahead[0].Step != 5 || ahead[1].Step != 10 {
		t.Fatalf("ahead stalls %+v, want steps 5 and 10", ahead)
	}
	stepOf := map[int]record{}
	for _, st := range tr.steps {
		stepOf[st.Step] = st
	}
	launchEnd, syncStart := map[int]uint64{}, map[int]uint64{}
	for _, c := range tr.calls {
		switch c.What {
		case "launch_count":
			launchEnd[c.Step] = c.End
		case "sync":
			syncStart[c.Step] = c.Start
		}
	}
	for _, s := range ahead {
		st := stepOf[s.Step]
		if s.Start < launchEnd[s.Step] || s.End > syncStart[s.Step] || s.Start < st.Start || s.End > st.End {
			t.Errorf("ahead stall [%d,%d] not between the launches (end %d) and the sync (start %d) of step [%d,%d]",
				s.Start, s.End, launchEnd[s.Step], syncStart[s.Step], st.Start, st.End)
		}
		// The queue holds ~8 ms of kernels when the stall begins: the GPU
		// stays busy into the stall, then idles until it ends.
		var busyEnd uint64
		for _, b := range tr.busy {
			if b.Kind == "kernel" && b.Start < s.End && b.End > s.Start && b.End > busyEnd {
				busyEnd = b.End
			}
		}
		queued := uint64(kernels * kernelUS * 1000)
		if busyEnd <= s.Start || busyEnd > s.Start+queued {
			t.Errorf("stall [%d,%d]: kernels run until %d, want within %d ns of its start", s.Start, s.End, busyEnd, queued)
		}
		if idle := float64(s.End-busyEnd) / 1e6; idle < float64(ms)-float64(queued)/1e6-2 {
			t.Errorf("stall [%d,%d]: GPU idle only %.1f ms of it", s.Start, s.End, idle)
		}
	}
}
