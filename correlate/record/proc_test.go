package record

import (
	"bytes"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// TestProcRecordReplayed: a recording holds a process state record from
// another sidecar as it came, and its call passes the recording's check.
func TestProcRecordReplayed(t *testing.T) {
	want := correlate.PeerRecord{Kind: correlate.PeerProc, PID: 42, State: "stopped", At: 1_700_000_000_000_000_000}
	var buf bytes.Buffer
	w := NewWriter(&buf, Header{})
	w.Peer("host/rank1/7", []correlate.PeerRecord{want})
	if err := w.Close(1); err != nil {
		t.Fatal(err)
	}
	_, calls, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var got []correlate.PeerRecord
	for _, c := range calls {
		if c.Peer != nil {
			if err := Check(&c); err != nil {
				t.Fatalf("recorded call fails its check: %v", err)
			}
			got = append(got, c.Peer.Recs...)
		}
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("replayed %+v, want the state record", got)
	}
}
