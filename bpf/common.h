/* Maps, knobs and helpers shared by every gaptrace BPF object.
 *
 * Each C file is compiled into its own object, so each object declares these
 * maps; user space creates them once and hands the same map to every object
 * (CollectionOptions.MapReplacements), which is what lets a sync probe in
 * cuda.c re-arm the launch aggregation that a syscall in syscalls.c ended.
 * Any change here must keep the declarations identical across objects.
 */
#ifndef GAPTRACE_COMMON_H
#define GAPTRACE_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "events.h"

/* Older libbpf headers stop at the fifth argument on x86-64. */
#ifndef PT_REGS_PARM6
#define PT_REGS_PARM6(x) (((struct pt_regs *)(x))->r9)
#endif

char __license[] SEC("license") = "Dual MIT/GPL";

/* Syscalls, runqueue waits and off-CPU periods shorter than this are counted,
 * not emitted. Set by user space before load. */
const volatile __u64 threshold_ns = 50000;

/* Every program returns at once: the probes stay attached at the same places
 * with the same traps, so the traced job pays their raw cost and nothing else.
 * The baseline against which the cost of the real programs is measured. */
const volatile bool null_probes = false;

/* The inode of the PID namespace that gaptrace's /proc shows (the pid
 * namespace of /proc/1). Every pid that leaves or enters the kernel side
 * (events, traced_tgids keys, thread_state keys, wakers) is a pid of that
 * namespace, so user space can look it up in /proc, attach uprobes to it and
 * print it as the user sees it. The host's namespace has a fixed inode; there
 * the kernel's own ids are already right and cost nothing to read. Set by user
 * space before load. */
#define PIDNS_HOST_INUM 0xEFFFFFFCU
const volatile __u32 pidns_inum = PIDNS_HOST_INUM;

/* Records are committed without waking the reader until this much data is
 * pending; the reader polls on a short timer otherwise. Waking it per record
 * costs the traced thread a context switch on every emitted event (the woken
 * reader preempts it on small machines). Set by user space. */
const volatile __u64 wakeup_bytes = 1 << 20;

/* Per-thread state, keyed by pid_tgid. Entry and return of a probed call are
 * paired here; sched_process_exit deletes the entry. LRU so that a thread whose
 * exit we missed (tracer started late) cannot leak an entry forever. */
struct thread_state {
	/* syscall in flight (sc_start != 0) */
	__u64 sc_start;
	__u64 sc_arg0;
	__u64 sc_arg1;
	__u64 waker; /* last waker since the thread last blocked */
	__s32 sc_nr;
	__u32 sc_class;
	/* the call names its file by the path at sc_arg1 (sc_arg0: no fd) */
	__u32 sc_path;
	__u32 sc_flags; /* openat: its flags (O_WRONLY, O_CREAT, O_TRUNC, ...) */
	/* scheduling */
	__u64 off_start; /* switched out at (0: running) */
	__u64 wake_ns;	 /* woken at, while switched out blocked (0: not yet) */
	__u32 off_runnable;
	/* probed CUDA/NCCL blocking call in flight (depth > 0) */
	__u32 call_depth;
	__u64 call_start;
	__u64 call_stream;
	__u64 call_bytes;
	__u32 call_func;
	__u32 group_ops; /* collectives issued since ncclGroupStart */
	__u64 group_start;
	/* launch aggregation: launches not yet flushed into an event; busy != 0
	 * once the first launch after a sync/blocking event was emitted */
	__u64 launches;
	__u64 last_launch; /* ktime of the thread's latest launch (0: none seen) */
	__u32 busy;
	__u32 group_depth;
	/* ncclCommInitRank* in flight: where the new communicator is stored */
	__u64 init_commp;
	__u32 init_nranks;
	__s32 init_rank;
	/* A run of reads not yet emitted (bpf/readrun.h): a process that
	 * does not feed the GPU reading one fd call after call. */
	__u64 rr_start;
	__u64 rr_end;
	__u64 rr_bytes;
	__u64 rr_waker;
	__s32 rr_fd;
	__s32 rr_nr;
	__u32 rr_calls; /* 0: no run */
	__u32 rr_pad;
};

/* traced_tgids values: bits. */
#define TGID_TRACED 1
/* The process made a probed CUDA or NCCL call (set by the programs of
 * cuda.c and nccl.c on its first one), or user space named it when it was
 * asked to trace it. Only such a process feeds the GPU: its blocking events
 * may open or explain a gap and take stacks. A process forked without it
 * that never calls the GPU (a data-loader worker, a tokenizer or logging
 * subprocess) reaches a gap only through its I/O time and files, which no
 * stack serves, so its long syscalls take none. */
#define TGID_GPU 2

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* tgid */
	__type(value, __u32); /* TGID_* */
} traced_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct thread_state);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* replaced by Config.RingBufferBytes */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} ring_drops SEC(".maps");

