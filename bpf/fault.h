/* A traced thread's latest user page fault (tp_btf/page_fault_user, in
 * sched.c), shared by the programs that ask whether a thread is inside
 * one: sched_switch (blocked in it: reading a page of a mapped file in)
 * and the CPU sampler (running the kernel's fault handler for it). The
 * map is created once (tracer/load.go sharedMaps).
 */
#ifndef GAPTRACE_FAULT_H
#define GAPTRACE_FAULT_H

struct fault {
	__u64 addr; /* the faulting address */
	__u64 ip;   /* the faulting instruction */
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

#endif /* GAPTRACE_FAULT_H */
