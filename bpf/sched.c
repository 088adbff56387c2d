//go:build ignore

/* Scheduler and process-lifecycle hooks (tp_btf).
 *
 * sched_switch: a traced thread switched out while still runnable was
 * preempted; when it runs again after at least threshold_ns that wait is a
 * K_RUNQUEUE event, for the threads of processes that feed the GPU. A
 * thread that blocked outside any traced syscall or probed call (page fault
 * on a mapped file, ...) for at least threshold_ns is K_OFFCPU.
 * sched_waking, sched_wakeup_new: the waker is recorded in the wakee's state, so the
 * syscall or off-CPU event that ends says who ended it (data-loader worker,
 * logging thread, ...). A thread blocked inside a probed CUDA/NCCL call
 * that waits for a CPU after its wakeup for at least threshold_ns gets a
 * K_RUNQUEUE event from the wakeup (SCHED_F_WOKEN): a sync's wait for the
 * GPU ended there, not at its return.
 * page_fault_user: a traced thread's latest user page fault (address,
 * faulting instruction) is kept per thread; mm_filemap_map_pages and
 * mm_filemap_fault say it read a regular file, and it joins the thread's
 * burst of faults on that file (bpf/fault.h); a K_OFFCPU
 * block whose thread comes back with its user registers still at that
 * instruction was spent inside the fault
 * (reading a page of a mapped file in), and its event carries the address,
 * which user space maps to the file. Such a block is emitted however
 * short: each is a read. A thread leaving the CPU emits its burst.
 * sched_process_fork: children of traced processes are traced from their
 * first instruction (added to traced_tgids here, before user space knows).
 * sched_process_exit: per-thread state is dropped; the last thread of a
 * process removes it from traced_tgids.
 */
#include "common.h"
#include "python.h"
#include "fault.h"
#include "readrun.h"

#define TASK_RUNNING 0

SEC("tp_btf/sched_switch")
int BPF_PROG(on_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (null_probes)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 pid = btf_task_id(prev);
	if (traced(pid >> 32)) {
		struct thread_state *t = thread_get(pid);
		if (t) {
			t->off_start = now;
			t->off_runnable = prev_state == TASK_RUNNING;
			if (!t->off_runnable && t->sc_start == 0)
				t->waker = 0;
		}
		/* The faults it ran so far are one stretch of its time. */
		fault_flush_task(prev, pid, true);
	}

	__u64 nid = btf_task_id(next);
	__u32 ntgid = nid >> 32;
	__u32 *nflags = bpf_map_lookup_elem(&traced_tgids, &ntgid);
	if (!nflags)
		return 0;
	fault_resume(nid, now);
	struct thread_state *t = bpf_map_lookup_elem(&threads, &nid);
	if (!t || t->off_start == 0)
		return 0;
	__u64 start = t->off_start;
	__u64 woke = t->wake_ns;
	t->off_start = 0;
	t->wake_ns = 0;
	__u32 kind, flags = 0;
	if (t->off_runnable) {
		/* A process that does not feed the GPU (TGID_GPU) reaches a gap
		 * only through the I/O its calls did: its waits for a CPU are
		 * not emitted. */
		if (!(*nflags & TGID_GPU))
			return 0;
		kind = K_RUNQUEUE;
	} else if (t->sc_start == 0 && t->call_depth == 0) {
		kind = K_OFFCPU;
	} else if (t->call_depth > 0 && woke > start) {
		/* Blocked inside a probed call (a sync sleeping until the GPU is
		 * done): the call's own event covers the block, but not that the
		 * wait ended at the wakeup and the thread then waited for a CPU. */
		kind = K_RUNQUEUE;
		flags = SCHED_F_WOKEN;
		start = woke;
	} else {
		return 0; /* blocked inside a traced syscall: its event covers it */
	}
	/* A block inside a page fault is a read of the page (a mapped file's,
	 * or swap): emitted whatever its length, since a random walk through
	 * a mapped dataset blocks tens of µs per page, each one I/O. */
	__u64 fault = kind == K_OFFCPU ? fault_in(next, nid) : 0;
	if (now - start < threshold_ns && !fault)
		return 0;

	struct sched_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_SCHED, kind, nid, now);
	e->start_ns = start;
	e->waker = kind == K_OFFCPU ? t->waker : 0;
	e->fault_addr = fault;
	if (fault) {
		struct fault *f = bpf_map_lookup_elem(&faults, &nid);
		if (f && f->file)
			flags |= SCHED_F_FILE;
	}
	e->flags = flags;
	submit(e);
	arm_enqueue(t);
	return 0;
}

