package live

import (
	"strings"
	"testing"
	"time"
)

// An ongoing hang is a banner at the top of the frame; every hang's time
// is a line of its own, in the summary too, and in the log line.
func TestHangBannerAndLine(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	a.SetHang(Hang{ID: "h1", Text: "pid 7 tid 7 in cuStreamSynchronize; missing: rank 1 (pid 9, stopped)", Seconds: 12, Ongoing: true})
	f := Frame(a.View("job"), 100)
	lines := strings.Split(f, "\n")
	if !strings.HasPrefix(lines[2], "!! HANG 12s: pid 7 tid 7 in cuStreamSynchronize; missing: rank 1") {
		t.Errorf("no banner under the header:\n%s", f)
	}
	if !strings.Contains(f, "hangs: 1 (1 ongoing), 12.0 s hung") {
		t.Errorf("no hang line:\n%s", f)
	}
	if l := LogLine(a.View("job")); !strings.Contains(l, " hangs=1 hangs_ongoing=1 hung_s=12.0") {
		t.Errorf("log line %q", l)
	}
	a.SetHang(Hang{ID: "h1", Text: "x", Seconds: 15})
	s := Summary(a.View("job"), Outputs{}, 100)
	if strings.Contains(s, "!! HANG") || !strings.Contains(s, "hangs: 1 (0 ongoing), 15.0 s hung") {
		t.Errorf("summary after the hang ended:\n%s", s)
	}
}
