package tracer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// BenchmarkSimtrainOverhead measures what tracing costs the traced process:
// simtrain's own wall time untraced, under the full probe set and under the
// lite one, interleaved, and reports medians, ratios and the cost per
// launch. Run it alone, as root:
//
//	go test -run XXX -bench SimtrainOverhead -benchtime 1x ./tracer/
//
// GAPTRACE_OVERHEAD_ARGS overrides the simtrain workload, e.g.
// "--steps 2000 --kernels-per-step 50 --kernel-us 1" for a higher launch rate.
func BenchmarkSimtrainOverhead(b *testing.B) {
	testutil.NeedRoot(b, "loads BPF programs")
	args := strings.Fields("--steps 2000 --kernels-per-step 50 --kernel-us 5")
	if v := os.Getenv("GAPTRACE_OVERHEAD_ARGS"); v != "" {
		args = strings.Fields(v)
	}
	launches := int64(flagValue(b, args, "--steps") * flagValue(b, args, "--kernels-per-step"))
	const rounds = 3
	walls := map[string][]float64{}
	var drops, events uint64
	for range b.N {
		for range rounds {
			for _, mode := range []string{"untraced", string(ProbesFull), string(ProbesLite)} {
				w, st := overheadRun(b, mode, args)
				walls[mode] = append(walls[mode], w)
				if mode == string(ProbesFull) {
					drops += st.RingDrops
					events += st.EventsRead
				}
			}
		}
	}
	med := func(m string) float64 { v := slices.Clone(walls[m]); slices.Sort(v); return v[len(v)/2] }
	u, f, l := med("untraced"), med(string(ProbesFull)), med(string(ProbesLite))
	b.ReportMetric(u, "untraced_s")
	b.ReportMetric(f, "full_s")
	b.ReportMetric(l, "lite_s")
	b.ReportMetric(f/u, "full_ratio")
	b.ReportMetric(l/u, "lite_ratio")
	b.ReportMetric((f-u)*1e9/float64(launches), "full_ns/launch")
	b.ReportMetric((l-u)*1e9/float64(launches), "lite_ns/launch")
	b.ReportMetric(float64(launches)/u, "launches/s")
	b.ReportMetric(float64(drops), "full_ring_drops")
	b.ReportMetric(float64(events)/float64(b.N*rounds), "full_events/run")
	b.Logf("walls: %v", walls)
}

func flagValue(b *testing.B, args []string, name string) int {
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		b.Fatalf("%s missing in %v", name, args)
	}
	n, err := strconv.Atoi(args[i+1])
	if err != nil {
		b.Fatal(err)
	}
	return n
}

var wallRE = regexp.MustCompile(`steps in ([0-9.]+) s`)

// overheadRun runs simtrain once, traced from its first instruction in
// mode full/lite or untraced, and returns the wall time simtrain reports
// (its loop only: loading and attaching are not part of it).
func overheadRun(b *testing.B, mode string, args []string) (float64, Stats) {
	dir := simgpu(b)
	simArgs := append([]string{"-c", `read _ && exec "$0" "$@"`, filepath.Join(dir, "simtrain"), "--quiet"}, args...)
	cmd := exec.Command("/bin/sh", simArgs...)
	cmd.Env = append(os.Environ(), "TMPDIR="+b.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var tr *Tracer
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if mode != "untraced" {
		tr, err = New(Config{
			Probes:  ProbeSet(mode),
			LibCUDA: filepath.Join(dir, "libcuda.so.1"),
			LibNCCL: filepath.Join(dir, "libnccl.so.2"),
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			_ = cmd.Process.Kill()
			b.Fatal(err)
		}
		if err := tr.Trace(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			b.Fatal(err)
		}
		evc := make(chan event.Event, 4096)
		go func() { done <- tr.Run(ctx, evc) }()
		go func() {
			for range evc {
			}
		}()
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("simtrain: %v\n%s", err, out.String())
	}
	var st Stats
	if tr != nil {
		time.Sleep(2 * DefaultRingPoll) // let the reader take what is pending
		st = tr.Stats()
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	m := wallRE.FindStringSubmatch(out.String())
	if m == nil {
		b.Fatalf("no wall time in simtrain output %q", out.String())
	}
	w, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		b.Fatal(fmt.Errorf("parse wall %q: %w", m[1], err))
	}
	return w, st
}
