package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// stagedCopy is an async copy from or to pageable memory: the host stays
// in the call for host ns (the tracer's return probe reports it), the copy
// engine's work does not make the GPU busy.
func (s *gpuSim) stagedCopy(dir event.CUDA, bytes uint64, host int64) {
	s.t += 5 * us
	s.evs = append(s.evs,
		event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
			CUDA: event.CUMemcpyAsync, CopyDir: dir, Stream: s.stream, Bytes: bytes},
		event.Event{Kind: event.KindMemcpyStaged, PID: s.pid, TID: s.tid, Start: s.t, End: s.t + host,
			CUDA: dir, CopyDir: dir, Stream: s.stream, Bytes: bytes})
	s.t += host
	s.flushed[s.tid] = false
}

// pinnedCopy is a copy from or to pinned memory: the call returns at once.
func (s *gpuSim) pinnedCopy(dir event.CUDA, bytes uint64) {
	s.t += 5 * us
	s.evs = append(s.evs, event.Event{Kind: event.KindMemcpyAsync, PID: s.pid, TID: s.tid, Start: s.t, End: s.t,
		CUDA: event.CUMemcpyAsync, CopyDir: dir, Stream: s.stream, Bytes: bytes})
}

func fileCall(class event.SyscallClass, name, path string, ret int64) event.Event {
	return event.Event{Kind: event.KindSyscall, Syscall: class, Name: name, FDKind: event.FDFile, Path: path, Ret: ret}
}

const ckptPath = "/ckpt/state.pt"

// checkpoint is torch.save of a CUDA state_dict of n tensors: per tensor a
// copy to pageable host memory and a sync, 2 ms of pickling and a write;
// then fsync.
func checkpoint(s *gpuSim, n int) { checkpointTo(s, n, ckptPath) }

func checkpointTo(s *gpuSim, n int, ckptPath string) {
	// Truncating a large old checkpoint makes the open slow. The tracer
	// reports every open as a KindOpen too (the fd's path), and a slow one
	// as a syscall on the timeline.
	s.evs = append(s.evs, event.Event{Kind: event.KindOpen, PID: s.pid, TID: s.tid, Start: s.t, End: s.t + 3*ms,
		Syscall: event.SysOpen, Name: "openat", Path: ckptPath, FD: 3, Ret: 3})
	s.block(fileCall(event.SysOpen, "openat", ckptPath, 3), 3*ms)
	for range n {
		s.stagedCopy(event.CUMemcpyDtoH, 2<<20, 350*us)
		s.sync()
		s.t += 2 * ms
		s.block(fileCall(event.SysWrite, "write", ckptPath, 2<<20), 600*us)
	}
	s.block(fileCall(event.SysFsync, "fsync", ckptPath, 0), 10*ms)
}

