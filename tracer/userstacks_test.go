package tracer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// fakeStackMap behaves as a BPF_MAP_TYPE_STACK_TRACE taken without
// BPF_F_REUSE_STACKID: a stack's id is its hash bucket, and a stack whose
// bucket holds another one gets none.
type fakeStackMap struct {
	buckets map[uint32][]uint64
	n       uint32
}

func (f *fakeStackMap) take(ips []uint64) int32 {
	id := uint32(stackSum(ips)>>7) & (f.n - 1)
	if held, ok := f.buckets[id]; ok && !slices.Equal(held, ips) {
		return -1 // -EEXIST
	}
	f.buckets[id] = slices.Clone(ips)
	return int32(id)
}

func (f *fakeStackMap) Lookup(key, valueOut any) error {
	ips, ok := f.buckets[key.(uint32)]
	if !ok {
		return fmt.Errorf("lookup: %w", ebpf.ErrKeyNotExist)
	}
	buf := valueOut.(*[stackDepth]uint64)
	*buf = [stackDepth]uint64{}
	copy(buf[:], ips)
	return nil
}

func (f *fakeStackMap) Delete(key any) error {
	if _, ok := f.buckets[key.(uint32)]; !ok {
		return fmt.Errorf("delete: %w", ebpf.ErrKeyNotExist)
	}
	delete(f.buckets, key.(uint32))
	return nil
}

// TestStackTableOutlivesMap takes 16 times as many distinct stacks as the
// map holds (one-off stacks, as page-fault bursts take, every 10 ms)
// while a loop's call sites start late and repeat: each site gets its
// stack within an idle period of its first call and on every call after,
// the one-off stacks nearly all arrive, every stack read is the one taken,
// and the map holds only what was named lately.
func TestStackTableOutlivesMap(t *testing.T) {
	const n = 1024
	const idle = 200 * time.Millisecond
	f := &fakeStackMap{buckets: map[uint32][]uint64{}, n: n}
	s := newStackTable(f, idle)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	read := func(ips []uint64) bool {
		id := f.take(ips)
		if id < 0 {
			return false
		}
		got, sum := s.ips(id)
		if !slices.Equal(got, ips) || sum != stackSum(ips) {
			t.Fatalf("id %d read as %x, taken as %x", id, got, ips)
		}
		return true
	}
	stack := func(site, depth uint64) []uint64 {
		ips := []uint64{0x400000 + site*16}
		for i := uint64(0); i < depth; i++ {
			ips = append(ips, 0x500000+i*8)
		}
		return ips
	}
	oneOffs, arrived, maxHeld := 0, 0, 0
	const sites = 8
	firstOK := map[uint64]time.Time{}
	for step := range 16 * n {
		now = now.Add(10 * time.Millisecond)
		oneOffs++
		if read(stack(1000+uint64(step), 3)) {
			arrived++
		}
		if step < 4*n {
			continue // startup: one-off stacks only
		}
		for site := range uint64(sites) {
			ok := read(stack(site, 5))
			first, seen := firstOK[site]
			switch {
			case ok && !seen:
				firstOK[site] = now
			case !ok && seen:
				t.Fatalf("step %d: site %d lost its stack after getting one at %v", step, site, first)
			}
		}
		maxHeld = max(maxHeld, len(f.buckets))
	}
	start := time.Unix(1000, 0).Add(time.Duration(4*n+1) * 10 * time.Millisecond)
	for site := range uint64(sites) {
		first, ok := firstOK[site]
		if !ok {
			t.Errorf("site %d never got a stack", site)
			continue
		}
		if d := first.Sub(start); d > 2*idle {
			t.Errorf("site %d got its first stack %v after it started, want within %v", site, d, 2*idle)
		}
	}
	if float64(arrived) < 0.9*float64(oneOffs) {
		t.Errorf("%d of %d one-off stacks arrived, want 90%%", arrived, oneOffs)
	}
	// Named within the last 1.5 idle periods (10 ms apart), the sites, and
	// one taken in flight.
	if want := int(1.5*float64(idle/(10*time.Millisecond))) + sites + 1; maxHeld > want {
		t.Errorf("the map held up to %d stacks, want <= %d", maxHeld, want)
	}
	if s.deleted == 0 {
		t.Errorf("no id deleted")
	}
	t.Logf("%d of %d one-off stacks arrived; map held <= %d of %d; %d ids deleted", arrived, oneOffs, maxHeld, n, s.deleted)
}

// TestStackTableInFlight: a record that named an id before the sweep
// deleted it, read after, still gets its stack; one that names an id the
// map no longer holds and user space never read gets none.
func TestStackTableInFlight(t *testing.T) {
	f := &fakeStackMap{buckets: map[uint32][]uint64{}, n: 64}
	s := newStackTable(f, time.Second)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	ips := []uint64{0x401000, 0x402000}
	id := f.take(ips)
	if got, _ := s.ips(id); !slices.Equal(got, ips) {
		t.Fatalf("read %x, want %x", got, ips)
	}
	// Taken again (a dedup hit), and its record still in the ring while
	// the id idles out and is deleted.
	if again := f.take(ips); again != id {
		t.Fatalf("taken again as id %d, want %d", again, id)
	}
	now = now.Add(2 * time.Second)
	other := []uint64{0x403000}
	s.ips(f.take(other)) // any read sweeps
	if _, ok := f.buckets[uint32(id)]; ok {
		t.Fatalf("id %d still in the map after idling", id)
	}
	if got, _ := s.ips(id); !slices.Equal(got, ips) {
		t.Errorf("in-flight record read %x, want %x", got, ips)
	}
	now = now.Add(2 * time.Second)
	s.ips(f.take(other))
	if got, _ := s.ips(id); got != nil {
		t.Errorf("an id deleted two sweeps ago read %x, want none", got)
	}
}
