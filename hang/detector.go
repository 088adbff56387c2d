package hang

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// DefaultAfter is how long a call must be in flight, without progress,
// before it is a hang.
const DefaultAfter = 2 * time.Minute

// Snapshot is the world at one tick.
type Snapshot struct {
	Now int64 // Unix ns
	// Calls in flight on traced threads.
	Calls []Call
	// Progress: per process, the latest time any of its threads enqueued
	// work or returned from a CUDA call (Unix ns; 0: never seen).
	Progress map[uint32]int64
	// Procs: the state of every process traced here, live or exited, and
	// of those other sidecars report.
	Procs map[uint32]Proc
	// Ranks: per process (local or remote), its rank and last collective
	// on each communicator it uses.
	Members []Member
	// Rank: a local process's rank where its environment or a
	// communicator says it (absent: unknown).
	Rank map[uint32]int32
	Host string
	// Connected: per process with a long call, the traced processes at
	// the other end of its sockets (a rank's peers over gloo or TCP).
	Connected map[uint32][]uint32
}

// Detector keeps the hangs in progress between ticks. Not safe for
// concurrent use: one goroutine ticks it.
type Detector struct {
	After  time.Duration
	active map[Key]*Report
	seq    int
}

// New returns a detector with threshold after (DefaultAfter when <= 0).
func New(after time.Duration) *Detector {
	if after <= 0 {
		after = DefaultAfter
	}
	return &Detector{After: after, active: map[Key]*Report{}}
}

// Check compares a snapshot with the hangs in progress: started are the
// hangs found now, ended those whose call returned or whose process went.
// Ongoing ones are updated in place (Seconds) and listed by Active.
func (d *Detector) Check(s Snapshot) (started, ended []*Report) {
	seen := map[Key]bool{}
	for i := range s.Calls {
		c := &s.Calls[i]
		if !d.stuck(c, s) {
			continue
		}
		k := c.key()
		seen[k] = true
		if r := d.active[k]; r != nil {
			r.Seconds = seconds(s.Now - r.Since)
			d.describe(r, s) // the peers' states move on
			continue
		}
		d.seq++
		r := &Report{Kind: "hang", ID: fmt.Sprintf("hang-%d-%d-%d", c.PID, c.TID, d.seq), Status: Ongoing,
			PID: c.PID, TID: c.TID, Rank: -1, Host: s.Host, Call: *c, Since: c.Since, Detected: s.Now,
			Seconds: seconds(s.Now - c.Since)}
		if rk, ok := s.Rank[c.PID]; ok {
			r.Rank = rk
		}
		d.describe(r, s)
		d.active[k] = r
		started = append(started, r)
	}
	for k, r := range d.active {
		if seen[k] {
			continue
		}
		delete(d.active, k)
		r.Status, r.End = Ended, s.Now
		r.Seconds = seconds(r.End - r.Since)
		ended = append(ended, r)
	}
	slices.SortFunc(ended, func(a, b *Report) int { return strings.Compare(a.ID, b.ID) })
	return started, ended
}

