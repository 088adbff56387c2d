package correlate

import (
	"math/rand"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func readStall(s *gpuSim, d int64) {
	s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"}, d)
}

func TestStepDetection(t *testing.T) {
	type stepFn func(s *gpuSim, i int)
	oneSync := func(s *gpuSim, i int) { s.step(20, 2*ms, 100*us) }
	// forward (loss.item() sync), then backward + optimizer + batch copy
	// and the step's final sync: two syncs per step.
	twoSyncs := func(s *gpuSim, i int) {
		s.copyAsync(ms, 1)
		s.launches(10, 2*ms, 100*us)
		s.sync()
		s.launches(25, 2*ms, 100*us)
		s.sync()
	}
	threeSyncs := func(s *gpuSim, i int) {
		s.t += 800 * us // collate the next batch: a micro-gap (on-CPU, no syscall)
		s.launches(4, ms, 100*us)
		s.sync()
		s.launches(12, 2*ms, 100*us)
		s.sync()
		s.launches(6, ms, 50*us)
		s.collective(event.NCCLAllReduce, 2*ms)
		s.sync()
	}
	for _, tc := range []struct {
		name   string
		step   stepFn
		steps  int
		stalls map[int]int64 // step index -> stall before it
	}{
		{"one sync per step", oneSync, 40, nil},
		{"one sync per step with stalls", oneSync, 40, map[int]int64{9: 40 * ms, 17: 120 * ms, 18: 5 * ms, 30: 300 * ms}},
		{"two syncs per step with stalls", twoSyncs, 40, map[int]int64{11: 60 * ms, 25: 30 * ms}},
		{"three syncs per step", threeSyncs, 30, map[int]int64{14: 50 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			starts := make([]int64, 0, tc.steps)
			stallAt := map[int64]int{}
			for i := 0; i < tc.steps; i++ {
				starts = append(starts, s.t)
				if d, ok := tc.stalls[i]; ok {
					stallAt[s.t] = i
					readStall(s, d)
				}
				tc.step(s, i)
			}
			end := s.t
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			sum := feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			// Every true step boundary but the ones in the detection warm-up
			// is a step boundary, and no other boundary exists.
			var periodic []Step
			for _, st := range c.steps {
				if !st.Window {
					periodic = append(periodic, st)
				}
			}
			if len(periodic) < tc.steps-8 {
				t.Fatalf("%d periodic steps for %d true steps", len(periodic), tc.steps)
			}
			truth := map[int64]bool{}
			for _, a := range starts[1:] {
				truth[a] = true
			}
			truth[end] = true
			for _, st := range periodic[1:] { // the first starts at the first launch
				if !truthNear(truth, st.Start) || !truthNear(truth, st.End) {
					t.Errorf("step %d [%d,%d] is not on true boundaries", st.Number, st.Start-t0, st.End-t0)
				}
			}
			for i := 1; i < len(c.steps); i++ {
				if c.steps[i].Number != c.steps[i-1].Number+1 || c.steps[i].Start != c.steps[i-1].End {
					t.Errorf("steps %d and %d do not tile", c.steps[i-1].Number, c.steps[i].Number)
				}
			}
			// Each stall's gap is in the step that starts at it.
			nstall := 0
			for _, g := range bigGaps(c.gaps) {
				i, ok := stallAt[g.Start]
				if !ok {
					for a, j := range stallAt {
						if near(g.Start, a, 20*us) {
							i, ok = j, true
						}
					}
				}
				if !ok {
					t.Errorf("unexpected gap %+v", g)
					continue
				}
				nstall++
				var st *Step
				for k := range c.steps {
					if c.steps[k].Number == g.Step {
						st = &c.steps[k]
					}
				}
				if st == nil || !near(st.Start, starts[i], 20*us) {
					t.Errorf("stall before true step %d landed in step %+v", i, st)
				}
			}
			if nstall != len(tc.stalls) {
				t.Errorf("found %d of %d stalls", nstall, len(tc.stalls))
			}
			checkTotals(t, c, sum)
		})
	}
}

func truthNear(truth map[int64]bool, t int64) bool {
	for a := range truth {
		if near(a, t, 20*us) {
			return true
		}
	}
	return false
}

func TestFixedWindowsFallback(t *testing.T) {
	// A loop that never synchronises: launches only, with host stalls.
	s := newSim()
	for s.t < t0+5_500*ms {
		s.launches(50, 200*us, 300*us)
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	sum := feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	if len(c.steps) < 5 {
		t.Fatalf("%d windows", len(c.steps))
	}
	for i, st := range c.steps {
		if !st.Window {
			t.Errorf("step %d is not a window", st.Number)
		}
		if i < len(c.steps)-1 && st.End-st.Start != int64(DefaultStepWindow) {
			t.Errorf("window %d lasts %d", st.Number, st.End-st.Start)
		}
		if i < len(c.steps)-1 {
			truth := s.idle(st.Start, st.End)
			if !near(st.IdleNS, truth, truth/20) {
				t.Errorf("window %d idle %d, truth %d", st.Number, st.IdleNS, truth)
			}
			if st.ByCause[CauseCPU] != st.MicroIdleNS {
				t.Errorf("window %d micro not attributed to cpu: %v", st.Number, st.ByCause)
			}
		}
	}
	checkTotals(t, c, sum)
}

// TestLaunchBoundStepIdle is the accuracy target in miniature: in a
// launch-bound loop most idle is micro-gaps; per-step total idle (bounded
// + micro) must be within 5% of the truth.
func TestLaunchBoundStepIdle(t *testing.T) {
	s := newSim()
	var starts []int64
	for i := 0; i < 60; i++ {
		starts = append(starts, s.t)
		if i%10 == 9 {
			readStall(s, 25*ms)
		}
		s.launches(150, 60*us, 140*us) // GPU ~30% busy: launch-bound
		s.sync()
	}
	starts = append(starts, s.t)
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	sum := feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	// Every step the engine reports must be one of the loop's: it starts
	// and ends where the loop's steps do (at a sync's return).
	isStart := map[int64]bool{}
	for _, a := range starts {
		isStart[a] = true
	}
	checked := 0
	var totalErr, totalTruth int64
	for _, st := range c.steps {
		if st.Window {
			continue
		}
		if !truthNear(isStart, st.Start) || !truthNear(isStart, st.End) {
			t.Errorf("step %d [%d, %d] is not a step of the loop", st.Number, st.Start-t0, st.End-t0)
		}
		truth := s.idle(st.Start, st.End)
		checked++
		d := st.IdleNS - truth
		if d < 0 {
			d = -d
		}
		totalErr += d
		totalTruth += truth
		if float64(d) > 0.05*float64(truth) {
			t.Errorf("step %d idle %.2f ms, truth %.2f ms (micro %.2f, bounded %.2f)", st.Number,
				float64(st.IdleNS)/1e6, float64(truth)/1e6, float64(st.MicroIdleNS)/1e6, float64(st.BoundedIdleNS)/1e6)
		}
		if st.MicroIdleNS == 0 || st.ByCause[CauseCPU] < st.MicroIdleNS*9/10 {
			t.Errorf("step %d micro %d by cause %v", st.Number, st.MicroIdleNS, st.ByCause)
		}
	}
	if checked < 50 {
		t.Fatalf("only %d steps checked", checked)
	}
	t.Logf("%d steps, mean per-step |error| %.2f%% of idle", checked, 100*float64(totalErr)/float64(totalTruth))
	checkTotals(t, c, sum)
}

// TestSimtrainShape mirrors the simulated trainer: K launches round-robin
// on two streams, the batch copy on the legacy stream, one sync per
// stream, an io.read stall every 10 steps and a late collective (issued
// only in those steps) every 7.
func TestSimtrainShape(t *testing.T) {
	s := newSim()
	const streamB = 0x5a00
	var stallSteps, commSteps []int64
	var ends []int64
	for n := int64(1); n <= 60; n++ {
		if n%10 == 0 {
			stallSteps = append(stallSteps, n)
			readStall(s, 40*ms)
		}
		for i := 0; i < 8; i++ {
			if i%2 == 0 {
				s.stream = 0
			} else {
				s.stream = streamB
			}
			s.kernel(200 * us)
			s.t += 20 * us
		}
		s.stream = 0
		s.copyAsync(50*us, 0)
		if n%7 == 0 {
			commSteps = append(commSteps, n)
			s.collective(event.NCCLAllReduce, 30*ms)
		}
		s.sync()
		s.stream = streamB
		s.sync()
		s.stream = 0
		ends = append(ends, s.t)
		s.t += 100 * us // next batch
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	sum := feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	stepOf := map[int64]Step{}
	for _, st := range c.steps {
		stepOf[st.Number] = st
	}
	var reads, comms []Gap
	for _, g := range bigGaps(c.gaps) {
		switch g.Cause {
		case CauseIORead:
			reads = append(reads, g)
		case CauseComm:
			comms = append(comms, g)
		default:
			t.Errorf("unexpected gap %+v", g)
		}
	}
	if len(reads) != len(stallSteps) {
		t.Errorf("%d io.read gaps for %d stalls", len(reads), len(stallSteps))
	}
	for i, g := range reads {
		if i < len(stallSteps) && g.Step != stallSteps[i] {
			t.Errorf("io.read stall before step %d reported in step %d", stallSteps[i], g.Step)
		}
	}
	// Comm stalls need a locked period and four baseline steps first.
	if len(comms) < len(commSteps)-1 {
		t.Errorf("%d comm stalls for %d late collectives: %+v", len(comms), len(commSteps), comms)
	}
	for _, g := range comms {
		if g.Kind != GapStall || !near(g.Duration, 30*ms, 300*us) || g.Step%7 != 0 {
			t.Errorf("comm stall %+v", g)
		}
	}
	for n := int64(2); n <= 60; n++ {
		st, ok := stepOf[n]
		if !ok {
			t.Errorf("no step %d", n)
			continue
		}
		if !near(st.End, ends[n-1], 20*us) || st.Launches != 8 {
			t.Errorf("step %d ends %d (want %d), %d launches", n, st.End-t0, ends[n-1]-t0, st.Launches)
		}
	}
	checkTotals(t, c, sum)
}

func TestCheckpointStallStaysInItsStep(t *testing.T) {
	s := newSim()
	for i := 0; i < 30; i++ {
		if i == 20 {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile,
				Path: "/ckpt/step_20.pt"}, 8_000*ms)
		}
		s.step(20, 2*ms, 100*us)
	}
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 || big[0].Cause != CauseIOWrite {
		t.Fatalf("gaps %+v", big)
	}
	for _, st := range c.steps {
		if st.Window && st.Number > 1 {
			t.Errorf("step %d became a window", st.Number)
		}
		if st.Number == big[0].Step && (st.Gaps != 1 || st.BoundedIdleNS != big[0].Duration || st.End-st.Start < 8_000*ms) {
			t.Errorf("stall step %+v", st)
		}
	}
}

func TestEvalPhaseFallsBackToWindowsAndBack(t *testing.T) {
	s := newSim()
	for i := 0; i < 20; i++ {
		s.step(20, 2*ms, 100*us)
	}
	// 40 s of evaluation: launches, no syncs.
	evalStart := s.t
	for s.t < evalStart+40_000*ms {
		s.launches(50, 200*us, 100*us)
	}
	s.sync()
	for i := 0; i < 20; i++ {
		s.step(20, 2*ms, 100*us)
	}
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 100*ms, 0)
	var windows, after int
	for i, st := range c.steps {
		if i > 0 && st.Number != c.steps[i-1].Number+1 {
			t.Errorf("numbering jumps from %d to %d", c.steps[i-1].Number, st.Number)
		}
		if st.Window && st.Start >= evalStart {
			windows++
		}
		if !st.Window && st.Start > evalStart+40_000*ms {
			after++
		}
	}
	if windows < 5 || after < 10 {
		t.Errorf("%d windows in the eval phase, %d steps after it", windows, after)
	}
}