SEC("tp_btf/page_fault_user")
int BPF_PROG(on_page_fault_user, unsigned long address, struct pt_regs *regs, unsigned long error_code)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	fault_begin(ctx, id, address, regs->ip, error_code);
	return 0;
}

SEC("tp_btf/mm_filemap_map_pages")
int BPF_PROG(on_filemap_map_pages, struct address_space *mapping, unsigned long start, unsigned long last)
{
	fault_filemap(ctx, mapping);
	return 0;
}

SEC("tp_btf/mm_filemap_fault")
int BPF_PROG(on_filemap_fault, struct address_space *mapping, unsigned long index)
{
	fault_filemap(ctx, mapping);
	return 0;
}

static __always_inline void record_waker(struct task_struct *p)
{
	__u64 id = btf_task_id(p);
	if (!traced(id >> 32))
		return;
	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (!t)
		return;
	t->waker = current_id();
	if (t->off_start != 0 && !t->off_runnable)
		t->wake_ns = bpf_ktime_get_ns();
}

/* sched_waking, not sched_wakeup: a wakeup completed through the remote
 * CPU's wake list fires sched_wakeup in that CPU's interrupt context, where
 * current is whatever ran there (often idle). sched_waking always runs in
 * the waker's context. */
SEC("tp_btf/sched_waking")
int BPF_PROG(on_sched_waking, struct task_struct *p)
{
	if (null_probes)
		return 0;
	record_waker(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_sched_wakeup_new, struct task_struct *p)
{
	if (null_probes)
		return 0;
	record_waker(p);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	if (null_probes)
		return 0;
	__u64 pid = btf_task_id(parent);
	__u32 ptgid = pid >> 32;
	if (!traced(ptgid))
		return 0;
	__u64 cid = btf_task_id(child);
	__u32 ctgid = cid >> 32;
	__u32 ctid = (__u32)cid;
	if (!cid)
		return 0; /* cloned into a namespace gaptrace does not see */
	bool thread = ctgid == ptgid;
	if (!thread) {
		/* Not TGID_GPU: a child feeds the GPU once it calls it. */
		__u32 traced = TGID_TRACED;
		bpf_map_update_elem(&traced_tgids, &ctgid, &traced, BPF_ANY);
	}
	struct proc_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_PROC, K_FORK, pid, bpf_ktime_get_ns());
	e->child_pid = ctgid;
	e->child_tid = ctid;
	e->flags = thread ? PROC_F_THREAD : 0;
	BPF_CORE_READ_STR_INTO(&e->comm, child, comm);
	submit(e);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_sched_process_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	/* exec replaced the address space: calls in flight never return */
	bpf_map_delete_elem(&threads, &id);
	struct proc_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_PROC, K_EXEC, id, bpf_ktime_get_ns());
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	bpf_probe_read_kernel_str(&e->filename, sizeof(e->filename), BPF_CORE_READ(bprm, filename));
	submit(e);
	return 0;
}

/* task_struct.exit_code, which the trimmed vmlinux.h leaves out; CO-RE
 * finds it in the running kernel's BTF. */
struct task_struct___exit {
	int exit_code;
} __attribute__((preserve_access_index));

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_sched_process_exit, struct task_struct *p, bool group_dead)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	__u32 tgid = id >> 32;
	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (t)
		read_run_flush(t, id);
	bpf_map_delete_elem(&threads, &id);
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (f)
		fault_flush(id, f, 0, false);
	bpf_map_delete_elem(&faults, &id);
	if (group_dead)
		bpf_map_delete_elem(&traced_tgids, &tgid);
	struct proc_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_PROC, K_EXIT, id, bpf_ktime_get_ns());
	e->flags = group_dead ? PROC_F_GROUP_DEAD : 0;
	/* set by do_exit before this tracepoint: how the process ended, for a
	 * rank whose peers wait on it */
	e->exit_code = BPF_CORE_READ((struct task_struct___exit *)p, exit_code);
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	submit(e);
	return 0;
}
