//go:build ignore

/* CPU samples of the traced threads (perf_event).
 *
 * User space opens one software CPU-clock perf event per CPU, for every
 * task on that CPU, at the sampling rate it chose, and attaches
 * on_cpu_sample to each. The program returns at once unless the task that
 * was running belongs to a traced process; for one that does, it emits the
 * thread's Python stack (bpf/python.h, when the process is CPython) and then
 * its user stack, copied into the record rather than into user_stacks: a
 * sample's stack rarely repeats, and the deduplicating map of the blocking
 * events must not fill up with them.
 *
 * The samples say which code burned the time of a gap charged to the CPU
 * (or to a lock whose holder ran): correlate merges those of the thread the
 * gap belongs to. A sample that finds the thread outside its latest fault
 * ends its burst of faults on a mapped file (fault.h): the thread ran its
 * own code; one that finds it outside a syscall ends its run of reads
 * (readrun.h).
 */
#include "common.h"
#include "python.h"
#include "fault.h"
#include "readrun.h"

SEC("perf_event")
int on_cpu_sample(void *ctx)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	if (!(__u32)id)
		return 0; /* a traced process's idle task never runs; be safe */
	__u64 now = bpf_ktime_get_ns();
	fault_flush_task(bpf_get_current_task_btf(), id, false);
	/* Running outside a syscall, it computes on what it read: its run
	 * of reads is over. */
	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (t && t->rr_calls && !t->sc_start)
		read_run_flush(t, id);
	py_stack(id, now);
	struct cpu_sample_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_CPU_SAMPLE, K_CPU_SAMPLE, id, now);
	long n = bpf_get_stack(ctx, e->ips, sizeof(e->ips), BPF_F_USER_STACK);
	e->depth = n > 0 ? (__u32)(n / sizeof(__u64)) : 0;
	/* ctx is the sampled registers (struct bpf_perf_event_data begins
	 * with them); the verifier rewrites this read to the real ones. */
	struct pt_regs *regs = ctx;
	e->kernel = (regs->cs & 3) == 0;
	submit(e);
	return 0;
}

const struct cpu_sample_event *unused_cpu_sample_event __attribute__((unused));
const struct fault_read_event *unused_fault_read_event __attribute__((unused));
