package attribute

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestUserFrameSkipsLibrariesAndInterpreter(t *testing.T) {
	stack := []event.Frame{
		{Function: "pread64", File: "/usr/lib/x86_64-linux-gnu/libc.so.6"},
		{Function: "sock_recv", File: "/root/.pyenv/versions/3.11.7/lib/python3.11/lib-dynload/_socket.cpython-311-x86_64-linux-gnu.so"},
		{Function: "_Py_read", File: "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"},
		{Function: "read", File: "/root/.pyenv/versions/3.11.7/lib/python3.11/os.py", Line: 10},
		{Function: "load", File: "/venv/lib/python3.11/site-packages/torch/serialization.py", Line: 99},
		{Function: "save_checkpoint", File: "/job/train.py", Line: 142},
		{Function: "main", File: "/job/train.py", Line: 210},
	}
	if i := UserFrame(stack); i != 5 {
		t.Fatalf("UserFrame = %d, want 5", i)
	}
	f, ok := SiteFrame(stack)
	if !ok || CallSite(f) != "train.py:142 save_checkpoint" {
		t.Errorf("site %q", CallSite(f))
	}
	// Only library frames: the innermost one is the site.
	f, ok = SiteFrame(stack[:2])
	if !ok || CallSite(f) != "libc.so.6 pread64" {
		t.Errorf("site %q", CallSite(f))
	}
	if _, ok := SiteFrame(nil); ok {
		t.Error("site of an empty stack")
	}
	want := "save_checkpoint (/job/train.py:142)\nmain (/job/train.py:210)\n… (truncated)"
	if got := FormatStack(stack[5:], true); got != want {
		t.Errorf("FormatStack = %q, want %q", got, want)
	}
}

func TestEvidenceStackIsTheDominantCallsStack(t *testing.T) {
	at := New(nil) // result reads no world
	read := &event.Event{Kind: event.KindSyscall, Syscall: event.SysRead, Path: "/data", Start: 1,
		Stack: []event.Frame{{Function: "load_batch", File: "/job/train.py", Line: 7}}}
	sleep := &event.Event{Kind: event.KindSyscall, Syscall: event.SysSleep, Start: 2,
		Stack: []event.Frame{{Function: "nap", File: "/job/train.py", Line: 9}}}
	at.ops[read] = &opAcc{ev: read, ns: 10}
	at.ops[sleep] = &opAcc{ev: sleep, ns: 5}
	at.byCause[CauseSleep] = 50 // sleep dominates though the read took longer
	at.byCause[CauseIORead] = 10
	_, _, ev, _ := at.Result()
	if len(ev.Stack) != 1 || ev.Stack[0].Function != "nap" {
		t.Errorf("stack %+v, want the dominant cause's call", ev.Stack)
	}
}
