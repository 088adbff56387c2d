package attribute

import (
	"github.com/gaptrace/gaptrace/event"
)

// CodeSample is one code location that CPU samples found running during a
// gap: the innermost frame of the job's own code in the sampled stacks
// (SiteFrame), how many samples landed there, and the thread that ran it.
// Role is "feeder" for the thread the gap belongs to and "holder" for a
// thread that held the lock it waited on. GC is set when the samples were
// taken inside the interpreter's garbage collector (the function is then
// the code whose allocation or gc.collect() call started it).
type CodeSample struct {
	Function string `json:"function"`
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Samples  int    `json:"samples"`
	TID      uint32 `json:"tid"`
	Role     string `json:"role"`
	GC       bool   `json:"gc,omitempty"`
	// Caller is the job's own frame that called Function (its function,
	// file and line): a helper that burns the time for several callers (a
	// shared loop, a parser) is told apart by who called it. Nil where no
	// frame of the job's code is above.
	Caller *event.Frame `json:"caller,omitempty"`
}

// Site names the location as CallSite does: "train.py:142 step", with its
// caller's function where known: "util.py:30 burn ← tokenize_batch".
func (c CodeSample) Site() string {
	s := CallSite(event.Frame{Function: c.Function, File: c.File, Line: c.Line})
	if c.Caller != nil {
		s += " ← " + c.Caller.Function
	}
	return s
}

// CallerOf is the frame of the job's own code that called stack[i] (the
// next one out that is not system code), false when none.
func CallerOf(stack []event.Frame, i int) (event.Frame, bool) {
	for j := i + 1; j < len(stack); j++ {
		if f := stack[j]; !event.SystemCode(f.File) {
			return f, true
		}
	}
	return event.Frame{}, false
}

// Code roles.
const (
	RoleFeeder = "feeder"
	RoleHolder = "holder"
	RoleWorker = "worker"
)
