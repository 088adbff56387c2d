package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestLoaderWorkerActivity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ioNS   int64
		wantAc string
	}{{"io", 30 * ms, "io"}, {"cpu", 2 * ms, "cpu"}} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := trainer(func(s *gpuSim) {
				a := s.t
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysPoll, Name: "poll", WakerPID: workerPID, WakerTID: workerPID + 1}, stallNS)
				s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: workerPID, TID: workerPID + 1, Start: a + 2*ms,
					End: a + 2*ms + tc.ioNS, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/data/x.tfrecord"})
			})
			c := &collect{}
			e := newEngine(c, nil)
			feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
			big := bigGaps(c.gaps)
			if len(big) != 1 || big[0].Cause != CauseLoaderWait {
				t.Fatalf("gaps %+v", big)
			}
			w := big[0].Evidence.Workers
			if len(w) != 1 || w[0].Activity != tc.wantAc || !near(w[0].IONS, tc.ioNS, 10*us) {
				t.Errorf("workers %+v", w)
			}
		})
	}
}

func TestFutexOnSiblingThread(t *testing.T) {
	// The feeder waits on a futex; the pin-memory thread that wakes it was
	// itself waiting on a worker: one hop makes it loader.wait.
	s, _ := trainer(func(s *gpuSim) {
		a := s.t
		s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex", WakerPID: 100, WakerTID: 101}, stallNS)
		s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: a - ms, End: a + stallNS - 50*us,
			Syscall: event.SysRead, Name: "read", FDKind: event.FDPipe, WakerPID: workerPID, WakerTID: workerPID})
	})
	c := &collect{}
	e := newEngine(c, nil)
	feed(e, c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 || big[0].Cause != CauseLoaderWait {
		t.Fatalf("gaps %+v", big)
	}
	if big[0].Evidence.Syscalls["futex"] != 1 || big[0].Evidence.Syscalls["read"] != 1 {
		t.Errorf("syscalls %v", big[0].Evidence.Syscalls)
	}
}

func TestNestedSyscallBelongsToCUDACall(t *testing.T) {
	s, _ := trainer(func(s *gpuSim) {
		a := s.t
		s.block(event.Event{Kind: event.KindAlloc, CUDA: event.CUMemAlloc}, stallNS)
		s.evs = append(s.evs, event.Event{Kind: event.KindSyscall, PID: s.pid, TID: s.tid, Start: a + ms, End: a + 30*ms,
			Syscall: event.SysSleep, Name: "clock_nanosleep"})
	})
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 || big[0].Cause != CauseCUDAAlloc || big[0].Breakdown[CauseSleep] != 0 {
		t.Fatalf("gaps %+v", big)
	}
}

func TestUnseenWaker(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   event.Event
		want Cause
	}{
		{"pipe from an unseen process is a worker", event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read",
			FDKind: event.FDPipe, WakerPID: 555, WakerTID: 555}, CauseLoaderWait},
		{"futex from an unseen process is not", event.Event{Kind: event.KindSyscall, Syscall: event.SysFutex, Name: "futex",
			WakerPID: 555, WakerTID: 555}, CauseOther},
		{"loopback service peer is the network", event.Event{Kind: event.KindSyscall, Syscall: event.SysNet, Name: "recvfrom",
			FDKind: event.FDSocket, Path: "socket:[77]", PeerPID: workerPID, WakerPID: workerPID, WakerTID: workerPID}, CauseNet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := trainer(func(s *gpuSim) { s.block(tc.ev, stallNS) })
			c := &collect{}
			feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
			big := bigGaps(c.gaps)
			if len(big) != 1 || big[0].Cause != tc.want {
				t.Fatalf("gaps %+v", big)
			}
		})
	}
}

func TestReadLoopHolesAreRead(t *testing.T) {
	// 200 µs preads 30 µs apart (loop overhead, calls under the threshold),
	// then 2 ms of real computation: the holes are io.read, the 2 ms cpu.
	s, _ := trainer(func(s *gpuSim) {
		for i := 0; i < 100; i++ {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "pread64", FDKind: event.FDFile, Path: "/d"}, 200*us)
			s.t += 30 * us
		}
		s.t += 2 * ms
	})
	c := &collect{}
	feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("gaps %+v", big)
	}
	bd := big[0].Breakdown
	if !near(bd[CauseIORead], 100*230*us-30*us, 10*us) || !near(bd[CauseCPU], 2*ms+30*us, 20*us) {
		t.Errorf("breakdown %v", bd)
	}
	if big[0].Evidence.Files[0].Calls != 100 {
		t.Errorf("files %+v", big[0].Evidence.Files)
	}
}

