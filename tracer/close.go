package tracer

import (
	"errors"
	"os"
	"time"

	"github.com/cilium/ebpf/link"
)

// Close detaches every probe and releases every BPF object. It is safe to
// call more than once.
//
// Every link is closed at once: each close waits for an RCU grace period
// (a tasks-trace one for uprobes and syscall tracepoints, seconds on a
// loaded or nested kernel), and concurrent waiters share one. In stages
// (uprobes, then tracepoints) the second stage's closes would not have
// begun when gaptrace stops waiting for the detach at exit
// (cli.DetachTimeout); the kernel then releases those as the process
// exits, one grace period after another, and the exit waits for all of
// them. Closes already under way when gaptrace exits end together.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		procs := t.procs
		t.procs = make(map[uint32]*procState)
		t.mu.Unlock()
		close(t.done)
		t.wg.Wait()

		var errs []error
		var uprobes []link.Link
		for _, ps := range procs {
			for _, la := range ps.libs {
				uprobes = append(uprobes, la.allLinks()...)
			}
		}
		start := time.Now()
		// Exited processes' uprobes, closed in the background since they
		// exited, go on meanwhile; they are independent of the rest.
		if err := closeLinksParallel(append(uprobes, t.tps...)); err != nil {
			errs = append(errs, err)
		}
		t.detaching.Wait()
		t.log.Debug("probes detached", "uprobe_links", len(uprobes), "tracepoint_links", len(t.tps), "took", time.Since(start))
		if t.reader != nil {
			if err := t.reader.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, err)
			}
		}
		errs = append(errs, t.closeObjects())
		t.syms.close()
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

func (t *Tracer) closeObjects() error {
	errs := []error{t.prof.Close(), t.sched.Close(), t.sys.Close(), t.nccl.Close(), t.marker.Close(), t.cuda.Close()}
	for _, name := range sharedMaps {
		if m := t.shared[name]; m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
