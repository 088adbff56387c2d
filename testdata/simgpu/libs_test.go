package simgpu_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type dump struct {
	BusyNs  uint64 `json:"busy_ns"`
	MemUsed uint64 `json:"mem_used"`
	Pids    int    `json:"pids"`
}

func dumpTimeline(t *testing.T, dir string, from, to uint64, mask uint32) dump {
	t.Helper()
	cmd := exec.Command(filepath.Join(buildDir, "simtrain"), "--dump-timeline",
		fmt.Sprintf("%d,%d,%d", from, to, mask))
	cmd.Env = append(os.Environ(), "SIMGPU_DIR="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dump timeline: %v", err)
	}
	var d dump
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("dump timeline output %q: %v", out, err)
	}
	return d
}

// unionNs is the length of the union of the busy records of the given
// kinds, clipped to [from, to).
func unionNs(recs []record, kinds []string, from, to uint64) uint64 {
	type iv struct{ s, e uint64 }
	var v []iv
	for _, r := range recs {
		if slices.Contains(kinds, r.Kind) && r.End > from && r.Start < to {
			v = append(v, iv{max(r.Start, from), min(r.End, to)})
		}
	}
	slices.SortFunc(v, func(a, b iv) int { return int(int64(a.s - b.s)) })
	var total, cs, ce uint64
	for i, x := range v {
		if i == 0 || x.s > ce {
			total += ce - cs
			cs, ce = x.s, x.e
		} else if x.e > ce {
			ce = x.e
		}
	}
	return total + ce - cs
}

// TestTimelineMatchesTruth checks that the shared timeline, read the way the
// simulated NVML reads it, holds exactly the busy time simtrain recorded, and
// that it forgets the trainer once it exited.
func TestTimelineMatchesTruth(t *testing.T) {
	tr := runSimtrain(t, "--steps", "40", "--kernels-per-step", "6", "--kernel-us", "80",
		"--launch-gap-us", "120", "--streams", "2", "--collectives", "1",
		"--stall", "sleep:every=10:ms=15")
	from, to := tr.steps[0].Start, tr.steps[len(tr.steps)-1].End
	cases := []struct {
		mask  uint32
		kinds []string
	}{
		{1 | 2, []string{"kernel", "collective"}}, // what utilization.gpu counts
		{1, []string{"kernel"}},
		{4, []string{"copy"}},
	}
	for _, c := range cases {
		want := unionNs(tr.busy, c.kinds, from, to)
		// Also a window ending mid-run, to exercise clipping.
		mid := from + (to-from)/3
		wantMid := unionNs(tr.busy, c.kinds, from, mid)
		got := dumpTimeline(t, tr.timeDir, from, to, c.mask)
		gotMid := dumpTimeline(t, tr.timeDir, from, mid, c.mask)
		if got.BusyNs != want || gotMid.BusyNs != wantMid || want == 0 {
			t.Errorf("mask %d: timeline busy %d / %d ns, truth %d / %d ns", c.mask, got.BusyNs, gotMid.BusyNs, want, wantMid)
		}
		if frac := float64(want) / float64(to-from); frac <= 0 || frac >= 1 {
			t.Errorf("mask %d: busy fraction %.3f out of (0,1)", c.mask, frac)
		}
		if got.Pids != 0 || got.MemUsed != 0 {
			t.Errorf("exited trainer still registered: %+v", got)
		}
	}
}

// nmSymbols returns the dynamic symbols defined by lib: name -> (type, address).
func nmSymbols(t *testing.T, lib string) map[string][2]string {
	t.Helper()
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	if err != nil {
		t.Skipf("nm -D %s: %v", lib, err)
	}
	syms := map[string][2]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 {
			syms[f[2]] = [2]string{f[1], f[0]}
		}
	}
	return syms
}

