package attribute

import "github.com/gaptrace/gaptrace/event"

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
}

// Site names the location as CallSite does: "train.py:142 step".
func (c CodeSample) Site() string {
	return CallSite(event.Frame{Function: c.Function, File: c.File, Line: c.Line})
}

// Code roles.
const (
	RoleFeeder = "feeder"
	RoleHolder = "holder"
	RoleWorker = "worker"
)
