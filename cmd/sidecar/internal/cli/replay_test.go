package cli

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// recordings is correlate's committed recordings, absolute: the harness
// runs each command in a directory of its own.
var recordings = func() string {
	p, err := filepath.Abs("../../../../correlate/testdata/recordings")
	if err != nil {
		panic(err)
	}
	return p
}()

// replaySummary runs `gaptrace replay [args] rec --summary-json` and reads
// the summary back.
func replaySummary(t *testing.T, rec string, args ...string) correlate.Summary {
	t.Helper()
	h := newHarness(t)
	out := filepath.Join(t.TempDir(), "summary.json")
	argv := append(append([]string{"replay"}, args...), filepath.Join(recordings, rec), "--summary-json", out)
	if code := h.main(context.Background(), argv...); code != ExitOK {
		t.Fatalf("gaptrace %s: exit %d\n%s", strings.Join(argv, " "), code, h.stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var sum correlate.Summary
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	return sum
}

// TestReplaySummaryLosses: the summary file names the engine's losses,
// zeros included. The recorded H200 job's reader delivered 184 events
// after the watermark had passed them; the simulated DDP run none.
func TestReplaySummaryLosses(t *testing.T) {
	for _, c := range []struct {
		rec  string
		late float64
	}{{"h200-acc-full.rec.gz", 184}, {"sim-ddp-full.rec.gz", 0}} {
		h := newHarness(t)
		out := filepath.Join(t.TempDir(), "summary.json")
		if code := h.main(context.Background(), "replay", filepath.Join(recordings, c.rec), "--summary-json", out); code != ExitOK {
			t.Fatalf("replay %s: exit %d\n%s", c.rec, code, h.stderr)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var s map[string]any
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"late_events", "forced_events", "dropped_intervals", "incomplete_steps", "gaps_after_step"} {
			if _, ok := s[k]; !ok {
				t.Errorf("%s: summary lacks %q", c.rec, k)
			}
		}
		if s["late_events"] != c.late || s["forced_events"] != 0.0 {
			t.Errorf("%s: late_events %v, forced_events %v; want %v and 0", c.rec, s["late_events"], s["forced_events"], c.late)
		}
	}
}

// TestReplayAsLite replays full recordings as lite: each job was also
// recorded at lite (the same program, another run), and the two must
// count the same steps. As auto, the warm-up window is at full and the
// rest lite; a run shorter than the window (sim-onecopy's loop lasts
// half a second) stays at full throughout.
func TestReplayAsLite(t *testing.T) {
	for _, c := range []struct {
		job      string
		pastWarm bool
	}{{"sim-extra-syncs", true}, {"sim-onecopy", false}, {"h200-acc", true}} {
		job := c.job
		t.Run(job, func(t *testing.T) {
			full := replaySummary(t, job+"-full.rec.gz")
			asLite := replaySummary(t, job+"-full.rec.gz", "--probes", "lite")
			lite := replaySummary(t, job+"-lite.rec.gz")
			asAuto := replaySummary(t, job+"-full.rec.gz", "--probes", "auto")
			t.Logf("steps: full %d, as lite %d, lite %d, as auto %d (%.0f%% of the time at full)",
				full.Steps, asLite.Steps, lite.Steps, asAuto.Steps, 100*float64(asAuto.ProbesFullNS)/float64(asAuto.WallNS))
			if full.Probes != correlate.ProbesFull || asLite.Probes != correlate.ProbesLite || asAuto.Probes != correlate.ProbesAuto {
				t.Errorf("summaries name probes %q, %q, %q; want full, lite, auto", full.Probes, asLite.Probes, asAuto.Probes)
			}
			if d := math.Abs(float64(asLite.Steps-lite.Steps)) / float64(lite.Steps); d > 0.05 {
				t.Errorf("the full recording replayed as lite counts %d steps, the lite recording %d: off by %.0f%%",
					asLite.Steps, lite.Steps, 100*d)
			}
			if asAuto.ProbesFullNS <= 0 || asAuto.ProbesFullNS > asAuto.WallNS || (asAuto.ProbesFullNS == asAuto.WallNS) == c.pastWarm {
				t.Errorf("as auto, %d of %d ns at full: want the warm-up window at full, then lite (past the warm-up: %v)",
					asAuto.ProbesFullNS, asAuto.WallNS, c.pastWarm)
			}
		})
	}
}

// TestReplayProbesErrors: a probe set the recording cannot show, or none
// gaptrace knows, is a usage error that says what to do.
func TestReplayProbesErrors(t *testing.T) {
	for _, c := range []struct {
		rec, probes, want string
	}{
		{"sim-onecopy-lite.rec.gz", "full", "made with --probes lite: it holds no kernel launches"},
		{"sim-onecopy-lite.rec.gz", "auto", "replay it as lite"},
		{"h200-loops-eager-auto.rec.gz", "full", "replay it as auto or lite"},
		{"sim-onecopy-full.rec.gz", "medium", `--probes "medium": want full, lite or auto`},
	} {
		h := newHarness(t)
		code := h.main(context.Background(), "replay", "--probes", c.probes, filepath.Join(recordings, c.rec))
		if code != ExitUsage || !strings.Contains(h.stderr.String(), c.want) {
			t.Errorf("replay --probes %s %s: exit %d, stderr %q; want exit %d and %q", c.probes, c.rec, code, h.stderr, ExitUsage, c.want)
		}
	}
}
