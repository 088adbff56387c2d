package main

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
)

// Process states between sidecars. Each tick, the watch tells the other
// sidecars of the job (--peers) the state of every process it traces that
// changed since it last told them, and all of them every stateRefresh (for
// a sidecar that joined since, or a record lost on the way). What it hears
// of theirs names a remote rank's state in a hang report as a local one's:
// running, stopped, in D on a file, exited with its status. It costs a
// comparison per traced process per tick, and a record when one changes.

const (
	// stateRefresh: how often every state is told again, in ns.
	stateRefresh = int64(5e9)
	// maxTellStates bounds the records told per tick.
	maxTellStates = 256
	// maxRemoteProcs bounds the remote processes whose state is kept.
	maxRemoteProcs = 1 << 12
	// exitedTold: how long an exited process is still told on refresh, ns.
	exitedTold = int64(60e9)
)

// toldState is what the other sidecars were last told of a process.
type toldState struct {
	rec   correlate.PeerRecord
	since int64 // when this sidecar first saw the state
}

type procKey struct {
	from string
	pid  uint32
}

// tellStates sends the process states that changed, or all of them when a
// refresh is due (tick goroutine).
func (h *hangWatch) tellStates(procs map[uint32]hang.Proc, now int64) {
	if h.send == nil {
		return
	}
	refresh := now-h.lastRefresh >= stateRefresh
	if refresh {
		h.lastRefresh = now
	}
	pids := make([]uint32, 0, len(procs))
	for pid := range procs {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	n := 0
	for _, pid := range pids {
		p := procs[pid]
		r := correlate.PeerRecord{Kind: correlate.PeerProc, PID: pid, State: p.State, WChan: clip(p.WChan, 64),
			File: clip(p.File, 512), Exit: clip(p.Exit, 64), At: p.Since}
		old, ok := h.told[pid]
		same := ok && old.rec.State == r.State && old.rec.File == r.File && old.rec.Exit == r.Exit
		if !same {
			old = toldState{since: now}
		}
		if r.At == 0 {
			r.At = old.since
		}
		old.rec = r
		h.told[pid] = old
		gone := p.State == hang.StateExited && now-r.At > exitedTold
		if (same && !refresh) || (same && gone) || n >= maxTellStates || r.Check() != nil {
			continue
		}
		h.send(r)
		n++
	}
	for pid := range h.told {
		if _, ok := procs[pid]; !ok {
			delete(h.told, pid)
		}
	}
}

// clip makes s fit a peer record: printable (any other rune becomes
// '?'), at most n bytes, cut on a rune boundary.
func clip(s string, n int) string {
	var b strings.Builder
	for _, c := range strings.ToValidUTF8(s, "?") {
		if !unicode.IsPrint(c) {
			c = '?'
		}
		if b.Len()+utf8.RuneLen(c) > n {
			break
		}
		b.WriteRune(c)
	}
	return b.String()
}

// peer notes another sidecar's records about its processes: their
// communicators and collectives, exits and states.
func (h *hangWatch) peer(b peers.Batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	host, _, _ := strings.Cut(b.From, "/")
	if b.Left {
		for k, m := range h.remote {
			if k.from == b.From && m.State != hang.StateExited {
				m.State = "sidecar left"
			}
		}
		for k := range h.remoteProcs {
			if k.from == b.From {
				delete(h.remoteProcs, k)
			}
		}
	}
	for i := range b.Recs {
		h.peerRecord(b.From, host, &b.Recs[i])
	}
}

func (h *hangWatch) peerRecord(from, host string, r *correlate.PeerRecord) {
	k := remoteKey{from, r.PID, r.Comm}
	switch r.Kind {
	case correlate.PeerComm:
		m := h.remote[k]
		if m == nil {
			m = &hang.Member{Proc: hang.Proc{PID: r.PID, Host: host, Sidecar: from}, Seq: -1}
			h.remote[k] = m
		}
		m.Rank, m.Ranks = r.Rank, r.Ranks
		if r.Ranks == 0 {
			m.Ranks = r.Size
		}
	case correlate.PeerIssue:
		if m := h.remote[k]; m != nil && r.Seq >= m.Seq {
			m.Seq, m.LastIssued = r.Seq, r.At
		}
	case correlate.PeerGone:
		for rk, m := range h.remote {
			if rk.from == from && rk.pid == r.PID {
				m.State, m.Since = hang.StateExited, r.At
			}
		}
	case correlate.PeerProc:
		pk := procKey{from, r.PID}
		if _, ok := h.remoteProcs[pk]; !ok && len(h.remoteProcs) >= maxRemoteProcs {
			return
		}
		h.remoteProcs[pk] = hang.Proc{PID: r.PID, Host: host, Sidecar: from, State: r.State, WChan: r.WChan,
			File: r.File, Exit: r.Exit, Since: r.At}
	}
}

// remoteMember is a remote rank with the latest state its sidecar told
// (h.mu held). An exit its engine reported stands over an older state.
func (h *hangWatch) remoteMember(m hang.Member) hang.Member {
	p, ok := h.remoteProcs[procKey{m.Sidecar, m.PID}]
	if !ok || (m.State == hang.StateExited && p.State != hang.StateExited) {
		return m
	}
	m.State, m.WChan, m.File, m.Exit = p.State, p.WChan, p.File, p.Exit
	if p.Since != 0 || m.State != hang.StateExited {
		m.Since = p.Since
	}
	return m
}
