package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCrossCheck runs every job in every mode against bin/gaptrace and
// build/simgpu (make build simgpu) and fails on each missed target. It is
// skipped unless GAPTRACE_CROSSCHECK=1; GAPTRACE_CROSSCHECK_JOBS and
// GAPTRACE_CROSSCHECK_MODES narrow it like -jobs and -modes.
func TestCrossCheck(t *testing.T) {
	if os.Getenv("GAPTRACE_CROSSCHECK") != "1" {
		t.Skip("set GAPTRACE_CROSSCHECK=1 to run the cross-check (root, bin/gaptrace, build/simgpu)")
	}
	if os.Geteuid() != 0 {
		t.Skip("gaptrace loads eBPF programs: needs root")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	modes := os.Getenv("GAPTRACE_CROSSCHECK_MODES")
	if modes == "" {
		modes = strings.Join(Modes, ",")
	}
	cfg, jobs, ms, err := setup(filepath.Join(root, "bin", "gaptrace"), filepath.Join(root, "build", "simgpu"),
		filepath.Join(root, "out", "crosscheck"), os.Getenv("GAPTRACE_CROSSCHECK_JOBS"), modes)
	if err != nil {
		t.Fatal(err)
	}
	scores, err := runAll(cfg, jobs, ms, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	printTable(&table, scores)
	t.Log("\n" + table.String())
	for _, sc := range scores {
		if sc.Err != nil {
			t.Errorf("%s/%s: not scored: %v", sc.Job, sc.Mode, sc.Err)
		}
		for _, m := range sc.Missed {
			t.Errorf("%s/%s: missed %s", sc.Job, sc.Mode, m)
		}
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