func TestNCCLWeakAliases(t *testing.T) {
	needBuild(t)
	syms := nmSymbols(t, filepath.Join(buildDir, "libnccl.so.2"))
	for _, name := range []string{
		"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send", "Recv",
		"GroupStart", "GroupEnd", "CommInitRank", "CommDestroy", "CommCount", "CommUserRank",
		"CommGetAsyncError", "GetVersion", "GetUniqueId",
	} {
		pub, priv := syms["nccl"+name], syms["pnccl"+name]
		if pub[0] != "W" || priv[0] != "T" || pub[1] != priv[1] {
			t.Errorf("nccl%s %v and pnccl%s %v: want a weak alias at the same address", name, pub, name, priv)
		}
	}
}

// TestCUDAExports checks that every driver entry point the tracer probes is
// a real function of its own: a folded or aliased entry point would make
// one call hit two uprobes.
func TestCUDAExports(t *testing.T) {
	needBuild(t)
	syms := nmSymbols(t, filepath.Join(buildDir, "libcuda.so.1"))
	want := []string{
		"cuInit", "cuDeviceGet", "cuDeviceGetCount", "cuCtxCreate_v2", "cuDevicePrimaryCtxRetain",
		"cuCtxSetCurrent", "cuStreamCreate", "cuModuleLoadData", "cuModuleGetFunction",
		"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
		"cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel_ptsz",
		"cuGraphLaunch_ptsz", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync",
		"cuMemsetD8Async", "cuMemsetD32Async", "cuMemcpyHtoDAsync_v2_ptsz",
		"cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyAsync_ptsz", "cuMemsetD8Async_ptsz",
		"cuMemsetD32Async_ptsz", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz",
		"cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz", "cuMemcpy2DAsync_v2",
		"cuMemcpy2DAsync_v2_ptsz", "cuMemcpy3DAsync_v2", "cuMemcpy3DAsync_v2_ptsz",
		"cuMemsetD16Async", "cuMemsetD16Async_ptsz", "cuMemsetD2D8Async",
		"cuMemsetD2D8Async_ptsz", "cuMemsetD2D16Async", "cuMemsetD2D16Async_ptsz",
		"cuMemsetD2D32Async", "cuMemsetD2D32Async_ptsz", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
		"cuMemcpyDtoD_v2", "cuMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventRecord",
		"cuEventSynchronize", "cuEventCreate", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync",
		"cuMemFreeAsync", "cuGetErrorString", "cuDriverGetVersion",
	}
	addrs := map[string]string{}
	for _, name := range want {
		s, ok := syms[name]
		if !ok || s[0] != "T" {
			t.Errorf("%s: %v, want a defined function (T)", name, s)
			continue
		}
		if other, dup := addrs[s[1]]; dup {
			t.Errorf("%s and %s share address %s", name, other, s[1])
		}
		addrs[s[1]] = name
	}
}

// TestTimelineConcurrentWraparound runs tlstress: two writer processes
// append far more intervals than the ring holds while a reader checks that
// recent windows are exact and lost history never inflates a window.
func TestTimelineConcurrentWraparound(t *testing.T) {
	needBuild(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tlstress")
	if out, err := exec.Command("gcc", "-O2", "-g", "-Wall", "-Wextra", "-pthread", "-o", bin,
		"tlstress.c", "timeline.c").CombinedOutput(); err != nil {
		t.Fatalf("build tlstress: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "2", "300000")
	cmd.Env = append(os.Environ(), "SIMGPU_DIR="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tlstress: %v\n%s%s", err, out, stderr.String())
	}
	var res struct {
		Checks       int    `json:"checks"`
		Failures     int    `json:"failures"`
		OldestBusyNs uint64 `json:"oldest_busy_ns"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("tlstress output %q: %v", out, err)
	}
	if res.Checks == 0 {
		t.Errorf("reader made no concurrent checks: %s", out)
	}
	if res.OldestBusyNs >= 25000 {
		t.Errorf("oldest window still complete (%d ns): the ring never wrapped", res.OldestBusyNs)
	}
}
