// Package workload names where a traced process runs: its pid inside its
// own PID namespace, its container, its Kubernetes pod and its rank. It reads
// /proc only, once per process, and never trusts more than it can check: pod
// names come from gaptrace's own downward-API variables and are given only
// to processes of gaptrace's own pod (the sidecar layout), matched by the pod
// UID in their cgroup path.
package workload

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/gaptrace/gaptrace/correlate"
)

// Pod is the identity of gaptrace's own pod, from the downward API.
type Pod struct {
	Name, Namespace, UID string
	// Container is the name of the traced container (set in the sidecar
	// manifest: the downward API cannot name another container).
	Container string
}

// PodFromEnv reads Pod from gaptrace's environment, and only on Kubernetes
// (KUBERNETES_SERVICE_HOST is set in every pod): elsewhere variables such as
// POD_NAME or CONTAINER_NAME mean something else or nothing.
func PodFromEnv(getenv func(string) string) Pod {
	if getenv("KUBERNETES_SERVICE_HOST") == "" {
		return Pod{}
	}
	first := func(names ...string) string {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	return Pod{
		Name:      first("K8S_POD_NAME", "POD_NAME"),
		Namespace: first("K8S_NAMESPACE_NAME", "POD_NAMESPACE"),
		UID:       first("K8S_POD_UID", "POD_UID"),
		Container: first("K8S_CONTAINER_NAME"),
	}
}

// Resolver caches one Workload per pid. Safe for concurrent use.
type Resolver struct {
	procRoot string
	pod      Pod

	mu    sync.Mutex
	cache map[uint32]*correlate.Workload
}

// New returns a Resolver reading procRoot ("/proc").
func New(procRoot string, pod Pod) *Resolver {
	return &Resolver{procRoot: procRoot, pod: pod, cache: map[uint32]*correlate.Workload{}}
}

// Of returns the workload of pid, nil when nothing is known beyond the pid
// itself (a process on the host, outside any container). The first answer
// for a pid is kept: a process does not change container.
func (r *Resolver) Of(pid uint32) *correlate.Workload {
	if pid == 0 {
		return nil
	}
	r.mu.Lock()
	w, ok := r.cache[pid]
	r.mu.Unlock()
	if ok {
		return w
	}
	w = r.read(pid)
	r.mu.Lock()
	if len(r.cache) > maxCached {
		clear(r.cache)
	}
	r.cache[pid] = w
	r.mu.Unlock()
	return w
}

// Forget drops pid's entry (the process exited; its number may be reused).
func (r *Resolver) Forget(pid uint32) {
	r.mu.Lock()
	delete(r.cache, pid)
	r.mu.Unlock()
}

// maxCached bounds the cache on a node whose jobs fork without end.
const maxCached = 4096

func (r *Resolver) read(pid uint32) *correlate.Workload {
	dir := filepath.Join(r.procRoot, strconv.FormatUint(uint64(pid), 10))
	var w correlate.Workload
	if b, err := os.ReadFile(filepath.Join(dir, "status")); err == nil {
		if ns := innermostNSPid(b); ns != 0 && ns != pid {
			w.NSPID = ns
		}
	}
	beside := false
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		w.ContainerID, w.PodUID = FromCgroup(string(b))
		beside = besideUs(string(b))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
		if v, ok := environValue(b, "RANK"); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				w.Rank = &n
			}
		}
	}
	// gaptrace's own pod (the sidecar layout): the pod UID in the cgroup
	// path is ours, or, inside gaptrace's cgroup namespace, the process is
	// in our cgroup or a sibling's (another container of the pod). A
	// DaemonSet sees other pods' UIDs, and only those.
	if r.pod.UID != "" && (w.PodUID == r.pod.UID || w.PodUID == "" && beside) {
		w.PodUID = r.pod.UID
		w.PodName, w.PodNamespace, w.ContainerName = r.pod.Name, r.pod.Namespace, r.pod.Container
	}
	if w == (correlate.Workload{}) {
		return nil
	}
	return &w
}