// runEpisodes traces 40 steps (batch copy, 8 kernels of 2 ms, sync) with
// stall before every 4th, in full and lite, and returns the gaps of at
// least 1 ms and where each stall was.
func runEpisodes(t *testing.T, lite bool, stall func(s *gpuSim)) ([]Gap, [][2]int64, int) {
	t.Helper()
	s := newSim()
	s.lite = lite
	var stalls [][2]int64
	for n := 1; n <= 40; n++ {
		if n%4 == 0 {
			a := s.t
			stall(s)
			stalls = append(stalls, [2]int64{a, s.t})
		}
		s.pinnedCopy(event.CUMemcpyHtoD, 1<<20)
		s.launches(8, 2*ms, 20*us)
		s.sync()
		s.t += 100 * us
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	feed(newEngine(c, func(cfg *Config) {
		if lite {
			cfg.Probes = ProbesLite
		}
	}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	return bigGaps(c.gaps), stalls, len(c.steps)
}

// TestPageableCopyEndsGapAtReturn: a 30 ms copy from pageable memory at the
// start of a step is one cuda.memcpy gap that lasts until the copy
// returned, with the copy's evidence and the fix, and the ordinary steps
// around it still end their gaps at the batch copy.
func TestPageableCopyEndsGapAtReturn(t *testing.T) {
	for _, lite := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "lite"}[lite]
		t.Run(name, func(t *testing.T) {
			gaps, stalls, steps := runEpisodes(t, lite, func(s *gpuSim) {
				s.stagedCopy(event.CUMemcpyHtoD, 180e6, 30*ms)
			})
			if len(gaps) != len(stalls) {
				t.Fatalf("%d gaps ≥ 1 ms, want one per stall (%d): %+v", len(gaps), len(stalls), gaps)
			}
			for i, g := range gaps {
				st := stalls[i]
				if g.Cause != CauseCUDAMemcpy {
					t.Errorf("gap %d: cause %s, want cuda.memcpy (breakdown %v)", i, g.Cause, g.Breakdown)
				}
				if g.Start > st[0] || g.End < st[1] || g.End > st[1]+50*us {
					t.Errorf("gap %d: [%d, %d], want it to cover the copy [%d, %d] and end at its return",
						i, g.Start-t0, g.End-t0, st[0]-t0, st[1]-t0)
				}
				c := g.Evidence.Copy
				if c == nil {
					t.Fatalf("gap %d: no copy evidence: %+v", i, g.Evidence)
				}
				if !c.Pageable || c.Direction != "htod" || c.Call != "cuMemcpyHtoDAsync" || c.Bytes != 180e6 ||
					c.NS != 30*ms || c.GBps < 5.9 || c.GBps > 6.1 || c.Fix != attribute.PageableFix {
					t.Errorf("gap %d: copy evidence %+v", i, *c)
				}
				if g.Evidence.CUDACall != "cuMemcpyHtoDAsync" {
					t.Errorf("gap %d: cuda call %q", i, g.Evidence.CUDACall)
				}
			}
			// Steps are not checked: the extra copy of every 4th step
			// makes its sync's signature differ, so the step clock may
			// count 4 trainer steps as one (a real loader copies every
			// step).
			_ = steps
		})
	}
}

// TestCheckpointIsOneGap: torch.save of 12 tensors is one io.write gap
// from the sync before it to the next step's batch copy, whatever copies
// and syncs it made, with the episode's parts as evidence.
func TestCheckpointIsOneGap(t *testing.T) {
	for _, lite := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "lite"}[lite]
		t.Run(name, func(t *testing.T) {
			gaps, stalls, steps := runEpisodes(t, lite, func(s *gpuSim) { checkpoint(s, 12) })
			if len(gaps) != len(stalls) {
				t.Fatalf("%d gaps ≥ 1 ms, want one per checkpoint (%d)", len(gaps), len(stalls))
			}
			for i, g := range gaps {
				st := stalls[i]
				if g.Start > st[0] || g.End < st[1] {
					t.Errorf("gap %d: [%d, %d] does not cover the checkpoint [%d, %d]", i, g.Start-t0, g.End-t0, st[0]-t0, st[1]-t0)
				}
				if g.Cause != CauseIOWrite {
					t.Errorf("gap %d: cause %s, want io.write (breakdown %v)", i, g.Cause, g.Breakdown)
				}
				// From the open of its file the operation is writing it:
				// the pickling, the first tensor's too, and the tensors'
				// copies to the host count as io.write (the episode's
				// evidence keeps the split).
				if g.Breakdown[CauseCPU] > 200*us || g.Breakdown[CauseIOWrite] < 45*ms || g.Breakdown[CauseCUDAMemcpy] > 200*us {
					t.Errorf("gap %d: breakdown %v", i, g.Breakdown)
				}
				e := g.Evidence.Episode
				if e == nil {
					t.Fatalf("gap %d: no episode evidence", i)
				}
				if e.Kind != "checkpoint" || e.File != ckptPath || e.Copies != 12 || e.CopyBytes != 12*(2<<20) ||
					e.Writes != 12 || e.WriteBytes != 12*(2<<20) || !near(e.FsyncNS, 10*ms, 10*us) ||
					!near(e.WriteNS, 12*600*us, 10*us) || e.SerializeNS < 24*ms || e.CopyNS < 12*350*us {
					t.Errorf("gap %d: episode %+v", i, *e)
				}
				if f := g.Evidence.Files; len(f) == 0 || f[0].Path != ckptPath {
					t.Errorf("gap %d: files %+v", i, f)
				}
				// The slow open is part of writing the file, not a read.
				opened := false
				for _, f := range g.Evidence.Files {
					opened = opened || f.Path == ckptPath && f.Op == "open" && f.NS == 3*ms
				}
				if !opened || g.Breakdown[CauseIORead] != 0 || g.Breakdown[CauseOther] != 0 {
					t.Errorf("gap %d: the open is not io.write: files %+v, breakdown %v", i, g.Evidence.Files, g.Breakdown)
				}
			}
			if steps < 35 {
				t.Errorf("%d steps, want the 40 the trainer ran (less warm-up)", steps)
			}
		})
	}
}

