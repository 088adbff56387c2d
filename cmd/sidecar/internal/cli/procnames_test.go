package cli

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A short job's first gaps are often written after it exited: the trace
// still names its process by what the pipeline told while it lived, and
// asks /proc only about a process never told.
func TestProcNamesOutliveTheProcess(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no true(1):", err)
	}
	gone := uint32(cmd.Process.Pid)
	var n procNames
	if got := n.name(gone); got != "" {
		t.Fatalf("an exited process never told is named %q", got)
	}
	n.Named(gone, "simtrain")
	n.Named(gone, "") // nothing known: keeps the name
	if got := n.name(gone); got != "simtrain" {
		t.Errorf("told simtrain while it lived, named %q after it exited", got)
	}
	self, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	if got, want := n.name(uint32(os.Getpid())), strings.TrimSpace(string(self)); got != want {
		t.Errorf("a live process never told is named %q, want %q from /proc", got, want)
	}
	for pid := range uint32(maxProcNames + 10) {
		n.Named(1<<30+pid, "x")
	}
	if len(n.m) > maxProcNames {
		t.Errorf("%d names held, want at most %d", len(n.m), maxProcNames)
	}
}
