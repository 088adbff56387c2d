package live

import (
	"strings"
	"testing"
	"time"
)

// The frame's footer says what gaptrace itself costs: CPU as a share of one
// core and records a second, rated from the first stats once those are 5 s
// old (the probes' loading left out), else from the start.
func TestFrameSidecarCost(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	if v := a.View("job"); v.CPUPct != -1 || strings.Contains(Frame(v, 100), "gaptrace itself") {
		t.Fatalf("cost shown before any stats: %v", v.CPUPct)
	}
	c.t = c.t.Add(2 * time.Second)
	a.SetStats(Stats{CPUNS: 1e9, RSSBytes: 40 << 20, EventsRead: 1000})
	// 2 s after the start, the first stats are too fresh: the start-up's
	// second of CPU counts, over 2 s.
	if v := a.View("job"); v.CPUPct != 50 || v.EventsPerSec != 500 {
		t.Errorf("from the start: %.1f%% of a core, %.0f events/s, want 50%%, 500", v.CPUPct, v.EventsPerSec)
	}
	c.t = c.t.Add(10 * time.Second)
	a.SetStats(Stats{CPUNS: 1e9 + 2e8, RSSBytes: 48 << 20, EventsRead: 21000})
	v := a.View("job")
	if v.CPUPct != 2 || v.EventsPerSec != 2000 {
		t.Errorf("from the first stats: %.1f%% of a core, %.0f events/s, want 2%%, 2000", v.CPUPct, v.EventsPerSec)
	}
	if f := Frame(v, 100); !strings.Contains(f, "gaptrace itself: 2.0% of a core · 48.0 MiB peak resident · 2000 events/s") {
		t.Errorf("frame lacks the cost line:\n%s", f)
	}
}