// RankOf is pid's place in a distributed job as its environment says it:
// RANK and WORLD_SIZE (torchrun, DeepSpeed, Slurm launchers), else
// LOCAL_RANK and LOCAL_WORLD_SIZE; size is 0 when not said. ok is false
// when no rank is set. It reads /proc every time: the caller asks once per
// process, while it runs.
func (r *Resolver) RankOf(pid uint32) (rank, size int, ok bool) {
	b, err := os.ReadFile(filepath.Join(r.procRoot, strconv.FormatUint(uint64(pid), 10), "environ"))
	if err != nil {
		return 0, 0, false
	}
	return RankFromEnviron(b)
}

// RankFromEnviron reads a rank and a job size from the contents of
// /proc/PID/environ (see RankOf).
func RankFromEnviron(environ []byte) (rank, size int, ok bool) {
	num := func(key string) (int, bool) {
		v, ok := environValue(environ, key)
		if !ok {
			return 0, false
		}
		n, err := strconv.Atoi(v)
		return n, err == nil && n >= 0
	}
	for _, keys := range [][2]string{{"RANK", "WORLD_SIZE"}, {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}} {
		if rank, ok = num(keys[0]); ok {
			size, _ = num(keys[1])
			if size <= rank {
				size = 0
			}
			return rank, size, true
		}
	}
	return 0, 0, false
}

// innermostNSPid returns the last field of the NSpid line: the pid in the
// process's own (deepest) namespace.
func innermostNSPid(status []byte) uint32 {
	for line := range bytes.SplitSeq(status, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			return 0
		}
		n, err := strconv.ParseUint(f[len(f)-1], 10, 32)
		if err != nil {
			return 0
		}
		return uint32(n)
	}
	return 0
}

func environValue(environ []byte, key string) (string, bool) {
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(key+"=")); ok {
			return string(v), true
		}
	}
	return "", false
}

var (
	// A container ID is 64 hex digits, alone as a path element
	// (cgroupfs: /docker/<id>, /kubepods/burstable/pod<uid>/<id>) or
	// after a runtime's prefix in a systemd scope (docker-<id>.scope,
	// cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope).
	containerIDRe = regexp.MustCompile(`(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$`)
	// Kubernetes pod UID: pod<uid> (cgroupfs) or pod<uid with _> (systemd).
	podUIDRe = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)`)
)

// besideUs reports whether the cgroup v2 path, as gaptrace's cgroup
// namespace shows it, is gaptrace's own cgroup ("/") or a sibling of it
// ("/../x"): then the process is in gaptrace's own pod.
func besideUs(cgroup string) bool {
	for l := range strings.SplitSeq(cgroup, "\n") {
		if path, ok := strings.CutPrefix(l, "0::"); ok {
			if path == "/" {
				return true
			}
			rest, ok := strings.CutPrefix(path, "/../")
			return ok && rest != "" && !strings.Contains(rest, "/") && rest != ".."
		}
	}
	return false
}

// FromCgroup extracts the container ID and Kubernetes pod UID from the
// contents of /proc/PID/cgroup, both "" when the process is in none. The
// innermost match wins (nested runtimes), cgroup v2's line first.
func FromCgroup(cgroup string) (containerID, podUID string) {
	lines := strings.Split(strings.TrimSpace(cgroup), "\n")
	// cgroup v2 ("0::/path") is authoritative; v1 lines follow.
	for i, l := range lines {
		if strings.HasPrefix(l, "0::") && i > 0 {
			lines[0], lines[i] = lines[i], lines[0]
			break
		}
	}
	for _, l := range lines {
		_, path, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		if _, path, ok = strings.Cut(path, ":"); !ok {
			continue
		}
		elems := strings.Split(path, "/")
		for i := len(elems) - 1; i >= 0 && containerID == ""; i-- {
			e := elems[i]
			// conmon's scope (libpod-conmon-<id>) is the monitor, not the
			// container.
			if strings.Contains(e, "conmon") {
				continue
			}
			if m := containerIDRe.FindStringSubmatch("/" + e); m != nil {
				containerID = m[1]
			}
		}
		if m := podUIDRe.FindStringSubmatch(path); m != nil && podUID == "" {
			podUID = strings.ReplaceAll(m[1], "_", "-")
		}
		if containerID != "" {
			return containerID, podUID
		}
	}
	return containerID, podUID
}
