package tracer

import (
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// classMmap and classUntraced are SC_MMAP and SC_UNTRACED of bpf/events.h:
// internal classes that never reach an event.
const (
	classMmap     = uint32(syscallsSyscallClassSC_MMAP)
	classUntraced = uint32(syscallsSyscallClassSC_UNTRACED)
)

// tracedSyscall is one syscall whose tracepoints are attached.
type tracedSyscall struct {
	name  string
	nr    int
	class uint32
}

// pathArgs: the calls that name their file by a path, not by an fd, and
// which argument (1-based) holds it: the new name of a rename.
var pathArgs = map[int]uint32{
	unix.SYS_RENAME:    2,
	unix.SYS_RENAMEAT:  4,
	unix.SYS_RENAMEAT2: 4,
	unix.SYS_UNLINK:    1,
	unix.SYS_UNLINKAT:  2,
	unix.SYS_TRUNCATE:  1,
}

// mapValue is the syscall's entry in the programs' syscall_classes map.
func (s tracedSyscall) mapValue() uint32 {
	return s.class | pathArgs[s.nr]<<uint32(syscallsSyscallClassBitsSC_PATH_SHIFT)
}

// tracedSyscalls lists what a blocked training thread may be doing, by class.
// Numbers come from x/sys/unix for the architecture being built.
var tracedSyscalls = []tracedSyscall{
	{"read", unix.SYS_READ, uint32(event.SysRead)},
	{"pread64", unix.SYS_PREAD64, uint32(event.SysRead)},
	{"readv", unix.SYS_READV, uint32(event.SysRead)},
	{"preadv", unix.SYS_PREADV, uint32(event.SysRead)},
	{"preadv2", unix.SYS_PREADV2, uint32(event.SysRead)}, // CPython's os.preadv
	{"write", unix.SYS_WRITE, uint32(event.SysWrite)},
	{"pwrite64", unix.SYS_PWRITE64, uint32(event.SysWrite)},
	{"writev", unix.SYS_WRITEV, uint32(event.SysWrite)},
	{"pwritev2", unix.SYS_PWRITEV2, uint32(event.SysWrite)}, // CPython's os.pwritev
	// Writing a file's name: saving to a temporary file and renaming it
	// over the checkpoint (os.replace), removing an old one, truncating.
	// On ext4 and XFS a rename that replaces a file, or an unlink, frees
	// the old file's blocks within the call: milliseconds for a checkpoint.
	{"rename", unix.SYS_RENAME, uint32(event.SysWrite)},
	{"renameat", unix.SYS_RENAMEAT, uint32(event.SysWrite)},
	{"renameat2", unix.SYS_RENAMEAT2, uint32(event.SysWrite)},
	{"unlink", unix.SYS_UNLINK, uint32(event.SysWrite)},
	{"unlinkat", unix.SYS_UNLINKAT, uint32(event.SysWrite)},
	{"truncate", unix.SYS_TRUNCATE, uint32(event.SysWrite)},
	{"ftruncate", unix.SYS_FTRUNCATE, uint32(event.SysWrite)},
	{"fallocate", unix.SYS_FALLOCATE, uint32(event.SysWrite)},
	{"fsync", unix.SYS_FSYNC, uint32(event.SysFsync)},
	{"fdatasync", unix.SYS_FDATASYNC, uint32(event.SysFsync)},
	{"sendto", unix.SYS_SENDTO, uint32(event.SysNet)},
	{"sendmsg", unix.SYS_SENDMSG, uint32(event.SysNet)},
	{"recvfrom", unix.SYS_RECVFROM, uint32(event.SysNet)},
	{"recvmsg", unix.SYS_RECVMSG, uint32(event.SysNet)},
	{"connect", unix.SYS_CONNECT, uint32(event.SysNet)},
	{"futex", unix.SYS_FUTEX, uint32(event.SysFutex)},
	{"poll", unix.SYS_POLL, uint32(event.SysPoll)},
	{"ppoll", unix.SYS_PPOLL, uint32(event.SysPoll)},
	{"epoll_wait", unix.SYS_EPOLL_WAIT, uint32(event.SysPoll)},
	{"epoll_pwait", unix.SYS_EPOLL_PWAIT, uint32(event.SysPoll)},
	{"select", unix.SYS_SELECT, uint32(event.SysPoll)},
	{"pselect6", unix.SYS_PSELECT6, uint32(event.SysPoll)},
	{"nanosleep", unix.SYS_NANOSLEEP, uint32(event.SysSleep)},
	{"clock_nanosleep", unix.SYS_CLOCK_NANOSLEEP, uint32(event.SysSleep)},
	{"openat", unix.SYS_OPENAT, uint32(event.SysOpen)},
	{"close", unix.SYS_CLOSE, uint32(event.SysClose)},
	{"mmap", unix.SYS_MMAP, classMmap},
	// Waiting for a child process (subprocess.run, os.system): the
	// returned pid names the child, whose exec says what it ran.
	{"wait4", unix.SYS_WAIT4, uint32(event.SysOther)},
	{"waitid", unix.SYS_WAITID, uint32(event.SysOther)},
}

var syscallNames = func() map[int]string {
	m := make(map[int]string, len(tracedSyscalls))
	for _, s := range tracedSyscalls {
		m[s.nr] = s.name
	}
	// Not traced, but where a stack dump finds threads waiting.
	for nr, n := range map[int]string{unix.SYS_WAIT4: "wait4", unix.SYS_WAITID: "waitid", unix.SYS_SCHED_YIELD: "sched_yield",
		unix.SYS_PAUSE: "pause", unix.SYS_RT_SIGSUSPEND: "rt_sigsuspend", unix.SYS_RT_SIGTIMEDWAIT: "rt_sigtimedwait",
		unix.SYS_ACCEPT: "accept", unix.SYS_ACCEPT4: "accept4", unix.SYS_IOCTL: "ioctl", unix.SYS_FLOCK: "flock",
		unix.SYS_EPOLL_PWAIT2: "epoll_pwait2", unix.SYS_IO_URING_ENTER: "io_uring_enter", unix.SYS_RESTART_SYSCALL: "restart_syscall"} {
		if _, ok := m[nr]; !ok {
			m[nr] = n
		}
	}
	return m
}()

func syscallName(nr int) string {
	if n, ok := syscallNames[nr]; ok {
		return n
	}
	return "syscall_" + strconv.Itoa(nr)
}
