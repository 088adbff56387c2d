package workload

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestFromCgroup(t *testing.T) {
	for _, c := range []struct {
		name, cgroup, id, pod string
	}{
		{"containerd under systemd (k8s)", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_4111_8222_123456789abc.slice/cri-containerd-" + id + ".scope\n", id, "1b2c3d4e-0000-4111-8222-123456789abc"},
		{"CRI-O", "0::/kubepods.slice/kubepods-pod1b2c3d4e_0000_4111_8222_123456789abc.slice/crio-" + id + ".scope", id, "1b2c3d4e-0000-4111-8222-123456789abc"},
		{"cgroupfs k8s", "0::/kubepods/burstable/pod1b2c3d4e-0000-4111-8222-123456789abc/" + id, id, "1b2c3d4e-0000-4111-8222-123456789abc"},
		{"docker cgroupfs", "0::/docker/" + id, id, ""},
		{"docker systemd", "0::/system.slice/docker-" + id + ".scope", id, ""},
		{"podman", "0::/machine.slice/libpod-" + id + ".scope/container", id, ""},
		{"podman monitor is not the container", "0::/machine.slice/libpod-conmon-" + id + ".scope", "", ""},
		{"cgroup v1 lines after v2", "12:cpuset:/docker/" + id + "\n0::/\n", id, ""},
		{"host session", "0::/user.slice/user-0.slice/session-1.scope", "", ""},
		{"sibling in a cgroup namespace", "0::/../cri-containerd-" + id + ".scope", id, ""},
		{"garbage", "not a cgroup file", "", ""},
	} {
		gotID, gotPod := FromCgroup(c.cgroup)
		if gotID != c.id || gotPod != c.pod {
			t.Errorf("%s: FromCgroup = %q, %q; want %q, %q", c.name, gotID, gotPod, c.id, c.pod)
		}
	}
}

func TestBesideUs(t *testing.T) {
	for cg, want := range map[string]bool{
		"0::/":                      true,
		"0::/../cri-containerd-x":   true,
		"0::/../../kubepods/pod1/x": false,
		"0::/system.slice/x":        false,
		"12:cpu:/\n":                false,
	} {
		if got := besideUs(cg); got != want {
			t.Errorf("besideUs(%q) = %v, want %v", cg, got, want)
		}
	}
}

func TestPodOnlyOnKubernetes(t *testing.T) {
	env := map[string]string{"POD_NAME": "p", "CONTAINER_NAME": "c", "POD_UID": "u"}
	if p := PodFromEnv(func(k string) string { return env[k] }); p != (Pod{}) {
		t.Errorf("off Kubernetes: %+v, want nothing", p)
	}
	env["KUBERNETES_SERVICE_HOST"] = "10.0.0.1"
	env["K8S_CONTAINER_NAME"] = "trainer"
	p := PodFromEnv(func(k string) string { return env[k] })
	if p.Name != "p" || p.UID != "u" || p.Container != "trainer" {
		t.Errorf("on Kubernetes: %+v", p)
	}
}

// fakeProc writes /proc/<pid>/{status,cgroup,environ} under a temp root.
func fakeProc(t *testing.T, pid int, status, cgroup, environ string) string {
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"status": status, "cgroup": cgroup, "environ": environ} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestResolver(t *testing.T) {
	uid := "1b2c3d4e-0000-4111-8222-123456789abc"
	cg := "0::/kubepods.slice/kubepods-pod1b2c3d4e_0000_4111_8222_123456789abc.slice/cri-containerd-" + id + ".scope\n"
	root := fakeProc(t, 4242, "Name:\tpython\nNSpid:\t4242\t7\n", cg, "PATH=/bin\x00RANK=3\x00")
	pod := Pod{Name: "train-0", Namespace: "ml", UID: uid, Container: "trainer"}
	w := New(root, pod).Of(4242)
	if w == nil || w.NSPID != 7 || w.Rank == nil || *w.Rank != 3 || w.ContainerID != id ||
		w.PodUID != uid || w.PodName != "train-0" || w.PodNamespace != "ml" || w.ContainerName != "trainer" {
		t.Fatalf("workload %+v", w)
	}
	// Another pod's process (a DaemonSet's view): its UID, none of our names.
	other := New(root, Pod{Name: "gaptrace-node", Namespace: "kube-system", UID: "ffffffff-0000-4111-8222-123456789abc"}).Of(4242)
	if other.PodUID != uid || other.PodName != "" {
		t.Errorf("another pod's process got %+v", other)
	}
	// A host process: nothing to say.
	root = fakeProc(t, 10, "NSpid:\t10\n", "0::/user.slice/session-1.scope\n", "HOME=/root\x00")
	if w := New(root, Pod{}).Of(10); w != nil {
		t.Errorf("host process: %+v, want nil", w)
	}
	// A gone process: nothing, no panic.
	if w := New(t.TempDir(), Pod{}).Of(99); w != nil {
		t.Errorf("gone process: %+v", w)
	}
}

func TestRankFromEnviron(t *testing.T) {
	env := func(kv ...string) []byte {
		var b []byte
		for _, s := range kv {
			b = append(append(b, s...), 0)
		}
		return b
	}
	for _, c := range []struct {
		name       string
		environ    []byte
		rank, size int
		ok         bool
	}{
		{"torchrun", env("PATH=/bin", "RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4"), 3, 8, true},
		{"rank without size", env("RANK=1"), 1, 0, true},
		{"local only", env("LOCAL_RANK=2", "LOCAL_WORLD_SIZE=4"), 2, 4, true},
		{"size not above the rank", env("RANK=4", "WORLD_SIZE=4"), 4, 0, true},
		{"not a number", env("RANK=first", "LOCAL_RANK=0"), 0, 0, true},
		{"negative", env("RANK=-1"), 0, 0, false},
		{"a longer name", env("NODE_RANK=1", "MY_RANK=2"), 0, 0, false},
		{"none", env("HOME=/root"), 0, 0, false},
	} {
		rank, size, ok := RankFromEnviron(c.environ)
		if rank != c.rank || size != c.size || ok != c.ok {
			t.Errorf("%s: rank %d size %d ok %v, want %d %d %v", c.name, rank, size, ok, c.rank, c.size, c.ok)
		}
	}
}