struct short_key {
	__u64 pid_tgid;
	__u32 class;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct short_key);
	__type(value, __u64);
} short_calls SEC(".maps");

/* User stacks of the blocking events that can open or extend a gap (long
 * syscalls, the feeder's syncs, page-fault bursts), by frame-pointer walk.
 * The map dedups: a training loop blocks at a handful of call sites, so
 * the ids repeat and user space symbolizes each once. A stack whose hash
 * bucket holds another gets no id, so user space deletes the ids no event
 * named for a while (tracer/userstacks.go): only recent stacks hold
 * buckets. Launches never take a stack. */
#define STACK_DEPTH 64
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, STACK_DEPTH * sizeof(__u64));
} user_stacks SEC(".maps");

/* Force BTF for the event structs so bpf2go -type can generate Go types. */
const struct event_hdr *unused_event_hdr __attribute__((unused));
const struct cuda_event *unused_cuda_event __attribute__((unused));
const struct nccl_event *unused_nccl_event __attribute__((unused));
const struct syscall_event *unused_syscall_event __attribute__((unused));
const struct sched_event *unused_sched_event __attribute__((unused));
const struct proc_event *unused_proc_event __attribute__((unused));
const struct fd_event *unused_fd_event __attribute__((unused));
const struct syscall_path_event *unused_syscall_path_event __attribute__((unused));
const struct short_key *unused_short_key __attribute__((unused));
/* ... and for the enums user space shares, so it uses bpf2go's constants
 * instead of copies. */
const enum event_type *unused_event_type __attribute__((unused));
const enum event_kind *unused_event_kind __attribute__((unused));
const enum syscall_class *unused_syscall_class __attribute__((unused));
const enum syscall_class_bits *unused_syscall_class_bits __attribute__((unused));
const enum sched_flags *unused_sched_flags __attribute__((unused));
const enum proc_flags *unused_proc_flags __attribute__((unused));

/* Levels of pid namespaces looked at (the kernel allows 32; containers in
 * containers rarely pass 3). */
#define PIDNS_MAX_LEVELS 8

/* Level of namespace pidns_inum plus one, once a task in it was seen (0:
 * not yet). With it, a task of a shallower namespace is refused after two
 * reads: sched_switch sees every task of the machine. Races between CPUs
 * write the same value. */
__u32 pidns_level_seen = 0;

/* The number of struct pid p in the namespace pidns_inum; 0 when p is not
 * visible there (a task of an enclosing or sibling namespace). p->numbers
 * holds one entry per level, outermost first. */
static __always_inline __u32 pid_nr_in_ns(struct pid *p)
{
	if (!p)
		return 0;
	__u32 level = BPF_CORE_READ(p, level);
	void *numbers = __builtin_preserve_access_index(&p->numbers);
	__u32 upid_size = bpf_core_type_size(struct upid);
	struct upid up = {};
	__u32 seen = pidns_level_seen;
	if (seen) {
		__u32 l = seen - 1;
		if (level < l || l >= PIDNS_MAX_LEVELS)
			return 0;
		if (bpf_probe_read_kernel(&up, sizeof(up), numbers + l * upid_size))
			return 0;
		return BPF_CORE_READ(up.ns, ns.inum) == pidns_inum ? (__u32)up.nr : 0;
	}
	/* Not found yet: walk from the deepest level, where gaptrace sharing
	 * the job's namespace finds it at once. */
	for (int k = 0; k < PIDNS_MAX_LEVELS; k++) {
		if (k > (int)level)
			break;
		__u32 l = level - k;
		if (bpf_probe_read_kernel(&up, sizeof(up), numbers + l * upid_size))
			return 0;
		if (BPF_CORE_READ(up.ns, ns.inum) == pidns_inum) {
			pidns_level_seen = l + 1;
			return (__u32)up.nr;
		}
	}
	return 0;
}

/* task's tgid << 32 | tid as gaptrace's namespace numbers them; 0 when the
 * task is not visible there. */
static __always_inline __u64 task_id(struct task_struct *task)
{
	if (pidns_inum == PIDNS_HOST_INUM)
		return ((__u64)BPF_CORE_READ(task, tgid) << 32) | (__u32)BPF_CORE_READ(task, pid);
	__u32 tid = pid_nr_in_ns(BPF_CORE_READ(task, thread_pid));
	if (!tid)
		return 0;
	__u32 tgid = pid_nr_in_ns(BPF_CORE_READ(task, group_leader, thread_pid));
	if (!tgid)
		return 0;
	return ((__u64)tgid << 32) | tid;
}

/* The same for a task handed to a tp_btf program: its fields load directly
 * on the host, without the helper calls of a probe read. */
