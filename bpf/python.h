/* CPython stacks at the capture points of blocking events.
 *
 * For a process user space recognised as CPython (tracer/python.go), py_procs
 * holds where its _PyRuntime is and the offsets of the few fields the walk
 * needs, for that interpreter's version. At a capture point (the return of a
 * blocking CUDA call, the exit of a long syscall; never per launch) the
 * thread's PyThreadState is found by its thread_id, which CPython sets to
 * pthread_self() (glibc on x86-64: the thread pointer, the task's fsbase),
 * and its frames are walked innermost first. Each frame gives the address of
 * its code object and where it is in its bytecode; user space reads the code
 * objects (name, file, line table) from the process and caches them, so the
 * programs copy two words a frame and decode nothing.
 *
 * The record goes into the ring just before the event it belongs to, with
 * the same thread and timestamp; a process that is not CPython costs one
 * hash lookup and its events stay as they were.
 */
#ifndef GAPTRACE_PYTHON_H
#define GAPTRACE_PYTHON_H

#include "common.h"

#define PY_STACK_DEPTH 32
/* Frames looked at: entry/shim frames (3.12+) are skipped, not recorded. */
#define PY_WALK_MAX (PY_STACK_DEPTH + 8)
/* Threads of one interpreter looked at to find the current one. */
#define PY_MAX_THREADS 64
/* The most bytes of one frame read at once (every field the walk uses). */
#define PY_FRAME_READ 128

/* Owner of a 3.12+ _PyInterpreterFrame that is an entry frame the C stack
 * owns (a shim, not Python code). */
#define PY_FRAME_OWNED_BY_CSTACK 3

/* Filled by user space per process (tracer/python.go pyOffsets). */
struct py_offsets {
	__u64 runtime;		/* address of _PyRuntime in the process */
	__u32 interp_head;	/* _PyRuntime.interpreters.head */
	__u32 tstate_head;	/* PyInterpreterState: first PyThreadState */
	__u32 tstate_next;	/* PyThreadState.next */
	__u32 tstate_thread_id; /* PyThreadState.thread_id (pthread_self) */
	__u32 tstate_frame;	/* .frame (3.9, 3.10), .cframe (3.11, 3.12), .current_frame (3.13) */
	__s32 cframe_frame;	/* _PyCFrame.current_frame; -1: tstate_frame is the frame */
	__u32 frame_prev;	/* f_back / previous */
	__u32 frame_code;	/* f_code / f_executable */
	__u32 frame_instr;	/* f_lasti (int) / prev_instr / instr_ptr */
	__s32 frame_owner;	/* owner (char); -1: none */
	__u32 frame_read;	/* bytes of a frame to read: past every field above */
	__u32 instr_is_ptr;	/* frame_instr is a pointer (else an int) */
	__u32 code_firstlineno; /* PyCodeObject.co_firstlineno (int) */
	__u32 _pad;
};

/* EV_PYSTACK: the Python frames of the thread, innermost first, for the
 * event of the same thread and ktime_ns that follows it in the ring. */
struct py_stack_event {
	struct event_hdr hdr;
	__u32 depth; /* frames in code/instr */
	__u32 flags; /* PY_F_* */
	__u64 code[PY_STACK_DEPTH]; /* code object addresses */
	/* low half: where the frame is in its code, the instruction pointer's
	 * offset from the code object (3.11+) or f_lasti; high half: the code
	 * object's co_firstlineno as it was at capture, so user space can tell
	 * a code object freed and replaced since from the one the frame ran. */
	__u64 instr[PY_STACK_DEPTH];
};

enum py_flags {
	/* The walk stopped on an unreadable frame or at the depth limit: the
	 * outermost frames are missing. */
	PY_F_TRUNCATED = 1,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* tgid */
	__type(value, struct py_offsets);
} py_procs SEC(".maps");

/* Per CPU: Python stacks captured and the time spent capturing them (the
 * cost that a Python stack adds to a capture point; tests and benchmarks
 * read it). */
struct py_stat {
	__u64 stacks;
	__u64 ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_stat);
} py_stats SEC(".maps");

/* Per CPU: one frame's bytes and the record being built (too big for the
 * BPF stack). The record is copied into the ring once complete, so a walk
 * never holds a ring reservation across its loop. */
struct py_frame_buf {
	__u8 b[PY_FRAME_READ];
};

struct py_scratch {
	struct py_frame_buf frame;
	struct py_stack_event ev;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_scratch);
} py_scratch SEC(".maps");

const struct py_offsets *unused_py_offsets __attribute__((unused));
const struct py_stack_event *unused_py_stack_event __attribute__((unused));
const enum py_flags *unused_py_flags __attribute__((unused));
const struct py_stat *unused_py_stat __attribute__((unused));

/* Only the thread pointer is needed of the task; a flavour of its own keeps
 * vmlinux.h as the other programs use it. */
