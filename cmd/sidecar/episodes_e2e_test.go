package main_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// A trainer's pageable .to('cuda') and its torch.save of a CUDA state_dict,
// traced with gaptrace run under both probe sets: the copy's gap is
// cuda.memcpy with the copy's bytes, direction and the fix; each checkpoint
// is one io.write gap naming its file and its parts.
func TestPageableCopyAndCheckpointGaps(t *testing.T) {
	need(t)
	for _, probes := range []string{"full", "lite"} {
		t.Run(probes, func(t *testing.T) {
			dir := t.TempDir()
			gapsPath := filepath.Join(dir, "gaps.jsonl")
			args := append([]string{"run", "--probes", probes, "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
				"--gaps-out", gapsPath, "--spans-out", filepath.Join(dir, "spans.jsonl"), "--"},
				simtrain("--steps", "36", "--kernel-us", "1000", "--batch-copies", "1",
					"--stall", "pageable:every=5:ms=20", "--stall", "checkpoint:every=8:ms=25", "--quiet")...)
			code, stdout, stderr := runGaptrace(t, append(env(t), "SIMGPU_PAGEABLE_GBPS=5"), args...)
			if code != 0 {
				t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
			}
			var copies, ckpts, whole int
			for _, g := range readGaps(t, gapsPath) {
				if c := g.Evidence.Copy; c != nil && c.Bytes == 20*5e6 {
					copies++
					if g.Cause != correlate.CauseCUDAMemcpy && g.Cause != correlate.CauseCPUContention {
						t.Errorf("pageable copy's gap at step %d: cause %s (%v)", g.Step, g.Cause, g.Breakdown)
					}
					if !c.Pageable || c.Direction != "htod" || c.Call != "cuMemcpyHtoDAsync" || c.GBps <= 0 || c.GBps > 5.5 ||
						!strings.Contains(c.Fix, "pin_memory=True") {
						t.Errorf("copy evidence %+v", *c)
					}
				}
				if e := g.Evidence.Episode; e != nil && strings.HasSuffix(e.File, "/simtrain-state.pt") {
					ckpts++
					if e.Copies == 12 && e.Writes == 12 && e.WriteBytes == 12<<21 && e.FsyncNS > 0 {
						whole++
					} else if probes == "full" || e.Copies < 1 || e.Writes < 1 {
						// Lite sees a sync that waited for a CPU on a
						// loaded machine as one that waited for the GPU:
						// the checkpoint may split there.
						t.Errorf("checkpoint episode %+v", *e)
					}
					if g.Cause != correlate.CauseIOWrite && g.Cause != correlate.CauseCPUContention {
						t.Errorf("checkpoint's gap at step %d: cause %s (%v)", g.Step, g.Cause, g.Breakdown)
					}
				}
			}
			// 7 pageable copies and 4 checkpoints ran, never before the same
			// step (a pageable copy just before a checkpoint is step work
			// queued before its first copy); the first steps may pass
			// before the probes attach.
			// Lite cannot tell a sync that waited for the checkpoint's own
			// device-to-host copy from one that waited for compute, so a
			// checkpoint may split into several io.write gaps there; full
			// must give at least one whole episode.
			wantWhole := 1
			if probes == "lite" {
				wantWhole = 0
			}
			if copies < 5 || ckpts < 3 || whole < wantWhole {
				t.Errorf("%d pageable copy gaps (want ≥ 5 of 7), %d checkpoint gaps (want ≥ 3 of 4), %d with all 12 tensors (want ≥ %d)", copies, ckpts, whole, wantWhole)
			}
			t.Logf("%s: %d pageable copy gaps, %d checkpoint gaps, %d of them whole", probes, copies, ckpts, whole)
		})
	}
}
