/* Event records shared by every gaptrace BPF program and decoded by
 * tracer/decode.go.
 *
 * Every record starts with struct event_hdr. User space reads the header,
 * checks that the record is exactly as long as the struct for hdr.type and
 * only then reinterprets the bytes, so a type added here must get a size
 * check there (tracer/layout_test.go compares the sizes bpf2go generated).
 * Fields are ordered widest first so that no implicit padding differs
 * between C and Go.
 */
#ifndef GAPTRACE_EVENTS_H
#define GAPTRACE_EVENTS_H

/* hdr.type: which struct follows. */
enum event_type {
	EV_CUDA = 1,
	EV_NCCL = 2,
	EV_SYSCALL = 3,
	EV_SCHED = 4,
	EV_PROC = 5,
	EV_FD = 6,
	EV_MMAP = 7, /* an executable file mapping appeared: rescan /proc/PID/maps */
	EV_PYSTACK = 8, /* the Python frames of the event that follows (bpf/python.h) */
	EV_SYSCALL_PATH = 9, /* a syscall that names its file by path: syscall_path_event */
	EV_CPU_SAMPLE = 10, /* a timer sample of a traced thread on a CPU: cpu_sample_event */
	EV_FAULT_READ = 11, /* page faults that read a mapped file: fault_read_event (bpf/fault.h) */
	EV_MARKER = 40, /* a framework step marker: marker_event (bpf/marker.c) */
};

/* hdr.kind: the event.Kind value (event/event.go), kept numerically equal
 * (tracer/enums_test.go checks). */
enum event_kind {
	K_ENQUEUE = 1,
	K_MEMCPY_ASYNC = 2,
	K_MEMSET = 3,
	K_MEMCPY = 4,
	K_SYNC = 5,
	K_ALLOC = 6,
	K_FREE = 7,
	K_COLLECTIVE = 8,
	K_GROUP_END = 9,
	K_SYSCALL = 10,
	K_RUNQUEUE = 11,
	K_OFFCPU = 12,
	K_FORK = 13,
	K_EXEC = 14,
	K_EXIT = 15,
	K_OPEN = 16,
	K_CLOSE = 17,
	K_COMM_INIT = 18,
	/* An async copy that kept the host in the call (the driver staged
	 * pageable memory through a pinned buffer): start_ns..ktime_ns. */
	K_MEMCPY_STAGED = 19,
	/* A CPU-clock timer fired while the thread ran (bpf/profile.c). */
	K_CPU_SAMPLE = 20,
	/* Page faults of a thread on one mapped regular file (bpf/fault.h). */
	K_FAULT_READ = 21,
	K_MARKER = 40, /* a framework step marker (bpf/marker.c) */
};

/* Syscall classes: event.SyscallClass values (tracer/enums_test.go checks),
 * plus internal ones above SC_LAST that never reach an event. */
enum syscall_class {
	SC_OTHER = 0,
	SC_READ = 1,
	SC_WRITE = 2,
	SC_FSYNC = 3,
	SC_NET = 4,
	SC_FUTEX = 5,
	SC_POLL = 6,
	SC_SLEEP = 7,
	SC_OPEN = 8,
	SC_CLOSE = 9,
	SC_LAST = 10,
	SC_MMAP = 32, /* internal: only watched for new executable mappings */
	SC_UNTRACED = 255,
};

/* A syscall_classes value: the class in its low byte and, for a syscall
 * that names its file by a path rather than an fd, that argument's
 * position + 1 in the next (rename's new path is its 2nd, unlink's path
 * its 1st). */
enum syscall_class_bits {
	SC_CLASS_MASK = 0xff,
	SC_PATH_SHIFT = 8,
};

#define PATH_LEN      256
#define EXEC_PATH_LEN 128
#define COMM_LEN      16
#define STACK_SP_WORDS 8
#define WAIT_FDS      4
#define SAMPLE_DEPTH  32

struct event_hdr {
	__u32 type;	/* enum event_type */
	__u32 kind;	/* enum event_kind */
	__u64 pid_tgid; /* tgid << 32 | tid of the thread the event is about */
	__u64 ktime_ns; /* CLOCK_MONOTONIC: end of an interval, or the instant */
};

/* EV_CUDA: driver API calls (enqueue, async copy/memset, blocking calls). */
struct cuda_event {
	struct event_hdr hdr;
	__u64 start_ns; /* entry time; == hdr.ktime_ns for point events */
	__u64 stream;
	__u64 bytes;
	__u64 count; /* launches since the thread's previous flush (enqueue, sync) */
	/* The thread's latest kernel launch before this event (0: none seen,
	 * as in lite) and, for events that flush nothing (copies, memsets,
	 * blocking calls other than syncs), the launches it made since its
	 * last flush: together they say when it last fed the GPU and how much. */
	__u64 last_launch_ns;
	__u64 pending;
	/* K_ENQUEUE: the launched function's handle (CUfunction, or the
	 * CUgraphExec of a graph launch) when user space marked it as one that
	 * clocks steps (tracer/marks.go), else 0. A marked launch is emitted
	 * even while the thread is busy; then it flushes nothing (count 0) and
	 * pending says how many launches the thread made since its last flush,
	 * itself included. */
	__u64 mark;
	__s32 ret;   /* CUresult of blocking calls */
	__u32 func;  /* event.CUDA */
	__s32 stack_id; /* blocking calls: user_stacks id of the caller's stack, else -1 */
	__u32 dir;	/* copies: event.CUDA of the direction (CU_MEMCPY_HTOD, _DTOH, _OTHER), 0 unknown */
};

