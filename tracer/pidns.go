package tracer

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// hostPidNS is the inode of the initial PID namespace, fixed by the kernel
// (PROC_PID_INIT_INO). The BPF programs read the kernel's own ids there.
const hostPidNS = 0xEFFFFFFC

// pidNamespace returns the inode of the PID namespace whose pids procRoot
// shows. Pids are handed to gaptrace (--pid), read from /proc (fds, maps,
// command lines) and given to perf_event_open in that namespace, so the BPF
// programs translate every task into it, whatever namespace the task itself
// lives in. Process 1 of a /proc mount is the reaper of its namespace, so its
// namespace is the mount's; a /proc without a process 1 falls back to
// gaptrace's own.
func pidNamespace(procRoot string) (uint32, error) {
	for _, p := range []string{filepath.Join(procRoot, "1", "ns", "pid"), filepath.Join(procRoot, "self", "ns", "pid")} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err == nil {
			return uint32(st.Ino), nil
		}
	}
	_, err := os.Stat(filepath.Join(procRoot, "self", "ns", "pid"))
	return 0, fmt.Errorf("find the PID namespace of %s: %w", procRoot, err)
}

func pidnsName(ino uint32) string {
	if ino == hostPidNS {
		return "host"
	}
	return fmt.Sprintf("pid:[%d]", ino)
}