func TestProcessExitFlushes(t *testing.T) {
	// The trainer exits; the windows covering its last steps arrive 300 ms
	// later. Its steps wait for them, then the process is forgotten.
	s, _ := trainer(stallCases()[0].inject)
	exit := s.t + ms
	s.evs = append(s.evs, event.Event{Kind: event.KindExit, PID: s.pid, TID: s.pid, Start: exit, End: exit})
	wins := s.windows(t0, s.t+100*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	e := newEngine(c, nil)
	for _, ev := range s.evs {
		e.Event(ev)
	}
	j := 0
	for now := t0; now < exit+3e9; now += 50 * ms {
		for j < len(wins) && wins[j].End+300*ms <= now {
			e.Window(wins[j])
			j++
		}
		e.Advance(now)
	}
	if len(bigGaps(c.gaps)) != 1 || len(c.steps) < 20 {
		t.Fatalf("after exit: %d gaps, %d steps", len(bigGaps(c.gaps)), len(c.steps))
	}
	last := c.steps[len(c.steps)-1]
	if last.End != exit && last.End != s.t {
		t.Errorf("last step ends %d, exit at %d", last.End-t0, exit-t0)
	}
	if last.MicroIdleNS == 0 {
		t.Errorf("last step emitted before its windows: %+v", last)
	}
	if len(e.procs) != 1 || len(e.threads) != 0 { // the worker remains
		t.Errorf("state left: %d procs, %d threads", len(e.procs), len(e.threads))
	}
}

func TestMicroIgnoresParkedFeeder(t *testing.T) {
	// Thread 101 launched once (an autograd worker) and then parks in
	// futex waits while thread 100 runs a launch-bound loop with some
	// run-queue waits: micro idle is cpu and cpu.contention, never other.
	s := newSim()
	s.tid = 101
	s.kernel(100 * us)
	s.tid = 100
	for i := 0; i < 40; i++ {
		a := s.t
		for k := 0; k < 100; k++ {
			s.kernel(60 * us)
			if k%10 == 0 {
				s.block(event.Event{Kind: event.KindRunqueue}, 150*us)
			} else {
				s.t += 140 * us
			}
		}
		s.sync()
		s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: a, End: s.t - 50*us,
			Syscall: event.SysFutex, Name: "futex"})
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	sum := feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	if sum.ByCause[CauseOther] != 0 || sum.ByCause[CauseCPU] == 0 || sum.ByCause[CauseCPUContention] == 0 {
		t.Errorf("by cause %v", sum.ByCause)
	}
	share := float64(sum.ByCause[CauseCPUContention]) / float64(sum.GPUIdleNS)
	if share < 0.05 || share > 0.15 {
		t.Errorf("cpu.contention share %.2f, want ~0.08 (its share of the feeder's time)", share)
	}
	checkTotals(t, c, sum)
}

