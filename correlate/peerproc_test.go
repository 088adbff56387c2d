package correlate

import (
	"bytes"
	"strings"
	"testing"
)

func procRec(mod func(*PeerRecord)) PeerRecord {
	r := PeerRecord{Kind: PeerProc, PID: 42, State: "disk-sleep", WChan: "folio_wait_bit_common",
		File: "pread64 /mnt/data/train.bin", At: 1_700_000_000_000_000_000}
	if mod != nil {
		mod(&r)
	}
	return r
}

// TestPeerProcCheck: a process state record is checked field by field.
func TestPeerProcCheck(t *testing.T) {
	good := procRec(nil)
	if err := good.Check(); err != nil {
		t.Fatalf("a good record: %v", err)
	}
	ok := procRec(func(r *PeerRecord) { r.State, r.WChan, r.File, r.Exit = "exited", "", "", "killed by SIGKILL" })
	if err := (&ok).Check(); err != nil {
		t.Fatalf("an exited process: %v", err)
	}
	for name, mod := range map[string]func(*PeerRecord){
		"unknown state":    func(r *PeerRecord) { r.State = "asleep" },
		"no state":         func(r *PeerRecord) { r.State = "" },
		"long file":        func(r *PeerRecord) { r.File = strings.Repeat("a", maxPeerFile+1) },
		"control in file":  func(r *PeerRecord) { r.File = "a\nb" },
		"bad utf-8 exit":   func(r *PeerRecord) { r.Exit = "\xff" },
		"long wchan":       func(r *PeerRecord) { r.WChan = strings.Repeat("w", maxPeerWChan+1) },
		"negative time":    func(r *PeerRecord) { r.At = -1 },
		"time past range":  func(r *PeerRecord) { r.At = maxPeerTime },
		"state on a comm":  func(r *PeerRecord) { r.Kind, r.Rank = PeerComm, 0 },
		"file on an issue": func(r *PeerRecord) { r.Kind, r.State = PeerIssue, "" },
	} {
		if r := procRec(mod); r.Check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestPeerProcIgnoredByEngine: an engine takes no mirror for a process
// state record, and a recording holds it and replays it unchanged.
func TestPeerProcIgnoredByEngine(t *testing.T) {
	e := newEngine(&collect{}, nil)
	e.Peer("host/rank1/7", []PeerRecord{procRec(nil)})
	if n := len(e.mirrors); n != 0 {
		t.Errorf("%d mirrored processes after a state record, want 0", n)
	}
	var buf bytes.Buffer
	rec := NewRecorder(&buf, RecordHeader{})
	rec.Peer("host/rank1/7", []PeerRecord{procRec(nil)})
	if err := rec.Close(1); err != nil {
		t.Fatal(err)
	}
	_, calls, err := ReadRecording(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var got []PeerRecord
	for _, c := range calls {
		if c.Peer != nil {
			if err := CheckCall(&c); err != nil {
				t.Fatalf("recorded call fails its check: %v", err)
			}
			got = append(got, c.Peer.Recs...)
		}
	}
	if len(got) != 1 || got[0] != procRec(nil) {
		t.Errorf("replayed %+v, want the state record", got)
	}
}
