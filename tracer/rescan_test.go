package tracer

import (
	"testing"
	"time"
)

// The periodic rescan of a process backs off while its executable
// mappings stay the same, up to rescanBackoff, and starts over at the
// configured interval once they change (a library mapped without an mmap
// event seen).
func TestRescanBackoff(t *testing.T) {
	var r rescanState
	now := time.Unix(1000, 0)
	base := time.Second
	var got []time.Duration
	for i, sig := range []uint64{7, 7, 7, 7, 7, 7, 9, 9} {
		r.next(sig, now, base)
		got = append(got, r.every)
		if want := now.Add(r.every); !r.due.Equal(want) {
			t.Fatalf("scan %d: due %v, want %v", i, r.due, want)
		}
		now = r.due
	}
	want := []time.Duration{1, 2, 4, 8, 8, 8, 1, 2}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("intervals %v, want %v seconds", got, want)
		}
	}
	// A rescan an mmap event asked for resets the interval.
	r.sig, r.every = 9, 0
	r.next(9, now, base)
	if r.every != base {
		t.Errorf("after an event's rescan the interval is %v, want %v", r.every, base)
	}
	// An interval configured above the backoff's bound is kept.
	var slow rescanState
	slow.next(1, now, 10*time.Second)
	slow.next(1, now, 10*time.Second)
	if slow.every != 10*time.Second {
		t.Errorf("a 10 s interval backs off to %v, want it kept", slow.every)
	}
}

// pathSig tells two libraries apart, and one library mapped at another
// address.
func TestPathSig(t *testing.T) {
	a, b := pathSig("/usr/lib/libcuda.so.1", 0x7f0000000000), pathSig("/opt/libnccl.so.2", 0x7f1000000000)
	if a == b {
		t.Fatal("signatures collide")
	}
	if pathSig("/usr/lib/libcuda.so.1", 0x7f2000000000) == a {
		t.Error("a remapped library keeps its signature")
	}
}
