package record

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// TestRecordingDecoratorRecordsEveryInput feeds a real recording through
// Wrap(engine, writer) and checks that the new recording holds the
// same calls, in order, and that the engine behind it summed up the same
// as a plain replay.
func TestRecordingDecoratorRecordsEveryInput(t *testing.T) {
	f, err := os.Open("../testdata/recordings/sim-ddp-lite.rec.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, calls, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rec := NewWriter(&buf, h)
	in := Wrap(correlate.New(h.Config(), correlate.Tee{}), rec)
	got := feed(in, slices.Values(calls))
	if err := rec.Close(0); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	want := Replay(h.Config(), correlate.Tee{}, calls)
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if !bytes.Equal(gj, wj) {
		t.Fatalf("summary through the decorator differs:\n got %s\nwant %s", gj, wj)
	}

	h2, calls2, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h2, h) {
		t.Errorf("header %+v, want %+v", h2, h)
	}
	if calls[len(calls)-1].Close == 0 { // feed closes one second after the last Advance
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
