package tracer

import (
	"errors"
	"time"

	"github.com/cilium/ebpf"
)

// User stacks by id. The BPF programs store each stack they take in
// user_stacks (bpf/common.h), a BPF_MAP_TYPE_STACK_TRACE: its id is the
// stack's hash bucket, and a stack whose bucket another stack holds gets
// no id at all. Left alone the map only fills: every distinct stack of a
// run (a new call site, a page-fault burst anywhere in the job) keeps a
// bucket, and after a few thousand a sync's stack collides with one of
// them and the sync has none, for the rest of the run. So user space
// reads each id once and deletes it from the map once no event has named
// it for stackIdle: a loop's call sites stay in the map, read once, and
// one-off stacks leave it. A stack's bucket is occupied only while it is
// in the map, so its content cannot change under an id user space holds.

// stackIdle is how long an id user space read stays in the map without
// an event naming it: well over the time a record spends in the ring
// (a fault burst's stack is taken at its first fault, emitted when the
// thread leaves the CPU or a sample ends it), so records in flight when
// it is deleted are rare, and those that are take its content from gone.
const stackIdle = 2 * time.Second

// stackMap is the part of the user_stacks map the table uses.
type stackMap interface {
	Lookup(key, valueOut any) error
	Delete(key any) error
}

type heldStack struct {
	ips  []uint64
	sum  uint64 // stackSum(ips)
	used time.Time
}

// stackTable caches the ids of user_stacks that user space read, and
// deletes them when idle. It is used by the consumer goroutine only.
type stackTable struct {
	m    stackMap
	idle time.Duration
	now  func() time.Time
	held map[int32]*heldStack
	// gone: the ids deleted by the latest sweep, for a record that named
	// one before it was deleted and was read after.
	gone  map[int32]*heldStack
	swept time.Time
	// deleted counts the ids deleted from the map (Stats).
	deleted uint64
}

func newStackTable(m stackMap, idle time.Duration) *stackTable {
	return &stackTable{m: m, idle: idle, now: time.Now, held: map[int32]*heldStack{}, gone: map[int32]*heldStack{}}
}

// ips returns the return addresses stored under id, innermost first, and
// their sum (stackSum; 0 with none).
func (s *stackTable) ips(id int32) ([]uint64, uint64) {
	if s == nil || s.m == nil || id < 0 {
		return nil, 0
	}
	now := s.now()
	defer s.sweep(now)
	if h, ok := s.held[id]; ok {
		h.used = now
		return h.ips, h.sum
	}
	var buf [stackDepth]uint64
	if err := s.m.Lookup(uint32(id), &buf); err != nil {
		if h, ok := s.gone[id]; ok && errors.Is(err, ebpf.ErrKeyNotExist) {
			// Named before the sweep deleted it, read after: no
			// stack has taken its bucket since.
			return h.ips, h.sum
		}
		return nil, 0
	}
	h := &heldStack{used: now}
	for _, ip := range buf {
		if ip == 0 {
			break
		}
		h.ips = append(h.ips, ip)
	}
	h.sum = stackSum(h.ips)
	s.held[id] = h
	delete(s.gone, id)
	return h.ips, h.sum
}

// sweep deletes from the map the ids no event named for s.idle, at most
// once per half of it.
func (s *stackTable) sweep(now time.Time) {
	if now.Sub(s.swept) < s.idle/2 {
		return
	}
	s.swept = now
	clear(s.gone)
	for id, h := range s.held {
		if now.Sub(h.used) < s.idle {
			continue
		}
		delete(s.held, id)
		if err := s.m.Delete(uint32(id)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // not deleted: never read again as held, no gone
		}
		s.deleted++
		s.gone[id] = h
	}
}

// stackSum hashes a stack's addresses (FNV-1a over the words): the
// symbolized stacks are cached by it, an id naming other addresses once
// its stack was deleted.
func stackSum(ips []uint64) uint64 {
	if len(ips) == 0 {
		return 0
	}
	h := uint64(14695981039346656037)
	for _, ip := range ips {
		for i := 0; i < 64; i += 8 {
			h ^= (ip >> i) & 0xff
			h *= 1099511628211
		}
	}
	return h | 1 // never 0: 0 is "not cached"
}
