package live

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// hostile is a file name a traced program can create: a terminal title
// write, an OSC 52 clipboard write, a screen clear, a forged log line, a
// bidi override and bytes that are not UTF-8.
const hostile = "/data/\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J\nlevel=ERROR msg=forged \u202etxt.exe\xff\xfe\x9b"

func assertInert(t *testing.T, what, out string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\u202e", "\xff", "\u009b", "\nlevel=ERROR"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s carries %q from a target-controlled string:\n%q", what, bad, out)
		}
	}
}

func TestTargetStringsAreInertOnTheTerminal(t *testing.T) {
	a := NewAggregator(nil)
	a.Gap(correlate.Gap{Duration: 5e6, Cause: correlate.CauseIORead, Evidence: correlate.Evidence{
		Files: []correlate.FileEvidence{{Path: hostile, Op: "read\x1b[2J", NS: 5e6}},
		Peers: []correlate.PeerEvidence{{Address: "10.0.0.1:80", PID: 9, Comm: "evil\x1b]0;t\x07", NS: 4e6}},
	}})
	a.Step(correlate.StepResult{Step: correlate.Step{Start: 0, End: int64(time.Second), IdleNS: 5e6, ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 5e6}}})
	a.SetStats(Stats{Missing: []string{"/lib/\x1b[2Jlibcuda.so: symbol cuX\x1b]0;t\x07"}})
	v := a.View("pid 1 train \x1b]0;title\x07 --x")
	assertInert(t, "frame", Frame(v, 100))
	assertInert(t, "summary", Summary(v, Outputs{Spans: "/o/\x1b[2J"}, 100))
	line := LogLine(v)
	assertInert(t, "log line", line)
	if strings.Count(line, "\n") != 0 || strings.Contains(line, " level=ERROR") {
		t.Errorf("log line can be split or extended by a file name: %q", line)
	}
	if !strings.Contains(Frame(v, 120), `ZWNobyBoaQ==\a\x1b[2J\n`) {
		t.Errorf("escaped file name not shown:\n%s", Frame(v, 120))
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"/data/shard-1.bin": "/data/shard-1.bin",
		"/données/é":        "/données/é",
		"a\nb":              `a\nb`,
		"\x1b[31m":          `\x1b[31m`,
		"x\xffy":            `x\xffy`,
		"\u202e":            `\u202e`,
		"\u0085":            `\u0085`,
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}

// A job that touches a new file in every gap must not grow the view
// without bound; the file that blocks most stays named, and the others
// row keeps the totals whole.
func TestFileTableBounded(t *testing.T) {
	a := NewAggregator(nil)
	heavy := correlate.Gap{Duration: 1e9, Cause: correlate.CauseIORead, Evidence: correlate.Evidence{
		Files: []correlate.FileEvidence{{Path: "/data/big.bin", Op: "read", NS: 1e9, Bytes: 1 << 30, Calls: 1}}}}
	a.Gap(heavy)
	const n = 100000
	for i := range n {
		a.Gap(correlate.Gap{Duration: 1000, Cause: correlate.CauseIORead, Evidence: correlate.Evidence{
			Files: []correlate.FileEvidence{{Path: "/tmp/f" + strconv.Itoa(i), Op: "read", NS: 1000, Bytes: 1, Calls: 1}},
			Peers: []correlate.PeerEvidence{{Address: "10.0.0.1:" + strconv.Itoa(i), NS: 500, Calls: 1}}}})
	}
	if len(a.files) > maxTracked || len(a.peers) > maxTracked {
		t.Fatalf("tracking %d files and %d peers, bound %d", len(a.files), len(a.peers), maxTracked)
	}
	v := a.View("t")
	if len(v.TopFiles) != 5 || v.TopFiles[0].Name != "/data/big.bin" {
		t.Fatalf("top files %+v: the heaviest file must stay named", v.TopFiles)
	}
	if v.OtherFiles == nil || v.OtherFiles.Name != "(other files)" || v.OtherPeers == nil {
		t.Fatalf("no others row: %+v %+v", v.OtherFiles, v.OtherPeers)
	}
	var ns int64
	calls := 0
	for _, f := range v.TopFiles {
		ns += f.NS
		calls += f.Calls
	}
	ns += v.OtherFiles.NS
	calls += v.OtherFiles.Calls
	if ns != 1e9+n*1000 || calls != n+1 {
		t.Errorf("top + others = %d ns, %d calls; want %d, %d", ns, calls, int64(1e9+n*1000), n+1)
	}
	if f := Frame(v, 100); !strings.Contains(f, "(other files)") || !strings.Contains(f, "(other peers)") {
		t.Errorf("frame lacks the others rows:\n%s", f)
	}
}
