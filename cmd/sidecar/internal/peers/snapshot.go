package peers

import (
	"sync"

	"github.com/gaptrace/gaptrace/correlate"
)

// maxSnapshot bounds the communicators remembered (a job's ranks, restarts);
// those past it are not re-sent to sidecars that join later.
const maxSnapshot = 1 << 16

type commKey struct {
	pid  uint32
	comm uint64
}

// snapshot is the PeerComm records passed to Send, in order, one per
// communicator, less those of processes gone: what a sidecar that joins
// late needs to know of this one.
type snapshot struct {
	mu   sync.Mutex
	recs []correlate.PeerRecord
	at   map[commKey]int // index in recs
}

// note updates the snapshot with a record passed to Send.
func (s *snapshot) note(r *correlate.PeerRecord) {
	switch r.Kind {
	case correlate.PeerComm:
		s.put(r)
	case correlate.PeerGone:
		s.forget(r.PID)
	}
}

func (s *snapshot) put(r *correlate.PeerRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := commKey{pid: r.PID, comm: r.Comm}
	if i, ok := s.at[k]; ok {
		s.recs[i] = *r
		return
	}
	if len(s.recs) >= maxSnapshot {
		return
	}
	if s.at == nil {
		s.at = map[commKey]int{}
	}
	s.at[k] = len(s.recs)
	s.recs = append(s.recs, *r)
}

// forget drops the communicators of process pid.
func (s *snapshot) forget(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.recs[:0]
	for _, r := range s.recs {
		if r.PID != pid {
			kept = append(kept, r)
		}
	}
	if len(kept) == len(s.recs) {
		return
	}
	clear(s.recs[len(kept):])
	s.recs = kept
	clear(s.at)
	for i, r := range s.recs {
		s.at[commKey{pid: r.PID, comm: r.Comm}] = i
	}
}

// records returns a copy of the snapshot.
func (s *snapshot) records() []correlate.PeerRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]correlate.PeerRecord(nil), s.recs...)
}
