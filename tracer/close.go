package tracer

import (
	"errors"
	"os"
	"time"

	"github.com/cilium/ebpf/link"
)

// Close detaches every probe in reverse order of attachment and releases
// every BPF object. It is safe to call more than once.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		procs := t.procs
		t.procs = make(map[uint32]*procState)
		t.mu.Unlock()
		close(t.done)
		t.wg.Wait()
		t.detaching.Wait()

		// Uprobes first (all at once: they are independent of each other),
		// then the tracepoints in reverse order of attachment, then the
		// reader, programs and maps.
		var errs []error
		var uprobes []link.Link
		for _, ps := range procs {
			for _, la := range ps.libs {
				uprobes = append(uprobes, la.allLinks()...)
			}
		}
		start := time.Now()
		if err := closeLinksParallel(uprobes); err != nil {
			errs = append(errs, err)
		}
		t.log.Debug("uprobes detached", "links", len(uprobes), "took", time.Since(start))
		start = time.Now()
		// Each tracepoint detach also waits for a grace period: in parallel
		// too (they are independent; the order among them does not matter).
		if err := closeLinksParallel(t.tps); err != nil {
			errs = append(errs, err)
		}
		if t.reader != nil {
			if err := t.reader.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, err)
			}
		}
		t.log.Debug("tracepoints detached", "links", len(t.tps), "took", time.Since(start))
		errs = append(errs, t.closeObjects())
		t.syms.close()
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

func (t *Tracer) closeObjects() error {
	errs := []error{t.sched.Close(), t.sys.Close(), t.nccl.Close(), t.cuda.Close()}
	for _, name := range sharedMaps {
		if m := t.shared[name]; m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