// TestStepCopyAndScalarReadEndGap: a step whose host reads a scalar right
// after its first kernel (a copy and a sync back to back, as in a
// checkpoint) is not an episode: the kernel between ends the gap at the
// batch copy, as before.
func TestStepCopyAndScalarReadEndGap(t *testing.T) {
	for _, lite := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "lite"}[lite]
		t.Run(name, func(t *testing.T) {
			s := newSim()
			s.lite = lite
			var copies []int64
			for n := 1; n <= 30; n++ {
				if n%4 == 0 {
					readStall(s, 20*ms)
				}
				s.pinnedCopy(event.CUMemcpyHtoD, 1<<20)
				copies = append(copies, s.t)
				s.kernel(2 * ms)
				s.pinnedCopy(event.CUMemcpyDtoH, 4)
				s.sync()
				s.launches(8, 2*ms, 20*us)
				s.sync()
				s.t += 100 * us
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			feed(newEngine(c, func(cfg *Config) {
				if lite {
					cfg.Probes = ProbesLite
				}
			}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			gaps := bigGaps(c.gaps)
			if len(gaps) < 6 {
				t.Fatalf("%d gaps ≥ 1 ms, want the read stalls", len(gaps))
			}
			ends := map[int64]bool{}
			for _, x := range copies {
				ends[x] = true
			}
			for _, g := range gaps {
				if g.Evidence.Episode != nil || g.Cause != CauseIORead || g.Duration > 21*ms {
					t.Errorf("gap [%d, %d] %s %v: want the read stall alone", g.Start-t0, g.End-t0, g.Cause, g.Evidence.Episode)
				}
				if !lite && !ends[g.End] {
					t.Errorf("gap ends at %d, not at a batch copy", g.End-t0)
				}
			}
		})
	}
}

// TestLiteTinyStepsStayApart: in lite a step of 16 batch copies and one
// short kernel looks like a copy and a sync that did not wait; its copies
// go to the device, so it is no episode and steps do not merge into one
// gap.
func TestLiteTinyStepsStayApart(t *testing.T) {
	s := newSim()
	s.lite = true
	for n := 1; n <= 200; n++ {
		if n%10 == 0 {
			readStall(s, 5*ms)
		}
		for range 16 {
			s.pinnedCopy(event.CUMemcpyHtoD, 64<<10)
		}
		s.kernel(1 * us)
		s.t += 60 * us
		s.sync()
		s.t += 50 * us
	}
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	c := &collect{}
	feed(newEngine(c, func(cfg *Config) { cfg.Probes = ProbesLite }), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	for _, g := range c.gaps {
		if g.Evidence.Episode != nil || g.Duration > 6*ms {
			t.Errorf("gap [%d, %d] %s episode %v: steps merged", g.Start-t0, g.End-t0, g.Cause, g.Evidence.Episode)
		}
	}
}

// TestScalarReadsInGapStayStepWork: .item() reads after the step's compute,
// 0–3 per step, the later ones after the first drained the queue, are step
// work: the step clock still finds every step at its last sync, and no gap
// is taken for a host operation.
func TestScalarReadsInGapStayStepWork(t *testing.T) {
	s := newSim()
	var ends []int64
	for n := int64(1); n <= 60; n++ {
		if n%5 == 0 {
			readStall(s, 20*ms)
		}
		s.pinnedCopy(event.CUMemcpyHtoD, 1<<20)
		s.launches(8, 2*ms, 20*us)
		for range (n*n*7 + n/3) % 4 {
			s.pinnedCopy(event.CUMemcpyDtoH, 4)
			s.sync()
		}
		s.sync()
		ends = append(ends, s.t)
		s.t += 100 * us
	}
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil), s.t+2e9, 20*ms, 250*ms)
	for _, g := range c.gaps {
		if g.Evidence.Episode != nil {
			t.Errorf("gap [%d, %d] holds an episode of scalar reads: %+v", g.Start-t0, g.End-t0, *g.Evidence.Episode)
		}
	}
	isEnd := map[int64]bool{}
	for _, e := range ends {
		isEnd[e] = true
	}
	matched := 0
	for _, st := range c.steps {
		if !st.Window && isEnd[st.End] {
			matched++
		}
	}
	if matched < 50 {
		t.Errorf("%d of 60 steps end at a step's last sync (%d steps)", matched, len(c.steps))
	}
}