// Active lists the hangs in progress.
func (d *Detector) Active() []*Report {
	out := make([]*Report, 0, len(d.active))
	for _, r := range d.active {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Report) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// stuck is whether the call has been in flight at least After with no
// progress of its process.
func (d *Detector) stuck(c *Call, s Snapshot) bool {
	if c.Since <= 0 || s.Now-c.Since < int64(d.After) {
		return false
	}
	if c.Kind == Syscall && !c.Feeder {
		return false
	}
	// A stopped process waits on nothing: it is what its peers wait on,
	// and their reports name it.
	if s.Procs[c.PID].State == StateStopped {
		return false
	}
	// Another thread of the process moved the GPU on since the call
	// began: the process is slow here, not stuck.
	return s.Progress[c.PID] <= c.Since
}

// describe fills a report's collective view and reason from the snapshot.
func (d *Detector) describe(r *Report, s Snapshot) {
	c := r.Call.Collective
	r.Arrived, r.Missing, r.Untraced = nil, nil, nil
	if c != nil && c.Ranks > 1 {
		r.Arrived, r.Missing, r.Untraced = split(c, r.PID, s)
		if r.Rank < 0 {
			r.Rank = c.Rank
		}
	} else if c == nil {
		r.Missing = socketPeers(r, s)
	}
	r.Reason = reason(r)
}

// split sorts the ranks of the collective's communicator into those that
// issued it and those that did not. A rank is matched by its number among
// the members with communicators of the same size; the waiting process is
// always among those arrived.
func split(c *Collective, waiter uint32, s Snapshot) (arrived, missing []Member, untraced []int32) {
	byRank := map[int32]Member{}
	for _, m := range s.Members {
		if m.Ranks != c.Ranks || m.Rank < 0 || m.Rank >= c.Ranks {
			continue
		}
		if old, ok := byRank[m.Rank]; ok && old.Seq >= m.Seq && old.PID != waiter {
			continue // a restarted rank's earlier process, say
		}
		if p, ok := s.Procs[m.PID]; ok && m.Sidecar == p.Sidecar {
			m.Proc = mergeProc(m.Proc, p)
		}
		byRank[m.Rank] = m
	}
	for rk := int32(0); rk < c.Ranks; rk++ {
		m, ok := byRank[rk]
		switch {
		case rk == c.Rank:
			if !ok || m.PID != waiter {
				m = Member{Rank: rk, Seq: c.Seq}
				m.PID = waiter
				if p, ok := s.Procs[waiter]; ok {
					m.Proc = mergeProc(m.Proc, p)
				}
			}
			arrived = append(arrived, m)
		case !ok:
			untraced = append(untraced, rk)
		case m.Seq >= c.Seq && m.State != StateExited:
			arrived = append(arrived, m)
		default:
			missing = append(missing, m)
		}
	}
	return arrived, missing, untraced
}

// socketPeers names the ranks a wait outside NCCL waits for: the traced
// process at the other end of the socket the call waits in, whatever its
// state; else, those of the process's socket peers that cannot answer
// (stopped, in D, gone, or in a call of their own begun before this one),
// as a collective over gloo waits in a helper thread's poll, not in a
// socket call of its own.
func socketPeers(r *Report, s Snapshot) []Member {
	var pids []uint32
	if p := r.Call.PeerPID; p != 0 && p != r.PID {
		if _, traced := s.Procs[p]; traced {
			pids = []uint32{p}
		}
	}
	if pids == nil {
		// A peer stuck itself: in a call (a feeding thread's) begun
		// before this one.
		stuckSince := map[uint32]int64{}
		for _, c := range s.Calls {
			if v, ok := stuckSince[c.PID]; (c.Kind != Syscall || c.Feeder) && (!ok || c.Since < v) {
				stuckSince[c.PID] = c.Since
			}
		}
		for _, p := range s.Connected[r.PID] {
			switch s.Procs[p].State {
			case StateStopped, StateDisk, StateZombie, StateExited:
				pids = append(pids, p)
			default:
				if since, ok := stuckSince[p]; ok && since <= r.Call.Since {
					pids = append(pids, p)
				}
			}
		}
	}
	slices.Sort(pids)
	var out []Member
	for _, p := range pids {
		m := Member{Proc: s.Procs[p], Rank: -1, Seq: -1}
		m.PID = p
		if rk, ok := s.Rank[p]; ok {
			m.Rank = rk
		}
		out = append(out, m)
	}
	return out
}

func mergeProc(m, p Proc) Proc {
	if m.Host == "" {
		m.Host = p.Host
	}
	m.State, m.WChan, m.File, m.Exit, m.Since = p.State, p.WChan, p.File, p.Exit, p.Since
	if p.Comm != "" {
		m.Comm = p.Comm
	}
	return m
}

// reason says the hang in one line.
func reason(r *Report) string {
	var b strings.Builder
	c := &r.Call
	fmt.Fprintf(&b, "pid %d tid %d in %s", r.PID, r.TID, c.Name)
	if c.Stream != 0 || c.Kind == Sync {
		fmt.Fprintf(&b, " (stream %#x)", c.Stream)
	}
	if c.File != "" {
		fmt.Fprintf(&b, " on %s", c.File)
	}
	if c.PeerAddr != "" {
		fmt.Fprintf(&b, " to %s", c.PeerAddr)
	}
	fmt.Fprintf(&b, " for %.0fs", r.Seconds)
	if k := c.Collective; k != nil {
		fmt.Fprintf(&b, ", waiting for %s #%d on comm %#x (%d bytes)", k.Op, k.Seq, k.Comm, k.Bytes)
	}
	if len(r.Missing) > 0 {
		parts := make([]string, 0, len(r.Missing))
		for _, m := range r.Missing {
			parts = append(parts, memberText(m))
		}
		fmt.Fprintf(&b, "; missing: %s", strings.Join(parts, ", "))
	}
	if len(r.Untraced) > 0 {
		fmt.Fprintf(&b, "; untraced ranks %v", r.Untraced)
	}
	return b.String()
}

func memberText(m Member) string {
	var b strings.Builder
	if m.Rank >= 0 {
		fmt.Fprintf(&b, "rank %d (pid %d", m.Rank, m.PID)
	} else {
		fmt.Fprintf(&b, "process (pid %d", m.PID)
	}
	if m.Host != "" {
		fmt.Fprintf(&b, " on %s", m.Host)
	}
	if m.State != "" {
		b.WriteString(", " + m.State)
	}
	if m.File != "" {
		b.WriteString(" on " + m.File)
	} else if m.WChan != "" && m.State == StateDisk {
		b.WriteString(" in " + m.WChan)
	}
	if m.Exit != "" {
		b.WriteString(", " + m.Exit)
	}
	if m.Seq >= 0 {
		fmt.Fprintf(&b, ", last collective #%d", m.Seq)
	}
	b.WriteString(")")
	return b.String()
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }
