package correlate

import (
	"log/slog"

	"github.com/gaptrace/gaptrace/event"
)

// What the external tests (package correlate_test: those that replay
// through correlate/record, which imports this package) take from the
// internal ones' simulator.

// T0 is when the simulated runs start, Ms a millisecond in ns.
const (
	T0 = t0
	Ms = ms
)

// Quiet is a logger that discards.
func Quiet() *slog.Logger { return quiet() }

// AutoRun is a lite loop, then six steps at full (from on to off, auto's
// window) with a read stall in the third: its events in order.
func AutoRun() (evs []event.Event, on, off, end int64) {
	s := newSim()
	s.lite = true
	for i := 0; i < 10; i++ {
		s.launches(20, 2*ms, 100*us)
		s.copyAsync(ms, 1)
		s.sync()
	}
	on = s.t
	s.lite = false
	for i := 0; i < 6; i++ {
		s.launches(20, 2*ms, 100*us)
		s.sync()
		if i == 2 {
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"}, stallNS)
		}
	}
	return s.evs, on, s.t, s.t
}

// RankRun is a job of two ranks (pids 100 and 101, devices 0 and 1) whose
// communicator was created before tracing began, rank 1 late by 30 ms in
// each of 12 steps: each rank's events and the job's end.
func RankRun() (ranks [][]event.Event, pids []uint32, end int64) {
	j := unseenJob(2, 100, 0)
	j.run(12, lateRank1)
	for _, s := range j.ranks {
		ranks = append(ranks, s.evs)
		pids = append(pids, s.pid)
	}
	return ranks, pids, j.ranks[0].t
}