// pathCall is a rename, unlink or truncate as the tracer reports it: the
// path it named, no fd.
func pathCall(name, path string) event.Event {
	ev := fileCall(event.SysWrite, name, path, 0)
	ev.FD = -1
	return ev
}

// TestCheckpointRenameIsWriting: a save to a temporary file renamed over
// the checkpoint (torch.save, fsync, os.replace) is writing until the
// rename returns; freeing the old file's blocks makes that milliseconds.
// A rename after the thread waited on something else is not the save's.
func TestCheckpointRenameIsWriting(t *testing.T) {
	const tmp = "/ckpt/.ckpt-x1"
	for _, lite := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "lite"}[lite]
		t.Run(name+"/rename after fsync", func(t *testing.T) {
			gaps, stalls, _ := runEpisodes(t, lite, func(s *gpuSim) {
				checkpointTo(s, 12, tmp)
				s.t += 80 * us // close, Python
				s.block(pathCall("rename", ckptPath), 4*ms)
			})
			if len(gaps) != len(stalls) {
				t.Fatalf("%d gaps ≥ 1 ms, want one per checkpoint (%d)", len(gaps), len(stalls))
			}
			for i, g := range gaps {
				st := stalls[i]
				if g.Cause != CauseIOWrite || g.Breakdown[CauseIOWrite] < st[1]-st[0]-200*us || g.Breakdown[CauseOther] != 0 || g.Breakdown[CauseCPU] > 200*us {
					t.Errorf("gap %d: cause %s, breakdown %v; want io.write through the rename (%d ns)", i, g.Cause, g.Breakdown, st[1]-st[0])
				}
				e := g.Evidence.Episode
				if e == nil || e.File != tmp || !near(e.WriteNS, 12*600*us+4*ms, 10*us) {
					t.Errorf("gap %d: episode %+v, want the writes of %s and the rename", i, e, tmp)
				}
				renamed := false
				for _, f := range g.Evidence.Files {
					renamed = renamed || f.Path == ckptPath && f.Op == "rename" && f.NS == 4*ms
				}
				if !renamed {
					t.Errorf("gap %d: files %+v, want the rename to %s", i, g.Evidence.Files, ckptPath)
				}
			}
		})
		t.Run(name+"/unlink after a wait", func(t *testing.T) {
			gaps, stalls, _ := runEpisodes(t, lite, func(s *gpuSim) {
				checkpointTo(s, 12, tmp)
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysPoll, Name: "poll", FD: -1}, 8*ms)
				s.block(pathCall("unlink", "/ckpt/old.pt"), 3*ms)
			})
			// The wait after the save is not writing: the save is one
			// gap, the wait (and the unlink after it) another.
			if len(gaps) != 2*len(stalls) {
				t.Fatalf("%d gaps ≥ 1 ms, want two per checkpoint (%d)", len(gaps), len(stalls))
			}
			for i, st := range stalls {
				save, wait := gaps[2*i], gaps[2*i+1]
				if save.Cause != CauseIOWrite || save.Start > st[0] || !near(save.End, st[1]-11*ms, 50*us) || save.Evidence.Episode == nil {
					t.Errorf("stall %d: save gap [%d, %d] %s, want io.write from %d to the fsync's end %d",
						i, save.Start-t0, save.End-t0, save.Cause, st[0]-t0, st[1]-11*ms-t0)
				}
				if wait.Start != save.End || wait.Cause != CauseOther || !near(wait.Breakdown[CauseOther], 8*ms, 50*us) ||
					!near(wait.Breakdown[CauseIOWrite], 3*ms, 50*us) {
					t.Errorf("stall %d: wait gap [%d, %d] %s %v, want other 8 ms then the unlink's 3 ms as io.write",
						i, wait.Start-t0, wait.End-t0, wait.Cause, wait.Breakdown)
				}
			}
		})
	}
}

