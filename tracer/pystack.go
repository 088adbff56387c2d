package tracer

import (
	"path/filepath"

	"github.com/gaptrace/gaptrace/event"
)

// pyMerge completes the stack of an event of a CPython thread with its
// Python frames, when the programs recorded them for it: the native frames
// inside the call (the C library, an extension module, libffi) stay,
// innermost first; those of the interpreter's own loop, which say nothing
// the Python frames do not, give way to the Python frames.
func (t *Tracer) pyMerge(ev *event.Event, ktime uint64) {
	if t.py == nil {
		return
	}
	id := uint64(ev.PID)<<32 | uint64(ev.TID)
	frames, truncated, ok, err := t.py.take(id, ktime)
	if err != nil || !ok {
		return
	}
	t.py.mu.Lock()
	var interp string
	if p := t.py.procs[ev.PID]; p != nil {
		interp = p.binary
	}
	t.py.mu.Unlock()
	ev.Stack, ev.StackTruncated = mergePython(ev.Stack, ev.StackTruncated, frames, truncated, interp)
}

// mergePython puts the Python frames after the native frames that precede
// the first frame of the interpreter binary. When the native walk never
// reached the interpreter (it stops at a function without a frame pointer)
// every native frame of a file stays.
func mergePython(native []event.Frame, nativeTrunc bool, py []event.Frame, pyTrunc bool, interp string) ([]event.Frame, bool) {
	if len(py) == 0 && !pyTrunc {
		return native, nativeTrunc
	}
	keep, reached := len(native), false
	for i, f := range native {
		if f.File == interp || isInterpreterFile(f.File) {
			keep, reached = i, true
			break
		}
	}
	out := make([]event.Frame, 0, keep+len(py))
	for _, f := range native[:keep] {
		// An address in no file mapping (a word the frame-pointer walk
		// took from a frame without one) names nothing a Python frame
		// would not name better.
		if f.File != "" {
			out = append(out, f)
		}
	}
	out = append(out, py...)
	return out, pyTrunc || nativeTrunc && !reached
}

// isInterpreterFile: the python3.X executable or libpython3.X.
func isInterpreterFile(path string) bool {
	base := filepath.Base(path)
	return pyExecRe.MatchString(base) || pyLibRe.MatchString(base)
}
