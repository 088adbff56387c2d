package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
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

// awaitDetach stops waiting at its deadline for a detach that never ends,
// and says that the kernel detaches the rest at exit; a detach that ended
// reports its own result, even past the deadline; without a deadline it
// waits for the detach, however long.
func TestAwaitDetach(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	returned := make(chan error, 1)
	go func() { returned <- awaitDetach(make(chan error), time.Now().Add(20*time.Millisecond), log) }()
	select {
	case err := <-returned:
		if err != nil {
			t.Errorf("a detach given up on reported %v; it is not an error: the kernel finishes it", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("awaitDetach still waits, long past its deadline, for a detach that never ends")
	}
	// Debug, not a warning: most runs of a loaded host get here, and
	// nothing is wrong.
	if !strings.Contains(logs.String(), "level=DEBUG") || !strings.Contains(logs.String(), "the kernel detaches the rest when gaptrace exits") {
		t.Errorf("giving up is not logged (at debug level) with who finishes the detach:\n%s", &logs)
	}

	boom := errors.New("close uprobe link: boom")
	for _, by := range []time.Time{time.Now().Add(time.Minute), time.Now().Add(-time.Second)} {
		done := make(chan error, 1)
		done <- boom
		if err := awaitDetach(done, by, log); !errors.Is(err, boom) {
			t.Errorf("deadline in %v: a detach that ended with %v reported %v", time.Until(by).Round(time.Second), boom, err)
		}
	}

	done := make(chan error)
	go func() { returned <- awaitDetach(done, time.Time{}, log) }()
	select {
	case err := <-returned:
		t.Fatalf("without a deadline, awaitDetach returned %v before the detach ended", err)
	default:
	}
	done <- nil
	if err := <-returned; err != nil {
		t.Errorf("a clean detach reported %v", err)
	}
}

func TestPeersLine(t *testing.T) {
	for _, tc := range []struct {
		st   peers.Stats
		want string
	}{
		{peers.Stats{Role: "hub", Peers: 1}, "serving 10.0.0.5:29601, 1 other sidecar"},
		{peers.Stats{Role: "member", Peers: 3, OffsetNS: 1500}, "joined 10.0.0.5:29601, 3 other sidecars, clock offset 2µs"},
		{peers.Stats{Role: "connecting", Dropped: 12}, "connecting to 10.0.0.5:29601, 12 records dropped"},
		{peers.Stats{Role: "hub", Peers: 2, Rejected: 1024}, "serving 10.0.0.5:29601, 2 other sidecars, 1024 records rejected"},
	} {
		if got := peersLine("10.0.0.5:29601", tc.st); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.st, got, tc.want)
		}
	}
}
