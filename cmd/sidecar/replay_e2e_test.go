package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gapKeys reads a gaps file as "start end cause" lines, in file order.
func gapKeys(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var g struct {
			Start int64  `json:"start_unix_nano"`
			End   int64  `json:"end_unix_nano"`
			Cause string `json:"cause"`
		}
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		keys = append(keys, fmt.Sprintf("%d %d %s", g.Start, g.End, g.Cause))
	}
	return keys
}

// TestRecordReplayReproducesTheRun records a traced simtrain run with
// --record and replays the recording with `gaptrace replay`: the replay
// must emit exactly the run's gaps (times and causes) and the same step
// count, without privileges or a job; a cut recording still replays what
// it holds and says it was cut.
func TestRecordReplayReproducesTheRun(t *testing.T) {
	need(t)
	dir := t.TempDir()
	rec, gaps, sum := filepath.Join(dir, "run.rec.gz"), filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "summary.json")
	args := append([]string{"run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--record", rec, "--gaps-out", gaps, "--summary-json", sum, "--spans-out", filepath.Join(dir, "spans.jsonl"), "--"},
		simtrain("--steps", "40", "--kernel-us", "1000", "--stall", "io.read:every=4:ms=20", "--stall", "sleep:every=7:ms=15", "--quiet")...)
	if code, stdout, stderr := runGaptrace(t, env(t), args...); code != 0 {
		t.Fatalf("run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	want := gapKeys(t, gaps)
	if len(want) < 8 {
		t.Fatalf("the run emitted only %d gaps: too few to compare", len(want))
	}

	gaps2, sum2 := filepath.Join(dir, "replayed.jsonl"), filepath.Join(dir, "replayed.json")
	code, stdout, stderr := runGaptrace(t, os.Environ(), "replay", rec, "--gaps-out", gaps2, "--summary-json", sum2)
	if code != 0 {
		t.Fatalf("replay: exit %d\n%s\n%s", code, stdout, stderr)
	}
	got := gapKeys(t, gaps2)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("replay emitted %d gaps, the run %d; first of each:\nrun    %v\nreplay %v", len(got), len(want), want[:min(3, len(want))], got[:min(3, len(got))])
	}
	steps := func(path string) int {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Steps int `json:"steps"`
		}
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		return s.Steps
	}
	if a, b := steps(sum), steps(sum2); a != b || a == 0 {
		t.Errorf("steps: run %d, replay %d", a, b)
	}
	if !strings.Contains(stdout, "replay of") || !strings.Contains(stdout, "io.read") {
		t.Errorf("replay summary lacks its title or causes:\n%s", stdout)
	}

	// A recording cut in the middle (the sidecar was killed) replays the
	// calls before the cut and warns.
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.rec.gz")
	if err := os.WriteFile(cut, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runGaptrace(t, os.Environ(), "replay", cut)
	if code != 0 || !strings.Contains(stderr, "warning") || !strings.Contains(stdout, "summary") {
		t.Errorf("cut recording: exit %d, want 0 with a warning and a summary\n%s\n%s", code, stdout, stderr)
	}
	// Not a recording: a clear error, exit 1.
	code, _, stderr = runGaptrace(t, os.Environ(), "replay", gaps)
	if code == 0 || !strings.Contains(stderr, "not a gaptrace recording") {
		t.Errorf("gaps file as recording: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ = runGaptrace(t, os.Environ(), "replay"); code != 2 {
		t.Errorf("replay without a file: exit %d, want 2", code)
	}
}
