package otel_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// Evidence the correlator could not resolve ("" path or address) must not
// become an empty file.path or network.peer.address.
func TestUnresolvedEvidenceLeftOut(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 3, t0: time.Now().UnixNano()}
	st, gaps := sy.step(1) // net
	gaps[0].Evidence.Peers = []correlate.PeerEvidence{{Address: "", Bytes: 100, NS: 9e6}, {Address: "10.0.0.9:80", Bytes: 2, NS: 1e6}}
	deliver(x, st, gaps[0])
	st, gaps = sy.step(0) // io.read
	gaps[0].Evidence.Files = []correlate.FileEvidence{{Path: "", Op: "read", Bytes: 7, NS: 9e6}}
	deliver(x, st, gaps[0])
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, s := range readSpansFile(t, path) {
		if s.Name != otel.SpanGap {
			continue
		}
		switch s.Attributes["gpu.gap.cause"] {
		case "net":
			if s.Attributes["network.peer.address"] != "10.0.0.9:80" || s.Attributes["gpu.gap.net.bytes"] != 102.0 {
				t.Errorf("net gap: %v", s.Attributes)
			}
		case "io.read":
			if _, ok := s.Attributes["file.path"]; ok || s.Attributes["gpu.gap.io.bytes"] != 7.0 {
				t.Errorf("io.read gap with only an unresolved file: %v", s.Attributes)
			}
		}
	}
}

// TestPageableCopyAttributes: a cuda.memcpy gap's copy evidence and fix
// reach its gpu.idle span.
func TestPageableCopyAttributes(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 7, t0: time.Now().Add(-time.Minute).UnixNano()}
	st, gaps := sy.step(0)
	g := gaps[0]
	g.Cause, g.Evidence.Files, g.Evidence.Syscalls = correlate.CauseCUDAMemcpy, nil, nil
	g.Breakdown = map[correlate.Cause]int64{correlate.CauseCUDAMemcpy: 28e6}
	g.Evidence.Copy = &correlate.CopyEvidence{Call: "cuMemcpyHtoDAsync", Direction: "htod", Bytes: 168e6, NS: 28e6,
		GBps: 6, Pageable: true, Fix: "pin the host buffer (pin_memory=True / cudaHostRegister)"}
	deliver(x, st, g)
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, s := range readSpansFile(t, path) {
		if s.Name != otel.SpanGap {
			continue
		}
		a := s.Attributes
		if a["gpu.gap.copy.call"] != "cuMemcpyHtoDAsync" || a["gpu.gap.copy.direction"] != "htod" || a["gpu.gap.copy.bytes"] != 168e6 ||
			a["gpu.gap.copy.gb_per_s"] != 6.0 || a["gpu.gap.copy.pageable"] != true || a["gpu.gap.copy.ms"] != 28.0 ||
			a["gpu.gap.fix"] != "pin the host buffer (pin_memory=True / cudaHostRegister)" {
			t.Errorf("copy attrs %v", a)
		}
		return
	}
	t.Fatal("no gpu.idle span")
}

// A lock gap names the thread the feeder waited on and what it did.
func TestLockHolderAttributes(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{SpansFile: path, Rank: -1})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 7, t0: time.Now().Add(-time.Minute).UnixNano()}
	st, gaps := sy.step(0)
	g := gaps[0]
	g.Cause, g.Evidence.Files, g.Evidence.Syscalls = correlate.CauseLock, nil, nil
	g.Breakdown = map[correlate.Cause]int64{correlate.CauseLock: 20e6}
	g.Evidence.LockHolders = []correlate.LockHolderEvidence{
		{TID: 12, Comm: "metrics", NS: 20e6, Doing: correlate.CauseSleep, RunnableNS: 2.5e6},
		{TID: 13, NS: 1e6, Doing: correlate.CauseCPU},
	}
	deliver(x, st, g)
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, s := range readSpansFile(t, path) {
		if s.Name != otel.SpanGap {
			continue
		}
		a := s.Attributes
		tids, _ := a["gpu.gap.lock.holder.tids"].([]any)
		if a["gpu.gap.lock.holder.tid"] != 12.0 || a["gpu.gap.lock.holder.name"] != "metrics" ||
			a["gpu.gap.lock.holder.doing"] != "sleep" || a["gpu.gap.lock.holder.runnable_ms"] != 2.5 || len(tids) != 2 {
			t.Errorf("lock holder attrs %v", a)
		}
		return
	}
	t.Fatal("no gpu.idle span")
}

// A comm stall on a communicator linked by its collectives, whose
// process's rank nothing said, still names the late process.
func TestLatePIDWithoutRank(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{Rank: -1, SpansFile: path})
	if err != nil {
		t.Fatal(err)
	}
	st, gaps := synth{pid: 100, t0: time.Now().UnixNano()}.step(3) // comm
	gaps[0].Evidence.Collective.LateRank = nil
	deliver(x, st, gaps[0])
	shutdown(t, x)
	for _, s := range readSpansFile(t, path) {
		if s.Name != otel.SpanGap {
			continue
		}
		if _, ok := s.Attributes["gpu.collective.late_rank"]; ok || s.Attributes["gpu.collective.late_pid"] != 107.0 ||
			s.Attributes["gpu.collective.late_by_ms"] != 27.0 {
			t.Errorf("late attributes of a stall whose late rank is unknown: %v", s.Attributes)
		}
		return
	}
	t.Fatal("no gpu.idle span")
}

// A late rank traced by another sidecar of the job (--peers) is named with
// that sidecar.
func TestLateSidecar(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	x, err := otel.New(context.Background(), otel.Config{Rank: 0, JobID: "j", SpansFile: path})
	if err != nil {
		t.Fatal(err)
	}
	st, gaps := synth{pid: 100, t0: time.Now().UnixNano()}.step(3) // comm
	gaps[0].Evidence.Collective.LateSidecar = "worker-1/rank1/7"
	deliver(x, st, gaps[0])
	shutdown(t, x)
	for _, s := range readSpansFile(t, path) {
		if s.Name != otel.SpanGap {
			continue
		}
		if s.Attributes["gpu.collective.late_sidecar"] != "worker-1/rank1/7" || fmt.Sprint(s.Attributes["gpu.collective.late_rank"]) != "1" {
			t.Errorf("late attributes of a stall on a rank another sidecar traces: %v", s.Attributes)
		}
		return
	}
	t.Fatal("no gpu.idle span")
}
