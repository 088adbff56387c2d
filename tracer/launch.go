package tracer

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf/link"
)

// LaunchToggle is what one SetLaunchProbes call did.
type LaunchToggle struct {
	// At is the Unix ns time from which the per-launch probes are live in
	// every traced process (on: after the last attach returned), or until
	// which they were (off: before the first detach began). The spans
	// between are ambiguous, so the correlator treats them as lite.
	At    int64
	Took  time.Duration // attach or detach, every process
	Links int           // links attached or closed
}

// SetLaunchProbes attaches (on) or detaches (off) the per-launch probes of
// every traced process under ProbesAuto; libraries mapped while they are on
// get them too. It fails under any other probe set.
func (t *Tracer) SetLaunchProbes(on bool) (LaunchToggle, error) {
	if t.cfg.Probes != ProbesAuto {
		return LaunchToggle{}, fmt.Errorf("launch probes: toggled only under probe set %q, not %q", ProbesAuto, t.cfg.Probes)
	}
	// No library is attached meanwhile: it would see launchOn and attach
	// its launch probes itself, racing this loop.
	t.scanMu.Lock()
	defer t.scanMu.Unlock()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return LaunchToggle{}, errors.New("launch probes: tracer closed")
	}
	t.launchOn = on
	var las []*libAttach
	var pids []uint32
	for pid, ps := range t.procs {
		for _, la := range ps.libs {
			if la.file != "" {
				las, pids = append(las, la), append(pids, pid)
			}
		}
	}
	t.mu.Unlock()

	start := time.Now()
	res := LaunchToggle{At: start.UnixNano()}
	if !on {
		var ls []link.Link
		t.mu.Lock()
		for _, la := range las {
			ls = append(ls, la.launch...)
			la.launch, la.launchInfo = nil, nil
		}
		t.mu.Unlock()
		err := closeLinksParallel(ls)
		res.Took, res.Links = time.Since(start), len(ls)
		if err != nil {
			return res, fmt.Errorf("detach launch probes: %w", err)
		}
		return res, nil
	}
	for i, la := range las {
		res.Links += t.attachLaunch(la, pids[i])
		// The process may have exited (or the tracer closed) meanwhile:
		// its other links are being closed without these.
		t.mu.Lock()
		var orphan []link.Link
		if t.closed || t.procs[pids[i]] == nil {
			orphan, la.launch, la.launchInfo = la.launch, nil, nil
		}
		t.mu.Unlock()
		if err := closeLinks(orphan); err != nil {
			t.log.Debug("detach launch probes of a process gone while attaching", "pid", pids[i], "error", err)
		}
	}
	end := time.Now()
	res.At, res.Took = end.UnixNano(), end.Sub(start)
	return res, nil
}

// attachLaunch attaches the per-launch probes to one library of one
// process (called with scanMu held); it returns how many links it added.
func (t *Tracer) attachLaunch(la *libAttach, pid uint32) int {
	t.mu.Lock()
	have := len(la.launch) > 0
	t.mu.Unlock()
	if have {
		return 0
	}
	planned, _, err := planProbes(la.file, la.lib, probesLaunch)
	if err != nil {
		t.log.Debug("plan launch probes", "library", la.path, "pid", pid, "error", err)
		return 0
	}
	ex, err := link.OpenExecutable(la.file)
	if err != nil {
		t.log.Debug("open library for launch probes", "library", la.path, "pid", pid, "error", err)
		return 0
	}
	links, info := t.attachPlanned(ex, pid, la.path, la.lib, planned)
	t.mu.Lock()
	la.launch, la.launchInfo = links, info
	t.mu.Unlock()
	return len(links)
}
