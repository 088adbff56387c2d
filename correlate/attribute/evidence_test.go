package attribute

import (
	"fmt"
	"slices"
	"testing"
)

func TestDominant(t *testing.T) {
	for _, tc := range []struct {
		name string
		bd   map[Cause]int64
		want Cause
	}{
		{"no time", nil, CauseCPU},
		{"only zero and negative", map[Cause]int64{CauseNet: 0, CauseSleep: -5}, CauseCPU},
		{"most time", map[Cause]int64{CauseCPU: 10, CauseNet: 30, CauseIOWrite: 20}, CauseNet},
		// io.read comes before cpu in Causes, cpu before sleep.
		{"tie: first in Causes", map[Cause]int64{CauseSleep: 40, CauseCPU: 40, CauseIORead: 40}, CauseIORead},
		{"tie behind the leader", map[Cause]int64{CauseSleep: 50, CauseCPU: 40, CauseIORead: 40}, CauseSleep},
	} {
		if got := Dominant(tc.bd); got != tc.want {
			t.Errorf("%s: Dominant(%v) = %s, want %s", tc.name, tc.bd, got, tc.want)
		}
	}
}

func TestTopFiles(t *testing.T) {
	var files []FileEvidence
	for i := range maxFiles + 2 {
		files = append(files, FileEvidence{Path: fmt.Sprintf("/d/%02d", maxFiles+1-i), Op: "read", NS: 10})
	}
	files = append(files, FileEvidence{Path: "/d/05", Op: "fault", NS: 10}, FileEvidence{Path: "/d/99", Op: "read", NS: 20})
	got := TopFiles(files)
	if len(got) != maxFiles {
		t.Fatalf("%d files kept, want %d", len(got), maxFiles)
	}
	want := []string{"/d/99 read", "/d/00 read", "/d/01 read", "/d/02 read", "/d/03 read", "/d/04 read", "/d/05 fault", "/d/05 read"}
	for i, f := range got {
		if s := f.Path + " " + f.Op; s != want[i] {
			t.Errorf("file %d is %s, want %s (longest first, then by path and op)", i, s, want[i])
		}
	}
}

// TestTopKeys: the keys with the largest values first, ties by key, at
// most n.
func TestTopKeys(t *testing.T) {
	m := map[string]int{"read": 3, "write": 7, "futex": 3, "poll": 1}
	if got := topKeys(m, 3); !slices.Equal(got, []string{"write", "futex", "read"}) {
		t.Errorf("top 3: %q", got)
	}
	if got := topKeys(m, 10); len(got) != 4 {
		t.Errorf("top 10 of 4: %q", got)
	}
	if got := topKeys(map[string]int64{}, 2); len(got) != 0 {
		t.Errorf("top of none: %q", got)
	}
}