struct thread_struct___py {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___py {
	struct thread_struct___py thread;
} __attribute__((preserve_access_index));

static __always_inline bool py_read(void *dst, __u32 n, __u64 addr)
{
	return addr && bpf_probe_read_user(dst, n, (void *)addr) == 0;
}

static __always_inline __u64 py_ld64(struct py_frame_buf *f, __u32 off)
{
	off &= PY_FRAME_READ - 1;
	if (off > PY_FRAME_READ - 8)
		return 0;
	return *(__u64 *)(f->b + off);
}

static __always_inline __u64 py_ld32s(struct py_frame_buf *f, __u32 off)
{
	off &= PY_FRAME_READ - 1;
	if (off > PY_FRAME_READ - 4)
		return 0;
	return (__u64)(__s64) * (__s32 *)(f->b + off);
}

/* The current thread's PyThreadState: the one of the main interpreter whose
 * thread_id is this thread's pthread_self. 0 when none is (a thread that
 * never ran Python) or the list could not be read. */
static __always_inline __u64 py_thread_state(struct py_offsets *o)
{
	struct task_struct___py *task = (void *)bpf_get_current_task();
	__u64 self = BPF_CORE_READ(task, thread.fsbase);
	__u64 interp = 0, ts = 0, tid = 0;
	if (!self || !py_read(&interp, sizeof(interp), o->runtime + o->interp_head))
		return 0;
	if (!py_read(&ts, sizeof(ts), interp + o->tstate_head))
		return 0;
	for (int i = 0; i < PY_MAX_THREADS && ts; i++) {
		if (!py_read(&tid, sizeof(tid), ts + o->tstate_thread_id))
			return 0;
		if (tid == self)
			return ts;
		if (!py_read(&ts, sizeof(ts), ts + o->tstate_next))
			return 0;
	}
	return 0;
}

/* What one step of the frame walk needs, copied out of py_offsets. The
 * step keeps the depth and flags in the per-CPU record, not in registers:
 * the verifier then sees the same state at every iteration instead of one
 * per (depth, flags, skipped shims) combination, and the bounded loop
 * verifies in a few thousand instructions (no bpf_loop: kernels from 5.8). */
struct py_walk {
	__u64 frame; /* next frame to read; 0 at the end */
	__u32 size;  /* bytes of a frame to read */
	__u32 prev, code, instr;
	__s32 owner;
	__u32 instr_is_ptr;
	__u32 firstlineno;
};

static __always_inline long py_walk_step(struct py_walk *w)
{
	__u32 zero = 0;
	struct py_scratch *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s || !w->frame)
		return 1;
	__u32 size = w->size;
	if (size < 8 || size > PY_FRAME_READ)
		return 1;
	__u32 n = s->ev.depth;
	if (n >= PY_STACK_DEPTH || bpf_probe_read_user(s->frame.b, size, (void *)w->frame)) {
		s->ev.flags |= PY_F_TRUNCATED;
		return 1;
	}
	bool shim = w->owner >= 0 &&
		    s->frame.b[w->owner & (PY_FRAME_READ - 1)] == PY_FRAME_OWNED_BY_CSTACK;
	if (!shim) {
		__u64 code = py_ld64(&s->frame, w->code);
		__u32 first = 0;
		if (bpf_probe_read_user(&first, sizeof(first), (void *)(code + w->firstlineno))) {
			s->ev.flags |= PY_F_TRUNCATED;
			return 1;
		}
		__u32 at = w->instr_is_ptr ? (__u32)(py_ld64(&s->frame, w->instr) - code)
					   : (__u32)py_ld32s(&s->frame, w->instr);
		s->ev.code[n & (PY_STACK_DEPTH - 1)] = code;
		s->ev.instr[n & (PY_STACK_DEPTH - 1)] = (__u64)first << 32 | at;
		s->ev.depth = n + 1;
	}
	w->frame = py_ld64(&s->frame, w->prev);
	return 0;
}

/* Emit the thread's Python stack for the event (id, now) about to be
 * emitted, when the process is CPython and the thread runs Python. */
static __always_inline void py_stack(__u64 id, __u64 now)
{
	__u32 tgid = id >> 32;
	struct py_offsets *o = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!o)
		return;
	__u32 zero = 0;
	struct py_scratch *s = bpf_map_lookup_elem(&py_scratch, &zero);
	struct py_stat *st = bpf_map_lookup_elem(&py_stats, &zero);
	if (!s || !st)
		return;
	__u64 t0 = bpf_ktime_get_ns();
	__u64 ts = py_thread_state(o);
	if (!ts)
		return;
	struct py_walk w = {
		.size = o->frame_read,
		.prev = o->frame_prev,
		.code = o->frame_code,
		.instr = o->frame_instr,
		.owner = o->frame_owner,
		.instr_is_ptr = o->instr_is_ptr,
		.firstlineno = o->code_firstlineno,
	};
	if (!py_read(&w.frame, sizeof(w.frame), ts + o->tstate_frame))
		return;
	if (o->cframe_frame >= 0 && !py_read(&w.frame, sizeof(w.frame), w.frame + o->cframe_frame))
		return;

	__builtin_memset(&s->ev, 0, sizeof(s->ev));
	hdr_fill(&s->ev.hdr, EV_PYSTACK, 0, id, now);
	for (int i = 0; i < PY_WALK_MAX; i++)
		if (py_walk_step(&w))
			break;
	if (w.frame)
		s->ev.flags |= PY_F_TRUNCATED; /* frames remain past the limit */
	__u64 pending = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	if (bpf_ringbuf_output(&events, &s->ev, sizeof(s->ev),
			       pending >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP)) {
		__u64 *d = bpf_map_lookup_elem(&ring_drops, &zero);
		if (d)
			*d += 1;
	}
	st->stacks++;
	st->ns += bpf_ktime_get_ns() - t0;
}

#endif /* GAPTRACE_PYTHON_H */
