package attribute

import "testing"

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
