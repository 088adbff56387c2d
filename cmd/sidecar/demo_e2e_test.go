package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoFindsSteps: the demo's summary counts the simulated trainer's
// steps; a demo that found none would have reported an empty result.
func TestDemoFindsSteps(t *testing.T) {
	need(t)
	out := t.TempDir()
	code, stdout, stderr := runGaptrace(t, append(os.Environ(), "GAPTRACE_SIMGPU="+simgpuDir),
		"demo", "--demo-duration", "5s", "--live", "off", "--out", out)
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s\n%s", code, stdout, stderr)
	}
	b, err := os.ReadFile(filepath.Join(out, "gaptrace-summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Steps int64 `json:"steps"`
		Gaps  int64 `json:"gaps"`
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	// The trainer runs at least 50 steps (demoArgs); a probe attached
	// late may miss the first few, never most of them.
	if sum.Steps < 25 || sum.Gaps == 0 {
		t.Errorf("demo found %d steps and %d gaps:\n%s\n%s", sum.Steps, sum.Gaps, stdout, stderr)
	}
}

// TestDemoNoStepsFails: a simulated GPU whose trainer makes no CUDA call
// (here a script that only sleeps) leaves the demo with 0 steps, which it
// must report as a failure with the reason, not as a success.
func TestDemoNoStepsFails(t *testing.T) {
	need(t)
	sim := t.TempDir()
	for _, f := range []string{"libcuda.so.1", "libnccl.so.2", "libnvidia-ml.so.1"} {
		if err := os.Symlink(filepath.Join(simgpuDir, f), filepath.Join(sim, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sim, "simtrain"), []byte("#!/bin/sh\nsleep 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runGaptrace(t, append(os.Environ(), "GAPTRACE_SIMGPU="+sim),
		"demo", "--demo-duration", "5s", "--live", "off", "--out", t.TempDir())
	if code != 1 {
		t.Errorf("demo with no CUDA calls: exit %d, want 1\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "gaptrace demo: FAILED") || !strings.Contains(stderr, "saw 0 steps") {
		t.Errorf("no reason given:\n%s", stderr)
	}
	if strings.Contains(stdout, "open ") && strings.Contains(stdout, "ui.perfetto.dev") {
		t.Errorf("failed demo still points to its outputs as results:\n%s", stdout)
	}
}
