package gpusample

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// selfPID is the sidecar's own pid, read once: HWContext asks at every
// step, and os.Getpid is a system call each time.
var selfPID = sync.OnceValue(os.Getpid)

// pidAliases returns pid and the ids the same process has in the nested
// PID namespaces it belongs to (the NSpid line of /proc/PID/status, read in
// our own namespace). NVML reports a process by the id the driver sees; in
// a container that is not the id the container knows, so a match on any
// alias finds it either way (sidecar with the host's PID namespace and a
// containerised trainer, or both in one pod namespace).
func (s *Source) pidAliases(pid int) []uint32 {
	out := []uint32{uint32(pid)}
	f, err := os.Open(filepath.Join(s.procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		for _, fld := range strings.Fields(rest) {
			if v, err := strconv.ParseUint(fld, 10, 32); err == nil && !slices.Contains(out, uint32(v)) {
				out = append(out, uint32(v))
			}
		}
		break
	}
	return out
}

// SetTraced declares the traced processes (pids in our PID namespace);
// other processes on the same GPU are reported as contention. DevicesForPID
// also adds its pid, so callers that ask per pid need not call this.
func (s *Source) SetTraced(pids []int) {
	m := map[uint32]bool{}
	for _, p := range pids {
		for _, a := range s.pidAliases(p) {
			m[a] = true
		}
	}
	s.tracedMu.Lock()
	s.traced = m
	s.tracedMu.Unlock()
}

func (s *Source) tracedSet() map[uint32]bool {
	s.tracedMu.Lock()
	defer s.tracedMu.Unlock()
	return s.traced
}

// DevicesForPID returns the indexes of the devices on which pid holds a
// context, and marks pid as traced. The caller passes each process of its
// target (descendants included). An empty result means none yet: a process
// creates its CUDA context lazily, so callers ask again later.
func (s *Source) DevicesForPID(pid int) []int {
	aliases := s.pidAliases(pid)
	s.tracedMu.Lock()
	m := make(map[uint32]bool, len(s.traced)+len(aliases))
	for k := range s.traced {
		m[k] = true
	}
	for _, a := range aliases {
		m[a] = true
	}
	s.traced = m
	s.tracedMu.Unlock()

	if !s.have.procs {
		return nil
	}
	var out []int
	for _, d := range s.devs {
		ps, ret := d.h.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			if ret != nvml.ERROR_NOT_SUPPORTED {
				s.countErr(d, "nvmlDeviceGetComputeRunningProcesses", ret)
			}
			continue
		}
		if slices.ContainsFunc(ps, func(p nvml.ProcessInfo) bool { return slices.Contains(aliases, p.Pid) }) {
			out = append(out, d.info.Index)
		}
	}
	return out
}
