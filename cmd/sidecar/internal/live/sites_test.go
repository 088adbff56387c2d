package live

import (
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

func TestCallSitesChargeGapsToTheirUserFrame(t *testing.T) {
	a := NewAggregator(func() time.Time { return time.Unix(100, 0) })
	ckpt := []event.Frame{
		{Function: "write", File: "/usr/lib/x86_64-linux-gnu/libc.so.6"},
		{Function: "save_checkpoint", File: "/job/train.py", Line: 142},
		{Function: "main", File: "/job/train.py", Line: 210},
	}
	for i := 0; i < 12; i++ {
		a.Gap(correlate.Gap{Cause: correlate.CauseIOWrite, Duration: 150e6,
			Breakdown: map[correlate.Cause]int64{correlate.CauseIOWrite: 140e6, correlate.CauseCPU: 10e6},
			Evidence:  correlate.Evidence{Stack: ckpt}})
	}
	a.Gap(correlate.Gap{Cause: correlate.CauseCPU, Duration: 5e6,
		Evidence: correlate.Evidence{Stack: []event.Frame{{Function: "main", File: "/job/train.py", Line: 200}}}})
	a.Gap(correlate.Gap{Cause: correlate.CauseCPU, Duration: 500e6}) // no stack: no site

	sites := a.CallSites(10)
	if len(sites) != 2 {
		t.Fatalf("sites %+v", sites)
	}
	s := sites[0]
	if s.Site != "train.py:142 save_checkpoint" || s.Gaps != 12 || s.NS != 12*150e6 ||
		s.ByCause[correlate.CauseIOWrite] != 12*140e6 || s.Line != 142 || s.File != "/job/train.py" {
		t.Errorf("top site %+v", s)
	}
	out := Summary(a.View("job"), Outputs{}, 100)
	if !strings.Contains(out, "top call sites\n  train.py:142 save_checkpoint — 12 gaps, 1.68 s io.write, 120 ms cpu\n") {
		t.Errorf("summary:\n%s", out)
	}
	if !strings.Contains(LogLine(a.View("job")), "top_site=") {
		t.Errorf("log line names no site")
	}
}

func TestCallSitesStayBounded(t *testing.T) {
	a := NewAggregator(nil)
	for i := 0; i < maxTracked+50; i++ {
		a.Gap(correlate.Gap{Cause: correlate.CauseCPU, Duration: int64(i + 1),
			Evidence: correlate.Evidence{Stack: []event.Frame{{Function: "f", File: "/job/a.py", Line: i + 1}}}})
	}
	a.mu.Lock()
	n := len(a.sites)
	a.mu.Unlock()
	if n > maxTracked {
		t.Errorf("%d sites tracked, at most %d", n, maxTracked)
	}
	if top := a.CallSites(1); len(top) != 1 || top[0].Line != maxTracked+50 {
		t.Errorf("the heaviest site was evicted: %+v", top)
	}
}

// TestCodeLineCounts: the last gap's code line counts its samples in
// words a reader expects ("1 sample", "6 samples"), and leaves out code
// of other threads.
func TestCodeLineCounts(t *testing.T) {
	g := &correlate.Gap{Code: []correlate.CodeSample{
		{Function: "collate", File: "/job/train.py", Line: 88, Samples: 6, Role: correlate.RoleFeeder},
		{Function: "burn", File: "/job/train.py", Line: 30, Samples: 1, Role: correlate.RoleFeeder},
		{Function: "save", File: "/job/ckpt.py", Line: 9, Samples: 4, Role: correlate.RoleHolder},
	}}
	want := "code: train.py:88 collate (6 samples), train.py:30 burn (1 sample)"
	if got := codeLine(g); got != want {
		t.Errorf("codeLine = %q, want %q", got, want)
	}
}
