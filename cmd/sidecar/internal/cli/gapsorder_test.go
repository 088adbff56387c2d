package cli

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// TestGapsFileInStartOrder feeds the gaps writer gaps that arrive up to 3 s
// of trace time late, in a shuffled order within that window, as the
// engine can deliver them, and checks the file holds every gap in start
// order, and that gaps are written before Close once the horizon passed.
func TestGapsFileInStartOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gaps.jsonl")
	w, err := newGapsWriter(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	const step = int64(20e6) // a gap every 20 ms: 40 s of trace
	starts := make([]int64, n)
	for i := range starts {
		starts[i] = 1_700_000_000_000_000_000 + int64(i)*step
	}
	// Shuffle within blocks of 150 gaps (3 s).
	rng := rand.New(rand.NewSource(1))
	arrival := slices.Clone(starts)
	for b := 0; b < n; b += 150 {
		blk := arrival[b:min(b+150, n)]
		rng.Shuffle(len(blk), func(i, j int) { blk[i], blk[j] = blk[j], blk[i] })
	}
	for i, s := range arrival {
		w.Gap(correlate.Gap{PID: uint32(1 + i%2), Start: s, End: s + 5e6, Duration: 5e6, Cause: correlate.CauseIORead})
	}
	if w.gaps.Written() == 0 {
		t.Error("nothing written before Close: the reorder window never released")
	}
	if held := w.order.h.Len(); int64(held) > reorderHorizon/step+150 {
		t.Errorf("%d gaps held: more than the horizon needs", held)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var g correlate.Gap
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatal(err)
		}
		got = append(got, g.Start)
	}
	if !slices.Equal(got, starts) {
		t.Errorf("gaps file not in start order or incomplete: %d gaps, first inversions at %v", len(got), firstInversion(got))
	}
}

func firstInversion(v []int64) int {
	for i := 1; i < len(v); i++ {
		if v[i] < v[i-1] {
			return i
		}
	}
	return -1
}