#define btf_task_id(task)                                                                          \
	(pidns_inum == PIDNS_HOST_INUM ? (((__u64)(task)->tgid << 32) | (__u32)(task)->pid)        \
				       : task_id(task))

/* The current thread's id in gaptrace's namespace (see task_id). */
static __always_inline __u64 current_id(void)
{
	if (pidns_inum == PIDNS_HOST_INUM)
		return bpf_get_current_pid_tgid();
	return task_id((struct task_struct *)bpf_get_current_task());
}

static __always_inline bool traced(__u32 tgid)
{
	return bpf_map_lookup_elem(&traced_tgids, &tgid) != 0;
}

/* Whether traced process tgid feeds the GPU (TGID_GPU). */
static __always_inline bool feeds_gpu(__u32 tgid)
{
	__u32 *v = bpf_map_lookup_elem(&traced_tgids, &tgid);
	return v && (*v & TGID_GPU);
}

static __always_inline struct thread_state *thread_get(__u64 id)
{
	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (t)
		return t;
	struct thread_state zero = {};
	bpf_map_update_elem(&threads, &id, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&threads, &id);
}

/* The opening of every probe that acts for the current thread: nothing at all
 * under null_probes, nothing for a process that is not traced. *id is the
 * current thread as gaptrace's namespace numbers it (current_id). */
static __always_inline bool enter_traced(__u64 *id)
{
	if (null_probes)
		return false;
	*id = current_id();
#ifdef GAPTRACE_GPU_PROBES
	/* A probe on the GPU's libraries: the process feeds the GPU. The
	 * value is the one traced() looks up, so marking costs one store, once
	 * (a plain one: racing threads of the process store the same bits). */
	__u32 tgid = *id >> 32;
	__u32 *v = bpf_map_lookup_elem(&traced_tgids, &tgid);
	if (!v)
		return false;
	if (!(*v & TGID_GPU))
		*v |= TGID_GPU;
	return true;
#else
	return traced(*id >> 32);
#endif
}

/* enter_traced, then the thread's state, created on first use. NULL when the
 * probe has nothing to do (or the LRU map could not hold the thread). */
static __always_inline struct thread_state *enter(__u64 *id)
{
	if (!enter_traced(id))
		return NULL;
	return thread_get(*id);
}

/* The same for a return probe: the state its entry probe left, never a new
 * one (NULL when there is none). */
static __always_inline struct thread_state *enter_ret(__u64 *id)
{
	if (!enter_traced(id))
		return NULL;
	return bpf_map_lookup_elem(&threads, id);
}

/* reserve a zeroed ring-buffer record or count the drop: user space reports
 * drops, it never sees a half-written record, and no byte a program leaves
 * unset (padding, the tail of a string) carries stale ring contents. Always
 * inlined, so size is a constant and the memset becomes plain stores. */
static __always_inline void *reserve(__u64 size)
{
	void *p = bpf_ringbuf_reserve(&events, size, 0);
	if (!p) {
		__u32 k = 0;
		__u64 *d = bpf_map_lookup_elem(&ring_drops, &k);
		if (d)
			*d += 1;
		return NULL;
	}
	__builtin_memset(p, 0, size);
	return p;
}

static __always_inline void submit(void *rec)
{
	__u64 pending = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(rec, pending >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* submit_now wakes the reader at once: for the few records user space must
 * complete from /proc while what they name still exists (a socket's peer,
 * read through its fd before a short-lived connection closes), or act on
 * before the traced process goes on (a library mapped that probes attach
 * to). */
static __always_inline void submit_now(void *rec)
{
	bpf_ringbuf_submit(rec, BPF_RB_FORCE_WAKEUP);
}

/* Arguments past the sixth live on the stack: at function entry sp points at
 * the return address, so argument n (n >= 7) is at sp + 8*(n-6). */
static __always_inline __u64 stack_arg(struct pt_regs *ctx, int n)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
	return v;
}

static __always_inline void hdr_fill(struct event_hdr *h, __u32 type, __u32 kind, __u64 id,
				     __u64 ktime)
{
	h->type = type;
	h->kind = kind;
	h->pid_tgid = id;
	h->ktime_ns = ktime;
}

/* The current thread's user stack as a user_stacks id; -1 when it could
 * not be taken (no user context, a hash-bucket collision in a full map). */
static __always_inline __s32 user_stack(void *ctx)
{
	long id = bpf_get_stackid(ctx, &user_stacks, BPF_F_USER_STACK);
	return id < 0 ? -1 : (__s32)id;
}

/* A thread blocked (long syscall, runqueue wait, blocking CUDA call): its
 * next launch starts a new burst of GPU work and is emitted. */
static __always_inline void arm_enqueue(struct thread_state *t)
{
	t->busy = 0;
}

#endif /* GAPTRACE_COMMON_H */