// TestCheckpointPageFaultsStayInItsGap: on a machine short of memory the
// save pages its own code back in, before its file's open or after its
// fsync (8 ms blocked on a mapped file, outside any call). The fault is
// part of the operation's gap, not a gap of its own: lite, which cannot
// tell a fault inside a launch loop from one in a stall, takes it as the
// episode's activity.
func TestCheckpointPageFaultsStayInItsGap(t *testing.T) {
	fault := func(s *gpuSim) { s.block(event.Event{Kind: event.KindOffCPU, Path: "/usr/bin/python3.12"}, 8*ms) }
	for _, lite := range []bool{false, true} {
		for _, after := range []bool{false, true} {
			name := map[bool]string{false: "full", true: "lite"}[lite] + map[bool]string{false: "/before the open", true: "/after the fsync"}[after]
			t.Run(name, func(t *testing.T) {
				gaps, stalls, _ := runEpisodes(t, lite, func(s *gpuSim) {
					if !after {
						fault(s)
					}
					checkpoint(s, 12)
					if after {
						fault(s)
					}
				})
				if len(gaps) != len(stalls) {
					t.Fatalf("%d gaps ≥ 1 ms, want one per checkpoint (%d): %+v", len(gaps), len(stalls), gaps)
				}
				for i, g := range gaps {
					st := stalls[i]
					if g.Start > st[0] || g.End < st[1] || g.Cause != CauseIOWrite || g.Breakdown[CauseIORead] != 8*ms {
						t.Errorf("gap %d: [%d, %d] %s %v, want io.write over [%d, %d] with the 8 ms fault as io.read",
							i, g.Start-t0, g.End-t0, g.Cause, g.Breakdown, st[0]-t0, st[1]-t0)
					}
				}
			})
		}
	}
}

// TestCheckpointThenLockIsTwoGaps: the host saves a checkpoint, then waits
// 30 ms for a lock a sibling thread holds (a metrics thread holding the
// GIL): two causes back to back in one stretch of idle. The save is one
// io.write gap ending at its fsync, the wait a lock gap after it; one gap
// labelled by the larger would hide the other.
func TestCheckpointThenLockIsTwoGaps(t *testing.T) {
	const sib = 4242
	for _, lite := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "lite"}[lite]
		t.Run(name, func(t *testing.T) {
			var saved []int64
			gaps, stalls, _ := runEpisodes(t, lite, func(s *gpuSim) {
				// The sibling shows once (its name), then computes
				// holding the lock.
				s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: sib, Start: s.t, End: s.t + 10*us,
					Syscall: event.SysSleep, Name: "nanosleep", TaskComm: "bg-metrics"})
				checkpoint(s, 12)
				saved = append(saved, s.t)
				s.t += 300 * us // the Python between the two
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: s.pid, WakerTID: sib}, 30*ms)
			})
			if len(gaps) != 2*len(stalls) {
				t.Fatalf("%d gaps ≥ 1 ms, want two per stall (%d)", len(gaps), len(stalls))
			}
			for i, st := range stalls {
				save, wait := gaps[2*i], gaps[2*i+1]
				if save.Cause != CauseIOWrite || save.Start > st[0] || !near(save.End, saved[i], 50*us) {
					t.Errorf("stall %d: save [%d, %d] %s, want io.write to the fsync's end %d", i, save.Start-t0, save.End-t0, save.Cause, saved[i]-t0)
				}
				if wait.Cause != CauseLock || wait.Start != save.End || wait.End < st[1] || wait.Breakdown[CauseLock] < 30*ms {
					t.Errorf("stall %d: wait [%d, %d] %s %v, want lock to %d", i, wait.Start-t0, wait.End-t0, wait.Cause, wait.Breakdown, st[1]-t0)
				}
			}
		})
	}
}

