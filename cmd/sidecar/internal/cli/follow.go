package cli

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
)

// followed pins the descendants of a traced process with pidfds, so that
// once it exits gaptrace still knows which processes were its own.
//
// New descendants come from the tracer's own set (it sees every fork of a
// traced process) when the pipeline has one, and from a walk of all of
// /proc at the first look and then every walkEvery looks, in case a fork
// was lost: the walk reads every process's stat on the node, which on a
// GPU host cost 5–18% of the sidecar's CPU at one walk every 500 ms.
type followed struct {
	root    int
	traced  func(after time.Time, wait time.Duration) []int // nil: every look walks /proc
	looks   int
	watches map[int]*proc.Watch
}

// walkEvery is how many looks for new descendants share one walk of /proc
// when the tracer's set is at hand (every 10 s at matchPoll).
const walkEvery = 20

func newFollowed(root int, traced func(time.Time, time.Duration) []int) *followed {
	f := &followed{root: root, traced: traced, watches: map[int]*proc.Watch{}}
	f.refresh(false)
	return f
}

// tracedSet is the pipeline's set of traced processes, when it keeps one.
func tracedSet(p Pipeline) func(time.Time, time.Duration) []int {
	if l, ok := p.(interface {
		ProcessesAfter(time.Time, time.Duration) []int
	}); ok {
		return l.ProcessesAfter
	}
	return nil
}

// settleWait bounds how long a look that follows an exit waits for the
// tracer to read the forks recorded before it.
const settleWait = time.Second

// candidates returns processes that may have joined the followed ones
// (roots): the tracer's set, or their descendants from /proc. settle (after
// a followed process exited) waits until the tracer has read every fork
// recorded before now: a process that forks and exits at once (a launcher)
// is gone before its child's fork is read, and its child is reparented
// away, where no walk of /proc finds it.
func (f *followed) candidates(settle bool, roots ...int) []int {
	f.looks++
	if f.traced == nil {
		return proc.Descendants(roots...)
	}
	var out []int
	if f.looks%walkEvery == 1 {
		out = proc.Descendants(roots...)
	}
	if settle {
		return append(out, f.traced(time.Now(), settleWait)...)
	}
	return append(out, f.traced(time.Time{}, 0)...)
}

// refresh adds the root's current descendants and drops those that exited;
// settle after the root exited.
func (f *followed) refresh(settle bool) {
	for _, p := range f.candidates(settle, f.root) {
		if _, ok := f.watches[p]; ok || p == f.root {
			continue
		}
		if w, err := proc.Open(p); err == nil {
			f.watches[p] = w
		}
	}
	for p, w := range f.watches {
		if w.Exited() {
			w.Close()
			delete(f.watches, p)
		}
	}
}

func (f *followed) alive() int {
	n := 0
	for _, w := range f.watches {
		if !w.Exited() {
			n++
		}
	}
	return n
}

// waitAll returns a channel closed once every followed process exited.
// Processes they start meanwhile are followed too (the kernel side traces
// them already). The watches move to the waiting goroutine.
func (f *followed) waitAll(ctx context.Context, every time.Duration) <-chan struct{} {
	done := make(chan struct{})
	watches := f.watches
	f.watches = map[int]*proc.Watch{}
	go func() {
		defer close(done)
		defer func() {
			for _, w := range watches {
				w.Close()
			}
		}()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			// One walk of /proc for all of them when walking: a PyTorch
			// job has dozens of workers, and a walk per process cost a
			// core's 14%.
			add := func(settle bool) {
				for _, d := range f.candidates(settle, slices.Collect(maps.Keys(watches))...) {
					if _, ok := watches[d]; !ok && d != f.root {
						if dw, err := proc.Open(d); err == nil {
							watches[d] = dw
						}
					}
				}
			}
			add(false)
			exited := false
			for p, w := range watches {
				if w.Exited() {
					w.Close()
					delete(watches, p)
					exited = true
				}
			}
			if exited && f.traced != nil {
				// What the exited ones forked last may not be read yet.
				add(true)
			}
			if len(watches) == 0 {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return done
}

func (f *followed) close() {
	for _, w := range f.watches {
		w.Close()
	}
}
