package correlate_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
)

// A recording of the prefetch_queue cross-check trainer on the simulated
// GPU (test/crosscheck/jobs/prefetch_queue.py, 240 steps, --probes full):
// its loop syncs only by reading the loss back with a synchronous
// cuMemcpyDtoH, which lite takes as the sync it is; its metrics thread
// sleeps holding a lock the loop waits for, and the gap names the
// holder's sleeping code.

type codedStall struct {
	loadedStall
	code string
}

func readCodedStalls(t *testing.T, path string) []codedStall {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []codedStall
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Type       string `json:"type"`
			Cause      string `json:"cause"`
			Code       string `json:"code"`
			Start, End int64
			RunDelay   int64 `json:"run_delay_ns"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if r.Type == "stall" {
			out = append(out, codedStall{loadedStall{correlate.Cause(r.Cause), r.Start, r.End, r.RunDelay}, r.Code})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// namesCode says whether a gap's JSON names function fn (a frame's or a
// sample's function, qualified or not).
func namesCode(t *testing.T, g correlate.Gap, fn string) bool {
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Contains(s, `"`+fn+`"`) || strings.Contains(s, "."+fn+`"`)
}

func TestSyncReadBackAndSleepingHolder(t *testing.T) {
	const name = "sim-prefetch_queue-full"
	dir := filepath.Join("testdata", "crosscheck")
	stalls := readCodedStalls(t, filepath.Join(dir, name+".truth.jsonl"))
	byCode := map[string][]loadedStall{}
	for _, s := range stalls {
		byCode[s.code] = append(byCode[s.code], s.loadedStall)
	}
	if len(byCode) != 5 {
		t.Fatalf("stall kinds %d, want the job's 5", len(byCode))
	}
	shares := map[string]map[string]float64{}
	for _, as := range []string{"full", "lite", "auto"} {
		gaps := replayCrossCheck(t, filepath.Join(dir, name+".rec.gz"), as)
		shares[as] = map[string]float64{}
		for code, ss := range byCode {
			shares[as][code] = loadedShare(ss, gaps)
			named := 0
			for _, s := range ss {
				for _, g := range gaps {
					if g.End > s.start && g.Start < s.end && namesCode(t, g, code) {
						named++
						break
					}
				}
			}
			t.Logf("%s %s: %d stalls, %.3f of their time given %s, %d named", as, code, len(ss), shares[as][code], ss[0].cause, named)
			// The sleeping holder's code, from the stack of its sleep.
			if code == "flush_metrics" && named < len(ss)*9/10 {
				t.Errorf("%s: flush_metrics named over %d of %d lock stalls, want ≥ 90%%", as, named, len(ss))
			}
		}
	}
	for code := range byCode {
		full := shares["full"][code]
		for _, as := range []string{"lite", "auto"} {
			// Lite sees the loop's syncs (its loss reads) as full does.
			if got := shares[as][code]; !(got >= full-0.1) {
				t.Errorf("%s %s: %.3f of the stalls' time given their cause, full %.3f", as, code, got, full)
			}
		}
	}
	for _, code := range []string{"flush_metrics", "decode_samples"} {
		if got := shares["lite"][code]; !(got >= 0.9) {
			t.Errorf("lite %s: %.3f given lock, want ≥ 0.9", code, got)
		}
	}
}

// replayCrossCheck replays a cross-check recording as probe set as.
func replayCrossCheck(t *testing.T, path, as string) []correlate.Gap {
	t.Helper()
	h, calls, cfg := readRecording(t, path)
	var sink gapSink
	v := record.View{Probes: as, Window: 500 * time.Millisecond, WarmupSteps: 5, WarmupMax: 10 * time.Second}
	if _, err := record.ReplayAs(cfg, &sink, h, calls, v); err != nil {
		t.Fatal(err)
	}
	return sink.gaps
}

// The same job's checkpoint writes 1024 blocks of 8 KiB and fsyncs: most
// writes are shorter than the tracer's threshold, so the save's gap held
// them as cpu; the thread's CPU samples inside libc's write wrapper say
// which share of that time was writing.
func TestShortWritesFromSamples(t *testing.T) {
	const name = "sim-prefetch_queue-full"
	dir := filepath.Join("testdata", "crosscheck")
	var saves []loadedStall
	for _, s := range readCodedStalls(t, filepath.Join(dir, name+".truth.jsonl")) {
		if s.code == "save_checkpoint" {
			saves = append(saves, s.loadedStall)
		}
	}
	if len(saves) == 0 {
		t.Fatal("no checkpoint stalls in the truth")
	}
	for _, as := range []string{"full", "lite", "auto"} {
		gaps := replayCrossCheck(t, filepath.Join(dir, name+".rec.gz"), as)
		share := loadedShare(saves, gaps)
		t.Logf("%s: %d saves, %.3f of their time given io.write", as, len(saves), share)
		if !(share >= 0.85) {
			t.Errorf("%s: %.3f of the saves' time given io.write, want ≥ 0.85", as, share)
		}
	}
}
