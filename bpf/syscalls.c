//go:build ignore

/* Syscall tracepoints (syscalls/sys_enter_* and sys_exit_*).
 *
 * One enter and one exit program are attached to every traced syscall's
 * tracepoint; user space fills syscall_classes (syscall number → class) for
 * the architecture it runs on. Enter and exit pair in the per-thread state.
 * A call shorter than threshold_ns, or a futex, poll or sleep of a process
 * that does not feed the GPU (TGID_GPU), is only counted (short_calls);
 * openat and close are always emitted so user space can invalidate its fd
 * cache; an executable file mapping (mmap with PROT_EXEC and an fd) is
 * reported so that libraries dlopen'd late get their uprobes.
 * A call that names its file by path (rename, unlink, truncate: the class
 * map's value says which argument) is emitted with that path.
 * A process that does not feed the GPU has its reads of one fd, call after
 * call, emitted as one record per run (readrun.h).
 * While a probed CUDA/NCCL call is in flight on the thread, its syscalls are
 * not traced: the driver's own waiting is explained by the call itself.
 */
#include "common.h"
#include "python.h"
#include "readrun.h"

#define PROT_EXEC 0x4

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);   /* syscall number */
	__type(value, __u32); /* enum syscall_class; SC_UNTRACED when not traced */
} syscall_classes SEC(".maps");

/* x86-64 numbers of the waits on file descriptors. */
#define NR_POLL 7
#define NR_SELECT 23
#define NR_PSELECT6 270
#define NR_PPOLL 271

/* At the entry of a poll, ppoll, select or pselect6 (sc_arg0, sc_arg1: its
 * first two arguments). One on no file descriptor is a sleep: CPython
 * before 3.11 sleeps with select(0, NULL, NULL, NULL, &tv) (pselect6 in
 * glibc). select rewrites its sets when it returns (to the ready fds, to
 * none on a timeout), so the fds it waits on are taken here: the first
 * word of the read and write sets (fds 0-63, where a select on a socket's
 * few fds lands), kept in sc_arg1; two reads per select on fds. poll's
 * array keeps its fds (the kernel writes back only revents), so it is read
 * at exit, and only for a call long enough to be emitted: entering a poll
 * costs nothing more. */
static __always_inline void wait_enter(struct thread_state *t, __u32 nr,
				       struct trace_event_raw_sys_enter *ctx)
{
	switch (nr) {
	case NR_SELECT:
	case NR_PSELECT6: {
		__u32 nfds = (__u32)t->sc_arg0;
		if (nfds == 0) {
			t->sc_class = SC_SLEEP;
			return;
		}
		__u64 in = 0, out = 0;
		void *rd = (void *)t->sc_arg1;
		void *wr = (void *)BPF_CORE_READ(ctx, args[2]);
		if (rd)
			bpf_probe_read_user(&in, sizeof(in), rd);
		if (wr)
			bpf_probe_read_user(&out, sizeof(out), wr);
		__u64 set = in | out;
		if (nfds < 64)
			set &= (1ULL << nfds) - 1;
		t->sc_arg1 = set;
		return;
	}
	case NR_POLL:
	case NR_PPOLL:
		if (t->sc_arg1 == 0) /* nfds */
			t->sc_class = SC_SLEEP;
		return;
	}
}

SEC("tracepoint/syscalls/sys_enter")
int sys_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	__u32 nr = (__u32)BPF_CORE_READ(ctx, id);
	__u32 *v = bpf_map_lookup_elem(&syscall_classes, &nr);
	if (!v || *v == SC_UNTRACED)
		return 0;
	struct thread_state *t = thread_get(id);
	if (!t || t->call_depth > 0)
		return 0;

	__u32 cls = *v & SC_CLASS_MASK;
	__u32 path_arg = *v >> SC_PATH_SHIFT;
	t->sc_nr = nr;
	t->sc_class = cls;
	t->sc_path = path_arg != 0;
	if (cls == SC_MMAP) {
		t->sc_arg0 = BPF_CORE_READ(ctx, args[2]); /* prot */
		t->sc_arg1 = BPF_CORE_READ(ctx, args[4]); /* fd */
	} else if (path_arg) {
		t->sc_arg0 = (__u64)-1; /* no fd */
		switch (path_arg) {
		case 1:
			t->sc_arg1 = BPF_CORE_READ(ctx, args[0]);
			break;
		case 2:
			t->sc_arg1 = BPF_CORE_READ(ctx, args[1]);
			break;
		case 3:
			t->sc_arg1 = BPF_CORE_READ(ctx, args[2]);
			break;
		default:
			t->sc_arg1 = BPF_CORE_READ(ctx, args[3]);
			break;
		}
	} else {
		t->sc_arg0 = BPF_CORE_READ(ctx, args[0]);
		t->sc_arg1 = BPF_CORE_READ(ctx, args[1]);
	}
	t->sc_flags = cls == SC_OPEN ? (__u32)BPF_CORE_READ(ctx, args[2]) : 0;
	if (cls == SC_POLL)
		wait_enter(t, nr, ctx);
	t->waker = 0;
	t->sc_start = bpf_ktime_get_ns();
	return 0;
}

