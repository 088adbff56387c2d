/* Runs of reads by processes that do not feed the GPU (bpf/syscalls.c).
 *
 * A data-loader worker reads its samples in many calls, one after another
 * (a 4 MiB sample in 256 KiB preads: sixteen records of ~270 µs). All a
 * gap needs of them is when the worker was reading which file, how much,
 * in how many calls: the worker's gap is the main thread's, and its own
 * syscalls take no stacks. So a read of such a process that begins within
 * threshold_ns of the end of the thread's previous read of the same fd
 * (same call) joins that read's run instead of being emitted; the run is
 * one syscall record from its first call's start to its last call's end,
 * its bytes summed and its calls counted (syscall_event.calls). The time
 * between two of its calls, under threshold_ns each, counts as reading.
 *
 * A run is emitted when the thread makes any other traced syscall, when a
 * CPU sample finds it running outside a syscall (computing on what it
 * read: at most one sampling period late), and when it exits.
 */
#ifndef GAPTRACE_READRUN_H
#define GAPTRACE_READRUN_H

/* read_run_flush emits thread id's run of reads, if any. */
static __always_inline void read_run_flush(struct thread_state *t, __u64 id)
{
	if (!t->rr_calls)
		return;
	struct syscall_event *e = reserve(sizeof(*e));
	if (e) {
		hdr_fill(&e->hdr, EV_SYSCALL, K_SYSCALL, id, t->rr_end);
		e->start_ns = t->rr_start;
		e->ret = (__s64)t->rr_bytes;
		e->waker = t->rr_waker;
		e->nr = t->rr_nr;
		e->fd = t->rr_fd;
		e->class = SC_READ;
		e->stack_id = -1;
		e->calls = t->rr_calls;
		submit(e);
	}
	t->rr_calls = 0;
}

/* read_run_join adds the read that thread id just finished (start..now,
 * ret bytes, of fd by syscall nr) to its run when it continues it; false
 * when it does not (the caller emits the run and the read goes its way). */
static __always_inline bool read_run_join(struct thread_state *t, __u64 start, __u64 now, __s64 ret,
					  __s32 fd, __s32 nr)
{
	if (!t->rr_calls || t->rr_fd != fd || t->rr_nr != nr || start < t->rr_end ||
	    start - t->rr_end >= threshold_ns)
		return false;
	t->rr_end = now;
	t->rr_bytes += ret;
	t->rr_calls++;
	if (t->waker)
		t->rr_waker = t->waker;
	return true;
}

/* read_run_start begins a run with a read long enough to be emitted. */
static __always_inline void read_run_start(struct thread_state *t, __u64 start, __u64 now, __s64 ret,
					   __s32 fd, __s32 nr)
{
	t->rr_start = start;
	t->rr_end = now;
	t->rr_bytes = ret;
	t->rr_waker = t->waker;
	t->rr_fd = fd;
	t->rr_nr = nr;
	t->rr_calls = 1;
}

#endif /* GAPTRACE_READRUN_H */
