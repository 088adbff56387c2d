package tracer

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// The null probe set attaches what the full set attaches and records
// nothing: it is the baseline that overhead is measured against.
func TestNullProbesAttachEverythingRecordNothing(t *testing.T) {
	dir := simgpu(t)
	tr := newTestTracer(t, Config{
		Probes:  ProbesNull,
		LibCUDA: filepath.Join(dir, "libcuda.so.1"),
		LibNCCL: filepath.Join(dir, "libnccl.so.2"),
	})
	cmd := exec.Command("/bin/sh", "-c", `read _ && exec "$0" "$@"`, filepath.Join(dir, "simtrain"), "--quiet",
		"--steps", "200", "--kernels-per-step", "20", "--kernel-us", "5", "--collectives", "2",
		"--stall", "io.read:every=50:ms=5", "--stall", "sleep:every=40:ms=5")
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Trace(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("Trace: %v", err)
	}
	kinds := map[string]int{}
	for _, p := range tr.Stats().Attached {
		if p.PID == cmd.Process.Pid {
			kinds[p.Kind]++
		}
		if p.Symbol == "cuLaunchKernel" && p.PID == cmd.Process.Pid {
			kinds["launch"]++
		}
	}
	if kinds["uprobe"] == 0 || kinds["uretprobe"] == 0 || kinds["launch"] == 0 {
		t.Fatalf("null probes must attach what full attaches (launches included); attached: %v", kinds)
	}

	ctx, cancel := context.WithCancel(context.Background())
	evc := make(chan event.Event, 1024)
	runErr := make(chan error, 1)
	go func() { runErr <- tr.Run(ctx, evc) }()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("simtrain: %v\n%s", err, out.String())
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(evc)
	n := 0
	for ev := range evc {
		n++
		if n <= 5 {
			t.Errorf("null probes emitted %+v", ev)
		}
	}
	if n > 0 {
		t.Fatalf("null probes emitted %d events, want 0", n)
	}
	if st := tr.Stats(); st.EventsRead != 0 || st.RingDrops != 0 {
		t.Fatalf("null probes: %d events read, %d drops", st.EventsRead, st.RingDrops)
	}
}
