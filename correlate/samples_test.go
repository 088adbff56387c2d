package correlate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func sampleAt(tid uint32, at int64, fn string, gc bool) event.Event {
	st := []event.Frame{{Function: fn, File: "/job/train.py", Line: 10}}
	if gc {
		st = append([]event.Frame{{Function: GCFunction, File: GCFile}}, st...)
	}
	return event.Event{Kind: event.KindCPUSample, PID: 1, TID: tid, Start: at, End: at, Stack: st}
}

// TestAttachCode: a cpu gap gets its thread's samples inside it, by site,
// most first; a lock gap also each holder's (role holder, on the holder's
// evidence too); an io gap with a blocking stack gets none; samples outside
// the gap, or of other threads, never count.
func TestAttachCode(t *testing.T) {
	var s samples
	for i, at := range []int64{5, 15, 25, 35, 45, 95} {
		fn := "collate"
		if i == 2 {
			fn = "augment"
		}
		ev := sampleAt(7, at, fn, false)
		s.add(&ev)
	}
	for _, at := range []int64{12, 22, 32} {
		ev := sampleAt(8, at, "hold_gil", false)
		s.add(&ev)
	}
	// out of order, from another CPU's batch
	ev := sampleAt(7, 41, "collect", true)
	s.add(&ev)

	g := Gap{TID: 7, Start: 10, End: 50, Cause: CauseCPU, Breakdown: map[Cause]int64{CauseCPU: 40}}
	s.attachCode(&g)
	want := []CodeSample{
		{Function: "collate", File: "/job/train.py", Line: 10, Samples: 3, TID: 7, Role: RoleFeeder},
		{Function: "augment", File: "/job/train.py", Line: 10, Samples: 1, TID: 7, Role: RoleFeeder},
		{Function: "collect", File: "/job/train.py", Line: 10, Samples: 1, TID: 7, Role: RoleFeeder, GC: true},
	}
	if len(g.Code) != len(want) {
		t.Fatalf("code %+v, want %+v", g.Code, want)
	}
	for i := range want {
		if g.Code[i] != want[i] {
			t.Errorf("code[%d] = %+v, want %+v", i, g.Code[i], want[i])
		}
	}

	lock := Gap{TID: 7, Start: 10, End: 30, Cause: CauseLock, Breakdown: map[Cause]int64{CauseLock: 20},
		Evidence: Evidence{LockHolders: []LockHolderEvidence{{TID: 8, NS: 20}}}}
	s.attachCode(&lock)
	h := lock.Evidence.LockHolders[0].Code
	if len(h) != 1 || h[0].Function != "hold_gil" || h[0].Samples != 2 || h[0].Role != RoleHolder {
		t.Errorf("holder code %+v, want hold_gil ×2 (holder)", h)
	}
	if n := len(lock.Code); n != 3 || lock.Code[2].Role != RoleHolder {
		t.Errorf("lock gap code %+v, want the feeder's two sites then the holder's", lock.Code)
	}

	io := Gap{TID: 7, Start: 10, End: 50, Cause: CauseIORead, Breakdown: map[Cause]int64{CauseIORead: 40},
		Evidence: Evidence{Stack: []event.Frame{{Function: "read_batch"}}}}
	s.attachCode(&io)
	if io.Code != nil {
		t.Errorf("io gap with a stack got code %+v", io.Code)
	}
	fault := Gap{TID: 7, Start: 10, End: 50, Cause: CauseIORead, Breakdown: map[Cause]int64{CauseIORead: 40}}
	s.attachCode(&fault)
	if len(fault.Code) == 0 {
		t.Error("io gap without a blocking stack (page faults) got no code")
	}
}

// TestSamplesBounded: a thread's samples older than sampleKeep behind its
// newest are dropped, and a thread that stopped is swept.
func TestSamplesBounded(t *testing.T) {
	var s samples
	old := sampleAt(9, 1, "gone", false)
	s.add(&old)
	for i := int64(0); i < 4096; i++ {
		ev := sampleAt(7, sampleKeep+10+i, "loop", false)
		s.add(&ev)
	}
	if _, ok := s.byTID[9]; ok {
		t.Error("a thread silent for longer than sampleKeep was kept")
	}
	ev := sampleAt(7, 3*sampleKeep, "loop", false)
	s.add(&ev)
	if l := s.byTID[7]; len(l) != 1 {
		t.Errorf("%d samples kept, want only the newest", len(l))
	}
}

// TestCodeNamesCaller: a helper that burns the time for two callers is
// listed once per caller, each named (the site reads "burn ← caller"); a
// sample whose stack holds no frame of the job's code above the helper
// has no caller.
func TestCodeNamesCaller(t *testing.T) {
	var s samples
	stack := func(caller string) []event.Frame {
		st := []event.Frame{
			{Function: "PyObject_Call", File: "/usr/lib/libpython3.12.so.1.0"},
			{Function: "burn", File: "/job/util.py", Line: 30},
		}
		if caller != "" {
			st = append(st, event.Frame{Function: caller, File: "/job/train.py", Line: 84},
				event.Frame{Function: "main", File: "/job/train.py", Line: 120})
		}
		return st
	}
	for i, at := range []int64{11, 12, 13, 14, 15, 16} {
		caller := "tokenize_batch"
		switch {
		case i == 5:
			caller = ""
		case i >= 3:
			caller = "summarize"
		}
		ev := event.Event{Kind: event.KindCPUSample, PID: 1, TID: 7, Start: at, End: at, Stack: stack(caller)}
		s.add(&ev)
	}
	got := s.code(7, 10, 20, RoleFeeder)
	want := []string{"util.py:30 burn ← tokenize_batch", "util.py:30 burn ← summarize", "util.py:30 burn"}
	if len(got) != len(want) {
		t.Fatalf("code %+v, want sites %q", got, want)
	}
	for i, w := range want {
		if got[i].Site() != w {
			t.Errorf("code[%d] site %q, want %q", i, got[i].Site(), w)
		}
	}
	if c := got[0].Caller; c == nil || c.Function != "tokenize_batch" || c.File != "/job/train.py" || c.Line != 84 || got[0].Samples != 3 {
		t.Errorf("code[0] = %+v (caller %+v), want caller tokenize_batch at /job/train.py:84 ×3", got[0], got[0].Caller)
	}
	if got[2].Caller != nil {
		t.Errorf("code[2] caller %+v, want none", got[2].Caller)
	}
	// The caller is an object with the function's name in the gap's JSON:
	// what reads the gap finds the function by its name.
	raw, err := json.Marshal(got[0])
	if err != nil || !strings.Contains(string(raw), `"caller":{"function":"tokenize_batch","file":"/job/train.py","line":84}`) {
		t.Errorf("code[0] JSON %s (%v), want its caller as an object", raw, err)
	}
}
