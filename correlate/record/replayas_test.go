package record

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

func readRecording(t *testing.T, name string) (Header, []Call) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "testdata", "recordings", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, calls, err := Read(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return h, calls
}

// TestLiteViewIsWhatLiteSaw: a full recording seen as lite holds the kinds
// of events, and the launch counts, that a lite recording of the same job
// (another run of it) holds: no launches, syncs that count none, and every
// kind of event either run made often (a few allocations or file opens
// differ from run to run).
func TestLiteViewIsWhatLiteSaw(t *testing.T) {
	kinds := func(calls []Call, view bool) map[event.Kind]int {
		n := map[event.Kind]int{}
		for _, c := range calls {
			if c.Ev == nil {
				continue
			}
			ev, ok := *c.Ev, true
			if view {
				ev, ok = asLite(ev)
			}
			if !ok {
				continue
			}
			n[ev.Kind]++
			if view && ev.Kind == event.KindSync && ev.Count != 0 {
				t.Fatalf("a sync seen as lite counts %d launches: lite counts none", ev.Count)
			}
		}
		return n
	}
	for _, job := range []string{"sim-extra-syncs", "h200-acc"} {
		_, full := readRecording(t, job+"-full.rec.gz")
		_, lite := readRecording(t, job+"-lite.rec.gz")
		got, want := kinds(full, true), kinds(lite, false)
		for k := range want {
			if want[k] >= 10 && got[k] == 0 {
				t.Errorf("%s: lite saw %d %v events, the full recording seen as lite none", job, want[k], k)
			}
		}
		for k := range got {
			if got[k] >= 10 && want[k] == 0 {
				t.Errorf("%s: the full recording seen as lite has %d %v events, lite saw none", job, got[k], k)
			}
		}
		if kinds(full, false)[event.KindEnqueue] == 0 {
			t.Errorf("%s: the full recording holds no launches: nothing was left out", job)
		}
	}
}

func TestCheckView(t *testing.T) {
	full, lite, auto := correlate.ProbesFull, correlate.ProbesLite, correlate.ProbesAuto
	for _, c := range []struct {
		rec, as string
		ok      bool
	}{
		{"", lite, true}, {full, lite, true}, {full, auto, true}, {full, "", true},
		{auto, lite, true}, {auto, auto, true}, {lite, lite, true},
		{lite, full, false}, {lite, auto, false}, {auto, full, false},
		{full, "null", false},
	} {
		err := CheckView(Header{Probes: c.rec}, View{Probes: c.as, Window: 1, WarmupSteps: 1, WarmupMax: 1})
		if (err == nil) != c.ok {
			t.Errorf("recorded %q, replayed as %q: error %v, want ok %v", c.rec, c.as, err, c.ok)
		}
	}
	if CheckView(Header{Probes: full}, View{Probes: auto}) == nil {
		t.Errorf("auto without a warm-up window: no error")
	}
}
