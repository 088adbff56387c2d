/* A traced thread's user page faults (tp_btf/page_fault_user, in sched.c),
 * shared by the programs that ask whether a thread is inside one:
 * sched_switch (blocked in it: reading a page of a mapped file in) and the
 * CPU sampler (running the kernel's fault handler for it). The map is
 * created once (tracer/load.go sharedMaps).
 *
 * A fault on a mapping of a regular file reads that file through its
 * page cache: the kernel's filemap code says so (mm_filemap_map_pages,
 * mm_filemap_fault: every file fault goes through one or both, a fault on
 * anonymous memory through neither, so those cost nothing more here);
 * files that live in memory (tmpfs, ramfs, hugetlbfs) are left out. On
 * kernels without those tracepoints (before 6.10) page_fault_user asks
 * bpf_find_vma what is mapped at the address instead (fault_find_vma).
 * A thread's consecutive such faults on one file make a burst, from the
 * start of the first to the start of the latest, extended to the moment
 * it ends when the thread is still inside its latest fault then; the
 * burst is emitted as one EV_FAULT_READ record when the thread leaves the
 * CPU (sched_switch: so a burst never holds time off the CPU; one that
 * left inside the fault goes on with it in a new burst when it runs
 * again), when a CPU
 * sample finds it outside the fault (running its own code: so a burst
 * holds at most one sampling period of that), when it faults on another
 * file, or when it exits. The
 * kernel has no tracepoint where a fault ends, and a fault costs more
 * than its handler anyway (the way into the kernel and back, which under
 * a hypervisor is the hypervisor's); the span counts all of it, and the
 * code the thread ran between two faults of the burst with it.
 */
#ifndef GAPTRACE_FAULT_H
#define GAPTRACE_FAULT_H

#define S_IFMT 00170000
#define S_IFREG 0100000

/* File systems whose files are memory (include/uapi/linux/magic.h): POSIX
 * shared memory and memfds (tmpfs), ramfs, hugetlbfs. */
#define TMPFS_MAGIC 0x01021994
#define RAMFS_MAGIC 0x858458f6
#define HUGETLBFS_MAGIC 0x958458f6

/* stored_file: inode is a regular file whose pages come from storage. A
 * fault on a file in memory (a DataLoader worker's batch in /dev/shm, a
 * memfd) reads nothing: the kernel maps or zeroes a page, CPU time that
 * the sampler sees, not a read to report (and one such file a batch made
 * every fault a new file for user space to look up). */
static __always_inline bool stored_file(struct inode *inode)
{
	if (!inode || (BPF_CORE_READ(inode, i_mode) & S_IFMT) != S_IFREG)
		return false;
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	return magic != TMPFS_MAGIC && magic != RAMFS_MAGIC && magic != HUGETLBFS_MAGIC;
}

/* Set by user space when the filemap tracepoints are missing. */
const volatile bool fault_find_vma = false;

