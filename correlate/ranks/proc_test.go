package ranks

import (
	"strings"
	"testing"
)

func procRec(mod func(*Record)) Record {
	r := Record{Kind: KindProc, PID: 42, State: "disk-sleep", WChan: "folio_wait_bit_common",
		File: "pread64 /mnt/data/train.bin", At: 1_700_000_000_000_000_000}
	if mod != nil {
		mod(&r)
	}
	return r
}

// TestProcRecordCheck: a process state record is checked field by field.
func TestProcRecordCheck(t *testing.T) {
	good := procRec(nil)
	if err := good.Check(); err != nil {
		t.Fatalf("a good record: %v", err)
	}
	ok := procRec(func(r *Record) { r.State, r.WChan, r.File, r.Exit = "exited", "", "", "killed by SIGKILL" })
	if err := (&ok).Check(); err != nil {
		t.Fatalf("an exited process: %v", err)
	}
	for name, mod := range map[string]func(*Record){
		"unknown state":    func(r *Record) { r.State = "asleep" },
		"no state":         func(r *Record) { r.State = "" },
		"long file":        func(r *Record) { r.File = strings.Repeat("a", maxProcFile+1) },
		"control in file":  func(r *Record) { r.File = "a\nb" },
		"bad utf-8 exit":   func(r *Record) { r.Exit = "\xff" },
		"long wchan":       func(r *Record) { r.WChan = strings.Repeat("w", maxProcWChan+1) },
		"negative time":    func(r *Record) { r.At = -1 },
		"time past range":  func(r *Record) { r.At = MaxTime },
		"state on a comm":  func(r *Record) { r.Kind, r.Rank = KindComm, 0 },
		"file on an issue": func(r *Record) { r.Kind, r.State = KindIssue, "" },
	} {
		if r := procRec(mod); r.Check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestProcRecordNotMirrored: the registry takes no mirror for a process
// state record (the hang watch reads them; engines do not).
func TestProcRecordNotMirrored(t *testing.T) {
	reg := New(func(uint32) bool { return true })
	reg.Peer("host/rank1/7", []Record{procRec(nil)})
	if n := len(reg.mirrors); n != 0 {
		t.Errorf("%d mirrored processes after a state record, want 0", n)
	}
}