// TestLaunchBoundJitteryStepIdle: launch-bound steps of uneven length
// (random preemptions, launch jitter, read stalls), 200 ms NVML windows
// spanning ~15 steps each: per-step total idle within 5% of the truth.
func TestLaunchBoundJitteryStepIdle(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	s := newSim()
	for i := 0; i < 300; i++ {
		if i%10 == 9 {
			readStall(s, 30*ms)
		}
		for k := 0; k < 40; k++ {
			s.kernel(100 * us)
			if r.Intn(20) == 0 {
				s.block(event.Event{Kind: event.KindRunqueue}, int64(r.Intn(4000))*us+200*us)
			} else {
				s.t += 250*us + int64(r.Intn(100))*us
			}
		}
		s.sync()
	}
	wins := s.windows(t0, s.t+200*ms, 200*ms, event.SourceNVML, nil)
	c := &collect{}
	sum := feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	var errNS, truthNS int64
	within := 0
	steps := c.steps[1 : len(c.steps)-1]
	for _, st := range steps {
		truth := s.idle(st.Start, st.End)
		d := st.IdleNS - truth
		if d < 0 {
			d = -d
		}
		errNS += d
		truthNS += truth
		if float64(d) <= 0.05*float64(truth) {
			within++
		}
	}
	frac := float64(within) / float64(len(steps))
	t.Logf("%d steps: %.1f%% within 5%% of the true idle, time-weighted error %.2f%%", len(steps), 100*frac,
		100*float64(errNS)/float64(truthNS))
	if frac < 0.95 || float64(errNS) > 0.02*float64(truthNS) {
		t.Errorf("per-step idle accuracy too low")
	}
	checkTotals(t, c, sum)
}
