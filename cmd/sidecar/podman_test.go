package main_test

// The compose layout under a real container runtime: a trainer container
// and a gaptrace container that joins its PID namespace
// (podman run --pid container:trainer, compose's pid: service:trainer).
// Images come from no registry: the test imports a root filesystem holding
// the built binaries and the libraries they link.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/test/accuracy"
)

// podman runs podman with the runtime that works on this machine's
// cgroup layout (runc when installed: crun refuses hybrid cgroups).
func podman(args ...string) *exec.Cmd {
	if _, err := exec.LookPath("runc"); err == nil {
		args = append([]string{"--runtime", "runc"}, args...)
	}
	return exec.Command("podman", args...)
}

// Limits at or under this machine's own: a runtime that raises an rlimit
// above the hard limit of its parent is refused.
var podmanLimits = []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"}

// rootfs lays out bin/gaptrace, the simulated GPU and every library they
// link, and imports it as an image.
func importImage(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"opt/gaptrace", "tmp", "var/tmp", "out", "state"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	cp := func(src, dst string) {
		t.Helper()
		if out, err := exec.Command("cp", "-aL", src, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", src, err, out)
		}
	}
	cp(gaptraceBin, filepath.Join(root, "opt/gaptrace/gaptrace"))
	cp(simgpuDir, filepath.Join(root, "opt/gaptrace/simgpu"))
	libs := map[string]bool{}
	bins, _ := filepath.Glob(filepath.Join(simgpuDir, "*"))
	for _, b := range append(bins, gaptraceBin) {
		out, _ := exec.Command("ldd", b).Output()
		for f := range strings.FieldsSeq(string(out)) {
			if strings.HasPrefix(f, "/") && !strings.HasPrefix(f, simgpuDir) {
				libs[f] = true
			}
		}
	}
	for l := range libs {
		dst := filepath.Join(root, l)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		cp(l, dst)
	}
	tag := fmt.Sprintf("localhost/gaptrace-e2e:%d", os.Getpid())
	tar := exec.Command("tar", "-C", root, "-c", ".")
	imp := podman("import", "-", tag)
	pipe, err := tar.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	imp.Stdin = pipe
	if err := tar.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("podman import: %v\n%s", err, out)
	}
	tar.Wait()                                           //nolint:errcheck // import read it all
	t.Cleanup(func() { podman("rmi", "-f", tag).Run() }) //nolint:errcheck // cleanup
	return tag
}

func TestPodmanSharedPIDNamespace(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("no container runtime: podman is not installed (.ci/run installs it)")
	}
	image := importImage(t)
	// Can this machine run a container at all?
	if out, err := podman(append(append([]string{"run", "--rm"}, podmanLimits...), image, "/opt/gaptrace/gaptrace", "version")...).CombinedOutput(); err != nil {
		t.Skipf("podman cannot run a container here: %v\n%s", err, out)
	}
	state, out := t.TempDir(), t.TempDir()
	if err := os.Chmod(out, 0o777); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("gaptrace-trainer-%d", os.Getpid())
	vols := []string{"-v", state + ":/state", "-v", out + ":/out", "-e", "SIMGPU_DIR=/state"}
	trainer := append(append(append([]string{"run", "-d", "--name", name}, podmanLimits...), vols...), image,
		"/opt/gaptrace/simgpu/simtrain", "--steps", strconv.Itoa(untilStopped), "--kernel-us", "2000",
		"--stall", "io.read:every=4:ms=25", "--stall", "sleep:every=5:ms=20", "--truth", "/out/truth.jsonl", "--quiet")
	idb, err := podman(trainer...).Output()
	if err != nil {
		t.Fatalf("start the trainer container: %v", err)
	}
	id := strings.TrimSpace(string(idb))
	t.Cleanup(func() { podman("rm", "-f", name).Run() }) //nolint:errcheck // cleanup

	// gaptrace's container: the four capabilities of the README, the
	// host's tracefs, the trainer's PID namespace, in which the trainer is
	// pid 1. Podman's default seccomp profile refuses what the BPF loader
	// needs (raising RLIMIT_MEMLOCK through prlimit64 among others).
	gt := append(append(append([]string{"run", "--rm", "--pid", "container:" + name,
		"--cap-add", "BPF,PERFMON,SYS_PTRACE,SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
		"-v", "/sys/kernel/tracing:/sys/kernel/tracing"}, podmanLimits...), vols...), image,
		"/opt/gaptrace/gaptrace", "attach", "--pid", "1", "--duration", "4s", "--live", "off",
		"--nvml-lib", "/opt/gaptrace/simgpu/libnvidia-ml.so.1",
		"--gaps-out", "/out/gaps.jsonl", "--summary-json", "/out/summary.json", "--spans-out", "/out/spans.jsonl")
	// The trainer runs until gaptrace is done: its pid namespace ends
	// with it, and a loaded machine can stretch gaptrace's start past any
	// fixed step count.
	res, err := podman(gt...).CombinedOutput()
	if err != nil {
		t.Fatalf("gaptrace container: %v\n%s", err, res)
	}
	if out, err := podman("kill", "--signal", "INT", name).CombinedOutput(); err != nil {
		t.Fatalf("interrupt the trainer container: %v\n%s", err, out)
	}
	if out, err := podman("wait", name).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Fatalf("trainer container: exit %s (%v)", out, err)
	}
	tr, err := accuracy.ReadTruth(filepath.Join(out, "truth.jsonl"))
	if err != nil || !tr.Ended {
		t.Fatalf("truth: %v", err)
	}
	gaps, err := accuracy.ReadGaps(filepath.Join(out, "gaps.jsonl"))
	if err != nil || len(gaps) == 0 {
		t.Fatalf("no gaps (%v)\n%s", err, res)
	}
	for _, g := range gaps {
		if g.PID != 1 {
			t.Fatalf("gap of pid %d: the trainer is pid 1 in the namespace gaptrace shares", g.PID)
		}
		if g.Workload == nil || g.Workload.ContainerID != id {
			t.Fatalf("gap workload %+v, want container.id %s", g.Workload, id)
		}
	}
	// The summary says where the job ran.
	var sum struct {
		Processes []struct {
			PID      uint32 `json:"pid"`
			Workload struct {
				ContainerID string `json:"container_id"`
			} `json:"workload"`
		} `json:"processes"`
	}
	if b, err := os.ReadFile(filepath.Join(out, "summary.json")); err != nil {
		t.Error(err)
	} else if err := json.Unmarshal(b, &sum); err != nil || len(sum.Processes) == 0 ||
		sum.Processes[0].PID != 1 || sum.Processes[0].Workload.ContainerID != id {
		t.Errorf("summary processes %+v (%v), want pid 1 in container %s", sum.Processes, err, id)
	}
	if !strings.Contains(string(res), "container "+id[:12]) {
		t.Errorf("the terminal summary does not name the container %s:\n%s", id[:12], res)
	}
	first, last := gaps[0].Start, gaps[0].End
	for _, g := range gaps {
		first, last = min(first, g.Start), max(last, g.End)
	}
	tr.TracedFrom(first + int64(time.Second))
	tr.Until(last)
	for _, c := range []string{"io.read", "sleep"} {
		if r := rightShare(tr, gaps, c); r < 0.85 {
			t.Errorf("%s: %.3f of its stalls' time labelled %s under podman", c, r, c)
		} else {
			t.Logf("%s: %.3f of its stalls' time labelled %s (%d steps scored)", c, r, c, len(tr.Steps))
		}
	}
}