static __always_inline __s32 fd_of(__u32 cls, __u64 arg0)
{
	switch (cls) {
	case SC_READ:
	case SC_WRITE:
	case SC_FSYNC:
	case SC_NET:
	case SC_CLOSE:
		return (__s32)arg0;
	}
	return -1;
}

struct pollfd {
	__s32 fd;
	__s16 events;
	__s16 revents;
};

#define S_IFMT	 00170000
#define S_IFSOCK 0140000

/* The fds an emitted poll, ppoll, select or pselect6 waited on (see
 * wait_enter), and which of them are sockets: per listed fd three reads
 * (its slot in the thread's fd table, the file's inode, the inode's mode),
 * so user space knows a socket for one even when the connection closes
 * before it resolves the fd. Only here, never for a call that is counted:
 * poll is hot in some jobs. */
static __always_inline void wait_fds(struct syscall_event *e, struct thread_state *t)
{
	__u32 n = 0;
	switch (t->sc_nr) {
	case NR_POLL:
	case NR_PPOLL: {
		/* One read of WAIT_FDS entries, the ones past nfds unused; a
		 * single entry that ends just before an unmapped page is read
		 * alone. */
		struct pollfd pf[WAIT_FDS] = {};
		__u32 nfds = (__u32)t->sc_arg1;
		__u32 k = nfds < WAIT_FDS ? nfds : WAIT_FDS;
		if (bpf_probe_read_user(pf, sizeof(pf), (void *)t->sc_arg0) &&
		    (k > 1 || bpf_probe_read_user(pf, sizeof(pf[0]), (void *)t->sc_arg0)))
			return;
		for (int i = 0; i < WAIT_FDS; i++)
			if (i < k)
				e->wait_fds[i] = pf[i].fd;
		e->wait_nfds = nfds;
		n = k;
		break;
	}
	case NR_SELECT:
	case NR_PSELECT6: {
		__u64 set = t->sc_arg1;
		for (int i = 0; i < WAIT_FDS && set; i++) {
			e->wait_fds[i] = __builtin_popcountll((set & -set) - 1); /* lowest set bit */
			set &= set - 1;
			n++;
		}
		__u32 nfds = (__u32)t->sc_arg0;
		e->wait_nfds = nfds > 64 ? nfds : n + __builtin_popcountll(set);
		break;
	}
	default:
		return; /* epoll_wait, epoll_pwait: the fds are in the epoll set */
	}
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	__u32 max = fdt->max_fds;
	struct file **table = fdt->fd;
	for (int i = 0; i < WAIT_FDS; i++) {
		if (i >= n)
			break;
		__s32 fd = e->wait_fds[i];
		struct file *f = NULL;
		if (fd < 0 || (__u32)fd >= max ||
		    bpf_probe_read_kernel(&f, sizeof(f), &table[fd]) || !f)
			continue;
		if ((BPF_CORE_READ(f, f_inode, i_mode) & S_IFMT) == S_IFSOCK)
			e->wait_socks |= 1U << i;
	}
}

static __always_inline void emit_fd(struct thread_state *t, __u64 id, __u64 now, __s64 ret)
{
	struct fd_event *e = reserve(sizeof(*e));
	if (!e)
		return;
	bool open = t->sc_class == SC_OPEN;
	hdr_fill(&e->hdr, EV_FD, open ? K_OPEN : K_CLOSE, id, now);
	e->start_ns = t->sc_start;
	e->ret = ret;
	if (open) {
		e->fd = (__s32)ret;
		/* openat(dirfd, pathname, ...): the user buffer is still mapped
		 * at exit, and reading it here keeps one record per open. */
		bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)t->sc_arg1);
	} else {
		e->fd = (__s32)t->sc_arg0;
	}
	submit(e);
}

