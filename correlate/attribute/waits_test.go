package attribute

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestPythonWait: which wait stacks are CPython's lock waits, and which of
// those wait for the GIL (a condition wait, timed or not, below the Python
// frames).
func TestPythonWait(t *testing.T) {
	libc := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	py := event.Frame{Function: "step", File: "train.py", Line: 12}
	for _, c := range []struct {
		name      string
		stack     []event.Frame
		lock, gil bool
	}{
		{"GIL", []event.Frame{{Function: "pthread_cond_timedwait", File: libc}, {Function: "take_gil", File: "/usr/bin/python3.12"}, py}, true, true},
		{"forced switch", []event.Frame{{Function: "pthread_cond_wait", File: libc}, {Function: "drop_gil", File: "/usr/bin/python3.12"}, py}, true, true},
		{"clockwait", []event.Frame{{Function: "pthread_cond_clockwait", File: libc}, py}, true, true},
		{"semaphore", []event.Frame{{Function: "sem_clockwait", File: libc}, py}, true, false},
		{"timed wait above Python", []event.Frame{{Function: "sem_wait", File: libc}, py, {Function: "pthread_cond_timedwait", File: libc}}, true, false},
		{"frozen module", []event.Frame{{Function: "pthread_cond_timedwait", File: libc}, {Function: "_bootstrap", File: "<frozen importlib._bootstrap>"}}, true, true},
		{"native wait", []event.Frame{{Function: "pthread_cond_timedwait", File: libc}, {Function: "main", File: "/opt/job/trainer"}}, false, false},
		{"job code first", []event.Frame{{Function: "wait_batch", File: "/opt/job/libloader.so"}, {Function: "pthread_cond_timedwait", File: libc}, py}, false, false},
		{"no Python", []event.Frame{{Function: "pthread_cond_timedwait", File: libc}}, false, false},
		{"empty", nil, false, false},
	} {
		if got := pythonLockWait(c.stack); got != c.lock {
			t.Errorf("%s: pythonLockWait %v, want %v", c.name, got, c.lock)
		}
		if got := gilWait(c.stack); got != c.gil {
			t.Errorf("%s: gilWait %v, want %v", c.name, got, c.gil)
		}
	}
}
