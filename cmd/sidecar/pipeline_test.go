package main

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

func TestWindowsWriterRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "windows.jsonl")
	ww, err := newWindowsWriter(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	in := []event.GPUWindow{
		{Device: 0, UUID: "GPU-a", Start: 100, End: 300, IdleFraction: 0.25, Source: event.SourceNVML, SMActivity: -1, TensorActivity: -1},
		{Device: 1, UUID: "GPU-b", Start: 300, End: 400, IdleFraction: 0.9, Source: event.SourceGPM, SMActivity: 0.1, TensorActivity: 0},
	}
	for _, w := range in {
		ww.write(w)
	}
	if err := ww.close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []windowJSON
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var w windowJSON
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, w)
	}
	if len(got) != len(in) {
		t.Fatalf("got %d windows, want %d", len(got), len(in))
	}
	for i, w := range in {
		g := got[i]
		if g.Device != w.Device || g.UUID != w.UUID || g.Start != w.Start || g.End != w.End ||
			g.IdleFraction != w.IdleFraction || g.Source != w.Source.String() || g.SMActivity != w.SMActivity {
			t.Errorf("window %d: got %+v, want %+v", i, g, w)
		}
	}
}

func TestWindowsWriterReportsWriteErrors(t *testing.T) {
	if _, err := newWindowsWriter(filepath.Join(t.TempDir(), "missing", "w.jsonl"), slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("creating a windows file in a missing directory succeeded")
	}
}

// TestEngineClock: the engine follows what the tracer delivered, never the
// wall clock ahead of it, but never trails the wall clock by more than
// maxReaderLag: a ring buffer that is never empty (so never "caught up")
// must not freeze steps and gaps.
func TestEngineClock(t *testing.T) {
	const s = int64(time.Second)
	now := 100 * s
	for _, c := range []struct {
		delivered, want int64
	}{
		{now - s/2, now - s/2},  // a reader half a second behind: wait for it
		{now + s, now},          // delivered after now: never ahead of the wall clock
		{0, now - 2*s},          // never caught up yet
		{now - 30*s, now - 2*s}, // caught up long ago, busy since
		{now - 2*s, now - 2*s},  // at the bound
		{now - 2*s + 1, now - 2*s + 1},
	} {
		if got := engineClock(now, c.delivered); got != c.want {
			t.Errorf("engineClock(now, now%+v) = now%+v, want now%+v", time.Duration(c.delivered-now), time.Duration(got-now), time.Duration(c.want-now))
		}
	}
}