SEC("tracepoint/syscalls/sys_exit")
int sys_exit(struct trace_event_raw_sys_exit *ctx)
{
	__u64 id;
	struct thread_state *t = enter_ret(&id);
	if (!t || t->sc_start == 0)
		return 0;

	__u64 now = bpf_ktime_get_ns();
	__s64 ret = BPF_CORE_READ(ctx, ret);
	__u32 cls = t->sc_class;
	__u64 dur = now - t->sc_start;
	bool gpu = feeds_gpu(id >> 32);

	/* A process that does not feed the GPU reading one fd call after
	 * call: the read joins the run of the reads before it (readrun.h);
	 * any other call emits the run first. */
	if (!gpu && t->rr_calls) {
		if (cls == SC_READ && ret > 0 && !t->sc_path &&
		    read_run_join(t, t->sc_start, now, ret, fd_of(cls, t->sc_arg0), t->sc_nr)) {
			t->sc_start = 0;
			return 0;
		}
		read_run_flush(t, id);
	}

	if (cls == SC_MMAP) {
		t->sc_start = 0;
		if (ret >= 0 && (t->sc_arg0 & PROT_EXEC) && (__s64)t->sc_arg1 >= 0) {
			struct event_hdr *h = reserve(sizeof(*h));
			if (h) {
				hdr_fill(h, EV_MMAP, 0, id, now);
				/* A library mapped executable may be libcuda: its probes
				 * attach after user space rescans the maps, and a loop
				 * that starts right after loading it (a ctypes trainer)
				 * runs unseen until then. */
				submit_now(h);
			}
		}
		return 0;
	}
	if (cls == SC_OPEN || cls == SC_CLOSE)
		emit_fd(t, id, now, ret);

	/* A process that does not feed the GPU (TGID_GPU: a loader worker, a
	 * logging subprocess) reaches a gap only through the I/O its calls
	 * did: its waits on futexes, polls and sleeps are counted like short
	 * calls, not emitted, and its other calls take no stacks. */
	if (dur < threshold_ns || (!gpu && (cls == SC_FUTEX || cls == SC_POLL || cls == SC_SLEEP))) {
		t->sc_start = 0;
		struct short_key k = { .pid_tgid = id, .class = cls };
		__u64 *n = bpf_map_lookup_elem(&short_calls, &k);
		if (n) {
			__sync_fetch_and_add(n, 1);
		} else {
			__u64 one = 1;
			bpf_map_update_elem(&short_calls, &k, &one, BPF_NOEXIST);
		}
		return 0;
	}

	if (!gpu && cls == SC_READ && ret > 0 && !t->sc_path) {
		/* A read long enough to be emitted begins a run. */
		read_run_start(t, t->sc_start, now, ret, fd_of(cls, t->sc_arg0), t->sc_nr);
		t->sc_start = 0;
		return 0;
	}
	if (gpu)
		py_stack(id, now);
	struct syscall_event *e;
	if (t->sc_path) {
		/* The path is still mapped at exit: one record holds the call
		 * and the file it named. */
		struct syscall_path_event *pe = reserve(sizeof(*pe));
		e = (struct syscall_event *)pe;
		if (pe) {
			hdr_fill(&pe->sc.hdr, EV_SYSCALL_PATH, K_SYSCALL, id, now);
			bpf_probe_read_user_str(pe->path, sizeof(pe->path), (void *)t->sc_arg1);
		}
	} else {
		e = reserve(sizeof(*e));
		if (e)
			hdr_fill(&e->hdr, EV_SYSCALL, K_SYSCALL, id, now);
	}
	if (e) {
		e->start_ns = t->sc_start;
		e->ret = ret;
		e->waker = t->waker;
		e->nr = t->sc_nr;
		e->fd = fd_of(cls, t->sc_arg0);
		e->class = cls;
		e->stack_id = -1;
		e->open_flags = t->sc_flags;
		e->calls = 1;
		if (gpu) {
			e->stack_id = user_stack(ctx);
			struct pt_regs *regs =
				(struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
			bpf_probe_read_user(e->sp_words, sizeof(e->sp_words), (void *)regs->sp);
		}
		if (cls == SC_POLL)
			wait_fds(e, t);
		/* A blocking socket call (or a poll on a socket): its peer is
		 * looked up through the fd, which a short-lived connection
		 * closes within milliseconds. */
		if (cls == SC_NET || e->wait_socks)
			submit_now(e);
		else
			submit(e);
	}
	t->sc_start = 0;
	arm_enqueue(t);
	return 0;
}
