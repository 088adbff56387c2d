package stepclock

import (
	"slices"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

var siteStack = []event.Frame{
	{Function: "clock_nanosleep", File: "/usr/lib/x86_64-linux-gnu/libc.so.6"},
	{Function: "Trainer.item", File: "/work/jobs/hf_trainer.py", Line: 58},
	{Function: "Trainer.log", File: "/work/jobs/hf_trainer.py", Line: 61},
	{Function: "run_loop", File: "/opt/app/bin/trainer"}, // native, no line
	{Function: "main", File: "/work/jobs/hf_trainer.py", Line: 108},
}

// TestSiteOfSpelling: a site's key is its frames' "base:line function"
// joined by "<" (a frame without a line spelled with its line, 0), its
// name the innermost frame, its frames the names a person reads.
func TestSiteOfSpelling(t *testing.T) {
	s := SiteOf(siteStack)
	if want := "hf_trainer.py:58 Trainer.item<hf_trainer.py:61 Trainer.log<trainer:0 run_loop<hf_trainer.py:108 main"; s.Key != want {
		t.Errorf("key %q, want %q", s.Key, want)
	}
	if s.Name != "hf_trainer.py:58 Trainer.item" {
		t.Errorf("name %q", s.Name)
	}
	want := []string{"hf_trainer.py:58 Trainer.item", "hf_trainer.py:61 Trainer.log", "trainer run_loop", "hf_trainer.py:108 main"}
	if !slices.Equal(s.Frames, want) {
		t.Errorf("frames %q, want %q", s.Frames, want)
	}
	if got := SiteOf(siteStack[3:4]); got.Key != "" || got.Name != "" || got.Frames != nil {
		t.Errorf("innermost frame without a line: %+v, want the zero Site", got)
	}
	if got := SiteOf(siteStack[:1]); got.Key != "" || got.Frames != nil {
		t.Errorf("system code only: %+v, want the zero Site", got)
	}
}

// BenchmarkSiteOf: every sync and blocking copy with a stack is keyed
// (8 ranks: a quarter of the engine's allocations were these names).
func BenchmarkSiteOf(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = SiteOf(siteStack)
	}
}