/* EV_NCCL: collectives (point events) and ncclGroupEnd (interval). */
struct nccl_event {
	struct event_hdr hdr;
	__u64 start_ns;
	__u64 count; /* elements (collective) or operations issued in the group (group end) */
	__u64 bytes;
	__u64 comm;
	__u64 stream;
	__s32 peer; /* send/recv peer, reduce/broadcast root, else -1 */
	__u32 op;   /* event.NCCLOp */
	__u32 datatype;
	__s32 ret;
};

/* EV_SYSCALL: a traced syscall that lasted at least the threshold. */
struct syscall_event {
	struct event_hdr hdr;
	__u64 start_ns;
	__s64 ret;
	__u64 waker; /* pid_tgid of the last thread that woke this one during the call, 0 if none */
	__s32 nr;
	__s32 fd;    /* -1 when the syscall has no fd argument */
	__u32 class; /* enum syscall_class */
	__s32 stack_id; /* user_stacks id of the caller's stack, -1 when none */
	/* poll, ppoll, select, pselect6: the first fds the call waited on
	 * (wait_fds[i] for i < min(wait_nfds, WAIT_FDS); a negative one the
	 * kernel ignores), how many it waited on (poll: nfds; select: the fds
	 * set in its read and write sets, or nfds when it names fds above 63,
	 * which are not read), and which of the listed ones were sockets
	 * (bit i: wait_fds[i]). All zero for other calls. */
	__s32 wait_fds[WAIT_FDS];
	__u32 wait_nfds;
	__u32 wait_socks;
	__u32 open_flags; /* openat: its flags (O_WRONLY, O_CREAT, O_TRUNC, ...) */
	/* The calls the record stands for: 1, or a run of reads of one fd
	 * (bpf/readrun.h) from start_ns to the header's time, ret their
	 * bytes. */
	__u32 calls;
	/* The words at the user stack pointer: a syscall wrapper without a
	 * frame pointer hides its caller from the frame-pointer walk, and its
	 * return address is among these (user space picks it). */
	__u64 sp_words[STACK_SP_WORDS];
};

/* EV_SCHED: runqueue wait (preempted) or blocked outside a traced call. */
struct sched_event {
	struct event_hdr hdr;
	__u64 start_ns;
	__u64 waker;
	/* K_OFFCPU: the user address whose page fault the thread was blocked
	 * in (its user registers still stood at the faulting instruction when
	 * it ran again), 0 when it was not blocked in a fault. */
	__u64 fault_addr;
	__u32 flags; /* SCHED_F_* */
	__u32 _pad;
};

/* sched_event.flags */
enum sched_flags {
	/* K_RUNQUEUE only: the thread was blocked inside a probed CUDA/NCCL call
	 * (a sync sleeping until the GPU is done) and start_ns is when it was
	 * woken: the call's wait ended there, the rest was waiting for a CPU. */
	SCHED_F_WOKEN = 1,
	/* K_OFFCPU with fault_addr: the fault read a regular file (fault.h),
	 * mapped at the address by the time of the block. */
	SCHED_F_FILE = 2,
};

/* EV_PROC: fork (process or thread), exec, exit. */
struct proc_event {
	struct event_hdr hdr;
	__u32 child_pid; /* K_FORK */
	__u32 child_tid; /* K_FORK */
	__u32 flags;	 /* PROC_F_* */
	__s32 exit_code; /* K_EXIT: the task's exit_code (status << 8 | signal) */
	char comm[COMM_LEN];
	char filename[EXEC_PATH_LEN]; /* K_EXEC */
};

/* proc_event.flags */
enum proc_flags {
	PROC_F_THREAD = 1,     /* K_FORK: the child is a thread of the parent */
	PROC_F_GROUP_DEAD = 2, /* K_EXIT: the last thread of the process exited */
};

/* EV_SYSCALL_PATH: a traced syscall that names its file by a path argument
 * (rename, unlink, truncate) and lasted at least the threshold; fd is -1. */
struct syscall_path_event {
	struct syscall_event sc;
	char path[PATH_LEN];
};

/* EV_FD: openat (always) and close (always), for fd cache invalidation. */
struct fd_event {
	struct event_hdr hdr;
	__u64 start_ns;
	__s64 ret;
	__s32 fd; /* the opened fd (ret) or the closed one */
	__u32 _pad;
	char path[PATH_LEN];
};

/* EV_CPU_SAMPLE: the user stack of a traced thread a CPU-clock timer found
 * running, innermost first (ips[0] is the interrupted instruction, or the
 * return address into user code when the thread was in the kernel). The
 * Python frames, for a CPython thread, come just before in an EV_PYSTACK
 * record of the same thread and time. */
struct cpu_sample_event {
	struct event_hdr hdr;
	__u32 depth;  /* frames in ips */
	__u32 kernel; /* the timer fired while the thread ran in the kernel */
	__u64 ips[SAMPLE_DEPTH];
};

/* EV_FAULT_READ: a burst of a traced thread's user page faults on one
 * regular file's mapping, on the CPU throughout (bpf/fault.h), from the
 * start of the first (start_ns) to the start of the latest, or the
 * burst's end when the thread was still inside that fault (hdr.ktime_ns). The Python frames of
 * the first fault, for a CPython thread, come in an EV_PYSTACK record of
 * the same thread with time start_ns, before it. */
struct fault_read_event {
	struct event_hdr hdr;
	__u64 start_ns;
	__u64 addr;  /* the first fault's address: the file is what the process maps there */
	__u64 count; /* faults */
	__s32 stack_id; /* user_stacks id of the first fault's user stack, -1 when none */
	__u32 _pad;
};

#endif /* GAPTRACE_EVENTS_H */
