/* A traced thread's user page faults, timed (tp_btf/page_fault_user in
 * sched.c begins one; the software page-fault perf event, which the kernel
 * raises in mm_account_fault once handle_mm_fault completed it, ends it
 * in profile.c). Shared by the programs that ask whether a thread is
 * inside one: sched_switch (blocked in it: reading a page of a mapped file
 * in) and the CPU sampler. The map is created once (tracer/load.go
 * sharedMaps).
 *
 * A fault on a mapping of a regular file reads that file through its
 * pages: its time on the CPU (the handler finding, reading ahead and
 * mapping the pages; its blocks are K_OFFCPU events already) is added to
 * the thread's burst of such faults on that file, emitted as one
 * EV_FAULT_READ record when the thread leaves the CPU, when a CPU sample
 * finds it (so a burst spans at most one sampling period of its time on
 * the CPU), when a fault on another file ends, or when it exits. Faults on
 * anonymous memory (first touch of the heap), on device mappings and in
 * the kernel (a syscall copying to user memory) are not reads and are
 * neither counted nor emitted.
 */
#ifndef GAPTRACE_FAULT_H
#define GAPTRACE_FAULT_H

#define S_IFMT 00170000
#define S_IFREG 0100000

struct fault {
	__u64 addr;  /* the latest fault's address */
	__u64 ip;    /* its faulting instruction */
	__u64 start; /* when it began; 0 once it completed (or was not a read) */
	__u64 off;   /* its time off the CPU so far */
	__u64 file;  /* the inode of the regular file mapped at addr, 0: none */
	/* The burst: completed faults on one file, not yet emitted. */
	__u64 b_file;  /* its inode, 0: no burst */
	__u64 b_start; /* its first fault's start */
	__u64 b_end;   /* its latest fault's end */
	__u64 b_on;    /* time on the CPU inside its faults */
	__u64 b_off;   /* time off the CPU inside its faults */
	__u64 b_addr;  /* its first fault's address (user space names the file) */
	__u64 b_count; /* faults */
	__s64 b_stack; /* its first fault's user stack (user_stacks id), -1: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct fault);
} faults SEC(".maps");

/* The address of the fault task (id) is in: its user registers stand at
 * the instruction of its latest fault (the kernel returns to user space
 * past it once the fault is handled, and a syscall leaves them past its
 * own instruction). 0 otherwise (in a syscall, or no fault seen). */
static __always_inline __u64 fault_in(struct task_struct *task, __u64 id)
{
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (!f)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return 0;
	__u64 ip = BPF_CORE_READ(regs, ip);
	return ip == f->ip ? f->addr : 0;
}

/* bpf_find_vma's callback: the inode of the regular file the mapping
 * maps, into *ctx (anonymous memory, devices, sockets: left 0). */
static long vma_file(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	struct file *file = BPF_CORE_READ(vma, vm_file);
	if (!file)
		return 0;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	if (inode && (BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFREG)
		*(__u64 *)ctx = (__u64)inode;
	return 0;
}

/* The inode of the regular file mapped at the current task's addr, 0
 * when none (or the address space's lock was taken for writing). */
static __always_inline __u64 mapped_file(__u64 addr)
{
	__u64 inode = 0;
	bpf_find_vma(bpf_get_current_task_btf(), addr, vma_file, &inode, 0);
	return inode;
}

/* fault_flush emits thread id's burst (if any) and starts a new one. */
static __always_inline void fault_flush(__u64 id, struct fault *f)
{
	if (!f->b_count)
		return;
	struct fault_read_event *e = reserve(sizeof(*e));
	if (e) {
		hdr_fill(&e->hdr, EV_FAULT_READ, K_FAULT_READ, id, f->b_end);
		e->start_ns = f->b_start;
		e->on_ns = f->b_on;
		e->off_ns = f->b_off;
		e->addr = f->b_addr;
		e->count = f->b_count;
		e->stack_id = (__s32)f->b_stack;
		submit(e);
	}
	f->b_file = 0;
	f->b_count = 0;
	f->b_on = 0;
	f->b_off = 0;
}

/* fault_flush_id is fault_flush for a thread known by id only. */
static __always_inline void fault_flush_id(__u64 id)
{
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (f)
		fault_flush(id, f);
}

#endif /* GAPTRACE_FAULT_H */