// TestCheckpointAheadPinnedIsOneGap: a checkpoint taken with the step's
// work still queued (no sync before it) opens its file while the GPU
// computes; the first tensor's copy waits the queue out, and from there
// each tensor goes to pinned memory (the copy returns at once, its sync
// waits for the transfer: 400 µs for 4 MiB). One io.write gap per
// checkpoint from the queue's drain, its pickling counted as writing the
// file it opened before the gap (it was cpu until the first write), and
// in lite too, where a sync that waited for its copy's transfer split the
// operation into a gap per tensor.
func TestCheckpointAheadPinnedIsOneGap(t *testing.T) {
	for _, lite := range []bool{false, true} {
		t.Run(map[bool]string{false: "full", true: "lite"}[lite], func(t *testing.T) {
			s := newSim()
			s.lite = lite
			var stalls [][2]int64
			for n := 1; n <= 42; n++ {
				s.pinnedCopy(event.CUMemcpyHtoD, 1<<20)
				s.launches(8, 2*ms, 20*us)
				if n%4 != 0 {
					s.sync()
					s.t += 100 * us
					continue
				}
				s.evs = append(s.evs, event.Event{Kind: event.KindOpen, PID: s.pid, TID: s.tid, Start: s.t, End: s.t + 3*ms,
					Syscall: event.SysOpen, Name: "openat", Path: ckptPath, FD: 3, Ret: 3})
				s.block(fileCall(event.SysOpen, "openat", ckptPath, 3), 3*ms)
				var drained int64
				for i := range 8 {
					s.pinnedCopy(event.CUMemcpyDtoH, 4<<20)
					s.gpuFree = max(s.gpuFree, s.t) + 400*us // the transfer: no kernel runs
					s.sync()
					if i == 0 {
						drained = s.t
					}
					s.t += 2 * ms
					s.block(fileCall(event.SysWrite, "write", ckptPath, 4<<20), 600*us)
				}
				s.block(fileCall(event.SysFsync, "fsync", ckptPath, 0), 10*ms)
				stalls = append(stalls, [2]int64{drained, s.t})
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			feed(newEngine(c, func(cfg *Config) {
				if lite {
					cfg.Probes = ProbesLite
				}
			}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			for i, st := range stalls {
				var in []Gap
				for _, g := range bigGaps(c.gaps) {
					if g.End > st[0] && g.Start < st[1] {
						in = append(in, g)
					}
				}
				if len(in) != 1 {
					t.Errorf("checkpoint %d: %d gaps, want one", i, len(in))
					continue
				}
				g := in[0]
				if g.Cause != CauseIOWrite || g.Start > st[0]+50*us || g.End < st[1] {
					t.Errorf("checkpoint %d [%d, %d]: gap [%d, %d] %s", i, st[0]-t0, st[1]-t0, g.Start-t0, g.End-t0, g.Cause)
				}
				if g.Breakdown[CauseCPU] > 200*us || g.Evidence.Episode == nil || g.Evidence.Episode.Kind != "checkpoint" {
					t.Errorf("checkpoint %d: breakdown %v, episode %+v", i, g.Breakdown, g.Evidence.Episode)
				}
			}
		})
	}
}