// A sync that slept until the GPU was done and then waited for a CPU (a
// loaded host): the GPU idled from the wakeup, and that wait is
// cpu.contention, not time the GPU spent busy.
func TestSyncWokenThenWaitedForCPU(t *testing.T) {
	const late = 20 * ms
	var wake int64
	s, _ := trainer(func(s *gpuSim) {
		s.launches(20, 2*ms, 100*us)
		start := s.t
		wake = s.gpuFree
		run := wake + late
		end := run + 5*us
		s.evs = append(s.evs,
			event.Event{Kind: event.KindRunqueue, PID: s.pid, TID: s.tid, Start: wake, End: run, Woken: true},
			event.Event{Kind: event.KindSync, PID: s.pid, TID: s.tid, Start: start, End: end,
				CUDA: event.CUStreamSynchronize, Stream: s.stream, Count: s.pending[s.tid]})
		s.pending[s.tid] = 0
		s.flushed[s.tid] = false
		s.t = end
	})
	c := &collect{}
	e := newEngine(c, nil)
	wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
	sum := feed(e, c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	big := bigGaps(c.gaps)
	if len(big) != 1 {
		t.Fatalf("want 1 gap ≥1ms, got %d: %+v", len(big), big)
	}
	g := big[0]
	if !near(g.Start, wake, 50*us) || !near(g.Duration, late, 100*us) {
		t.Errorf("gap [%d,+%d], want [%d,+%d]: it starts at the wakeup", g.Start-t0, g.Duration, wake-t0, late)
	}
	if g.Cause != CauseCPUContention || g.Breakdown[CauseCPUContention] < late*9/10 {
		t.Errorf("cause %s breakdown %v, want cpu.contention", g.Cause, g.Breakdown)
	}
	checkTotals(t, c, sum)

	// The same run-queue wait without Woken (a preemption while spinning in
	// the sync) says nothing about when the GPU finished: no gap.
	for i := range s.evs {
		s.evs[i].Woken = false
	}
	c = &collect{}
	feed(newEngine(c, nil), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
	if big := bigGaps(c.gaps); len(big) != 0 {
		t.Errorf("a preemption inside a sync opened a gap: %+v", big)
	}
}

// A socket with a timeout (Python's http.client, requests, urllib3) waits in
// poll or select before each non-blocking recv: when the tracer names the
// socket the wait was on, the wait is the network, like a recv on it, with
// its peer. Other readiness waits keep their causes: a pipe to a data-loader
// worker is loader.wait, a unix socket is a local channel, a wait on fds the
// tracer did not resolve is judged by its waker as before.
func TestPollOnSockets(t *testing.T) {
	poll := func(ev event.Event) event.Event {
		ev.Kind, ev.Syscall = event.KindSyscall, event.SysPoll
		if ev.Name == "" {
			ev.Name = "poll"
		}
		return ev
	}
	for _, tc := range []struct {
		name string
		ev   event.Event
		want Cause
		peer PeerEvidence
	}{
		{"loopback service woke it", poll(event.Event{FD: 5, FDKind: event.FDSocket, Path: "socket:[77]", PeerAddr: "127.0.0.1:8080",
			PeerPID: workerPID, WakerPID: workerPID, WakerTID: workerPID}), CauseNet, PeerEvidence{Address: "127.0.0.1:8080", PID: workerPID}},
		{"remote peer", poll(event.Event{Name: "ppoll", FD: 5, FDKind: event.FDSocket, Path: "socket:[78]", PeerAddr: "10.0.0.5:443"}),
			CauseNet, PeerEvidence{Address: "10.0.0.5:443"}},
		{"select on a remote peer", poll(event.Event{Name: "pselect6", FD: 6, FDKind: event.FDSocket, Path: "socket:[79]",
			PeerAddr: "10.0.0.5:443", WakerPID: 555, WakerTID: 555}), CauseNet, PeerEvidence{Address: "10.0.0.5:443"}},
		{"socket closed before it was resolved", poll(event.Event{FD: 5, FDKind: event.FDSocket, WakerPID: workerPID, WakerTID: workerPID}),
			CauseNet, PeerEvidence{}},
		{"unix socket to a worker", poll(event.Event{FD: 5, FDKind: event.FDSocket, Path: "/run/q.sock", WakerPID: workerPID, WakerTID: workerPID}),
			CauseLoaderWait, PeerEvidence{}},
		{"pipe to a worker", poll(event.Event{FD: -1, WakerPID: workerPID, WakerTID: workerPID}), CauseLoaderWait, PeerEvidence{}},
		{"fds of several kinds", poll(event.Event{FD: -1, WakerPID: 555, WakerTID: 555}), CauseOther, PeerEvidence{}},
		{"epoll_wait", poll(event.Event{Name: "epoll_wait", FD: -1, WakerPID: 555, WakerTID: 555}), CauseOther, PeerEvidence{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := trainer(func(s *gpuSim) {
				// The loop of a socket with a timeout: a wait, a recv
				// too short to trace, the wait for the close, a recv.
				s.block(tc.ev, stallNS-300*us)
				s.t += 20 * us
				s.block(tc.ev, 260*us)
				s.t += 20 * us
			})
			c := &collect{}
			feed(newEngine(c, nil), c, s.evs, nil, s.t+2e9, 20*ms, 0)
			big := bigGaps(c.gaps)
			if len(big) != 1 || big[0].Cause != tc.want {
				t.Fatalf("gaps %+v", big)
			}
			g := big[0]
			if tc.want != CauseNet {
				return
			}
			if share := float64(g.Breakdown[CauseNet]) / float64(g.Duration); share < 0.98 {
				t.Errorf("net %.3f of the gap, want ≥ 0.98 (breakdown %v)", share, g.Breakdown)
			}
			if len(g.Evidence.Peers) != 1 || g.Evidence.Peers[0].Address != tc.peer.Address || g.Evidence.Peers[0].PID != tc.peer.PID ||
				g.Evidence.Peers[0].Calls != 2 {
				t.Errorf("peers %+v, want %+v in 2 calls", g.Evidence.Peers, tc.peer)
			}
		})
	}
}
