package tracer

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

// TestRingReaderWaitsInRuntimePoller: the real ring's fd joins Go's
// network poller, so that an idle reader parks its goroutine instead of
// blocking a thread in epoll_wait; Read(false) on an empty ring returns
// at once; Flush ends a waiting Read, which then reports the flush.
func TestRingReaderWaitsInRuntimePoller(t *testing.T) {
	tr := newTestTracer(t, Config{})
	rr, ok := tr.reader.(*ringReader)
	if !ok {
		t.Fatalf("reader is a %T", tr.reader)
	}
	if rr.poll == nil {
		t.Fatal("ring buffer fd not in the runtime poller: the reader would block a thread in epoll_wait")
	}
	// Nothing is traced, so nothing is written to the ring.
	t0 := time.Now()
	if _, err := rr.Read(false); !errors.Is(err, errEmpty) {
		t.Fatalf("Read(false) on an empty ring: %v, want errEmpty", err)
	}
	if d := time.Since(t0); d > 100*time.Millisecond {
		t.Errorf("Read(false) took %v: it waited", d)
	}
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := rr.Read(true); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(3 * DefaultRingPoll) // let it park a few times
	if err := rr.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ringbuf.ErrFlushed) && !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Read after Flush: %v, want ErrFlushed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Flush did not end a waiting Read")
	}
}
