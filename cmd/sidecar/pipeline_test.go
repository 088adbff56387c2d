package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestWindowsWriterRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "windows.jsonl")
	ww, err := newWindowsWriter(path)
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
	if _, err := newWindowsWriter(filepath.Join(t.TempDir(), "missing", "w.jsonl")); err == nil {
		t.Fatal("creating a windows file in a missing directory succeeded")
	}
}
