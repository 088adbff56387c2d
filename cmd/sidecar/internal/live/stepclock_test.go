package live

import (
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// The live view and the summary name what the steps are counted by, and
// how to pin a found site.
func TestFrameStepClock(t *testing.T) {
	v := View{Title: "t", IdlePct: -1, CPUPct: -1, StepClocks: []correlate.StepClock{
		{PID: 7, Source: "call_site", Site: "train.py:42 main", Steps: 90},
		{PID: 8, Source: "work_pattern", Site: "every 1 syncs", Steps: 10},
	}}
	got := Frame(v, 120)
	want := "step clock: call_site · train.py:42 main (pin with --step-at train.py:42) · 2 processes"
	if !strings.Contains(got, want) {
		t.Fatalf("frame lacks %q:\n%s", want, got)
	}
	v.StepClocks = []correlate.StepClock{{PID: 7, Source: "declared", Site: "train.py:42 main", Steps: 90}}
	if got := Frame(v, 120); !strings.Contains(got, "step clock: declared · train.py:42 main\n") {
		t.Fatalf("declared site shown as:\n%s", got)
	}
	v.StepClocks = nil
	if got := Frame(v, 120); strings.Contains(got, "step clock") {
		t.Fatalf("a step clock line with none known:\n%s", got)
	}
	if p := PinSite(correlate.StepClock{Site: "simtrain main"}); p != "" {
		t.Fatalf("pin %q of a site without a line", p)
	}
}