struct fault {
	__u64 addr;  /* the latest fault's address */
	__u64 ip;    /* its faulting instruction */
	__u64 start; /* when it began */
	__u64 file;  /* the inode of the regular file it read, 0: none (yet) */
	/* It fetched an instruction (the code of a mapped library or
	 * executable paged in): its user stack names whatever jumped there,
	 * the loader's or the interpreter's code, not a read the user wrote. */
	__u64 instr;
	/* The burst: faults on one file not yet emitted. */
	__u64 b_file;  /* the file's inode (its identity only), 0: no burst */
	__u64 b_start; /* its first fault's start */
	__u64 b_end;   /* its latest fault's start */
	__u64 b_addr;  /* its first fault's address (user space names the file) */
	__u64 b_count; /* faults */
	__s64 b_stack; /* its first data fault's user stack (user_stacks id), -1: none */
	/* The thread left the CPU inside the burst's latest fault: when it
	 * runs again, a burst goes on from there (fault_resume). */
	__u64 b_cont;
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
 * maps, into *ctx (anonymous memory, devices, sockets, files in memory:
 * left 0). */
static long vma_file(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	struct file *file = BPF_CORE_READ(vma, vm_file);
	if (!file)
		return 0;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	if (stored_file(inode))
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

/* fault_flush emits thread id's burst (if any) and starts a new one; now
 * ends it when the thread is still inside the burst's latest fault. */
static __always_inline void fault_flush(__u64 id, struct fault *f, __u64 now, bool inside)
{
	if (!f->b_count)
		return;
	struct fault_read_event *e = reserve(sizeof(*e));
	if (e) {
		hdr_fill(&e->hdr, EV_FAULT_READ, K_FAULT_READ, id, inside && now > f->b_end ? now : f->b_end);
		e->start_ns = f->b_start;
		e->addr = f->b_addr;
		e->count = f->b_count;
		e->stack_id = (__s32)f->b_stack;
		submit(e);
	}
	f->b_file = 0;
	f->b_count = 0;
}

/* fault_flush_task is fault_flush for task (id), which runs or has just
 * stopped: inside the burst's latest fault when that was its latest fault
 * and its user registers stand at it. Unless always, a task inside the
 * fault keeps its burst (a CPU sample that finds it reading ends nothing;
 * one that finds it elsewhere, running its own code, ends the burst). */
static __always_inline void fault_flush_task(struct task_struct *task, __u64 id, bool always)
{
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (!f || !f->b_count)
		return;
	bool inside = false;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (regs)
		inside = f->file == f->b_file && BPF_CORE_READ(regs, ip) == f->ip;
	if (inside && !always)
		return;
	fault_flush(id, f, bpf_ktime_get_ns(), inside);
	f->b_cont = inside;
}

/* fault_resume: thread id runs again at now; having left the CPU inside a
 * fault of a burst, it goes on with that fault in a new one (the same
 * code: its stack is kept; the first fault counts in both). */
static __always_inline void fault_resume(__u64 id, __u64 now)
{
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (!f || !f->b_cont)
		return;
	f->b_cont = 0;
	if (f->b_count)
		return;
	f->b_file = f->file;
	f->b_start = now;
	f->b_end = now;
	f->b_addr = f->addr;
	f->b_count = 1;
}

/* fault_join adds thread id's latest fault, f, which read the regular
 * file whose inode is file, to its burst; ctx is the program's, for the
 * first data fault's stack.
 *
 * Only a burst of a process that feeds the GPU takes stacks: the code of
 * a burst is named only in a gap of the thread that faulted (user space,
 * correlate/faultreads.go), and gaps are those of GPU feeders; a loader
 * worker's bursts count as time, by file. An instruction fetch takes no
 * user_stacks id either: the id would name the loader, and each one
 * holds a bucket of the shared map that the syncs' stacks need. */
static __always_inline void fault_join(void *ctx, __u64 id, struct fault *f, __u64 file)
{
	f->file = file;
	if (f->b_count && f->b_file != file)
		fault_flush(id, f, 0, false);
	bool gpu = feeds_gpu(id >> 32);
	if (!f->b_count) {
		/* A new burst: which code reads the file, as the user
		 * registers of the fault and the Python frames stand. */
		f->b_file = file;
		f->b_start = f->start;
		f->b_addr = f->addr;
		f->b_stack = -1;
		if (gpu)
			py_stack(id, f->start);
	}
	if (gpu && f->b_stack < 0 && !f->instr)
		f->b_stack = user_stack(ctx);
	f->b_end = f->start;
	f->b_count++;
}

#define X86_PF_INSTR (1 << 4)
#define PAGE_MASK_4K (~4095ULL)

/* fault_begin records a user fault of the current thread (id) at addr,
 * from instruction ip, with the hardware's error code: an instruction
 * fetch (X86_PF_INSTR, or the address on the page of ip) is marked. */
static __always_inline void fault_begin(void *ctx, __u64 id, __u64 addr, __u64 ip, __u64 error_code)
{
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (!f) {
		struct fault zero = {};
		bpf_map_update_elem(&faults, &id, &zero, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&faults, &id);
		if (!f)
			return;
	}
	f->addr = addr;
	f->ip = ip;
	f->start = bpf_ktime_get_ns();
	f->file = 0;
	f->instr = (error_code & X86_PF_INSTR) || (addr & PAGE_MASK_4K) == (ip & PAGE_MASK_4K);
	f->b_cont = 0;
	if (fault_find_vma) {
		__u64 file = mapped_file(addr);
		if (file)
			fault_join(ctx, id, f, file);
	}
}

/* fault_filemap: the kernel's filemap code runs for mapping in the
 * current thread (id): when inside its latest user fault (its user
 * registers stand at it) and not counted yet, that fault read mapping's
 * file. */
static __always_inline void fault_filemap(void *ctx, struct address_space *mapping)
{
	__u64 id;
	if (!enter_traced(&id))
		return;
	struct fault *f = bpf_map_lookup_elem(&faults, &id);
	if (!f || f->file)
		return;
	struct inode *inode = BPF_CORE_READ(mapping, host);
	if (!stored_file(inode))
		return;
	if (!fault_in(bpf_get_current_task_btf(), id))
		return; /* a fault the kernel took for a syscall, not the user's */
	fault_join(ctx, id, f, (__u64)inode);
}

#endif /* GAPTRACE_FAULT_H */
