package correlate

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// TestRecordingDecoratorRecordsEveryInput feeds a real recording through
// Recording(engine, recorder) and checks that the new recording holds the
// same calls, in order, and that the engine behind it summed up the same
// as a plain replay.
func TestRecordingDecoratorRecordsEveryInput(t *testing.T) {
	f, err := os.Open("testdata/recordings/sim-ddp-lite.rec.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, calls, err := ReadRecording(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rec := NewRecorder(&buf, h)
	in := Recording(New(h.Config(), Tee{}), rec)
	got := feedCalls(in, slices.Values(calls))
	if err := rec.Close(0); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	want := Replay(h.Config(), Tee{}, calls)
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if !bytes.Equal(gj, wj) {
		t.Fatalf("summary through the decorator differs:\n got %s\nwant %s", gj, wj)
	}

	h2, calls2, err := ReadRecording(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if h2 != h {
		t.Errorf("header %+v, want %+v", h2, h)
	}
	if calls[len(calls)-1].Close == 0 { // feedCalls closes one second after the last Advance
		if n := len(calls2); n == 0 || calls2[n-1].Close == 0 {
			t.Fatal("the decorator's recording ends without its Close")
		}
		calls2 = calls2[:len(calls2)-1]
	}
	if len(calls2) != len(calls) {
		t.Fatalf("%d calls recorded, want %d", len(calls2), len(calls))
	}
	for i := range calls {
		a, _ := json.Marshal(calls[i])
		b, _ := json.Marshal(calls2[i])
		if !bytes.Equal(a, b) {
			t.Fatalf("call %d: recorded %s, want %s", i, b, a)
		}
	}
}
