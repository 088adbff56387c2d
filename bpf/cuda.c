//go:build ignore

/* CUDA driver API (libcuda.so.1) uprobes.
 *
 * One program per role; the attach cookie says which function (low byte:
 * event.CUDA) and how to find its stream/size arguments (next byte: layout,
 * third byte: element size for memsets), so a few programs serve every
 * versioned/per-thread-stream variant user space finds in the library.
 *
 * Async copies that may touch host memory also get a return probe: a copy
 * from or to pageable memory returns only once the driver has staged it
 * through its own pinned buffer, which an entry probe alone cannot see.
 *
 * Launches are aggregated per thread: the first launch after a sync or a
 * blocking event is emitted as K_ENQUEUE, the others only bump a counter
 * that the next emitted enqueue or sync carries in its count. Launches are
 * also counted per function (launch_fns); a launch of a function user space
 * marked is emitted as K_ENQUEUE too, carrying the handle, and amid a burst
 * it carries the unflushed launches in pending without flushing them.
 */
/* Probes on the GPU's libraries: entering one marks the process TGID_GPU. */
#define GAPTRACE_GPU_PROBES 1
#include "common.h"
#include "python.h"

enum launch_layout {
	LL_STREAM_ARG9 = 0, /* cuLaunchKernel, cuLaunchCooperativeKernel: hStream 9th */
	LL_CONFIG = 1,	    /* cuLaunchKernelEx: hStream inside CUlaunchConfig */
	LL_STREAM_ARG2 = 2, /* cuGraphLaunch */
};

enum async_layout {
	AL_BYTES3_STREAM4 = 0, /* cuMemcpy{HtoD,DtoH,DtoD,}Async, cuMemsetD{8,16,32}Async */
	AL_PEER = 1,	       /* cuMemcpyPeerAsync: bytes 5th, stream 6th */
	AL_2D = 2,	       /* cuMemcpy2DAsync: CUDA_MEMCPY2D*, stream */
	AL_3D = 3,	       /* cuMemcpy3DAsync: size not decoded, stream 2nd */
	AL_MEMSET2D = 4,       /* cuMemsetD2D{8,16,32}Async: width 4th, height 5th, stream 6th */
};

enum block_layout {
	BL_NONE = 0,	       /* cuCtxSynchronize, cuEventSynchronize, cuMemFree */
	BL_STREAM1 = 1,	       /* cuStreamSynchronize */
	BL_BYTES3 = 2,	       /* synchronous cuMemcpy* */
	BL_BYTES2 = 3,	       /* cuMemAlloc */
	BL_BYTES2_STREAM3 = 4, /* cuMemAllocAsync */
	BL_STREAM2 = 5,	       /* cuMemFreeAsync */
};

/* event.CUDA (event/event.go), kept numerically equal
 * (tracer/enums_test.go checks). The cookie's low byte. */
enum cuda_func {
	CU_LAUNCH_KERNEL = 1,
	CU_LAUNCH_KERNEL_EX = 2,
	CU_LAUNCH_COOPERATIVE_KERNEL = 3,
	CU_GRAPH_LAUNCH = 4,
	CU_MEMCPY_ASYNC = 5,
	CU_MEMSET_ASYNC = 6,
	CU_MEMCPY_HTOD = 7,
	CU_MEMCPY_DTOH = 8,
	CU_MEMCPY_OTHER = 9,
	CU_STREAM_SYNC = 10,
	CU_CTX_SYNC = 11,
	CU_EVENT_SYNC = 12,
	CU_MEM_ALLOC = 13,
	CU_MEM_FREE = 14,
};

/* A return probe emits K_MEMCPY_STAGED for an async copy that kept the host
 * at least this long: a pinned copy returns in a few µs, a staged one takes
 * bytes / host memcpy rate (200 µs is about 1 MB). */
const volatile __u64 copy_block_ns = 200000;

/* A launch at least this long after the thread's previous launch is emitted
 * even while the thread is busy (the default --min-gap): a pause that long
 * can hold an idle gap of at least MinGap. */
const volatile __u64 launch_pause_ns = 1000000;

/* Launches per launched function and process, for user space to pick the
 * functions that clock steps in a loop that enqueues nothing else that
 * repeats (tracer/marks.go): it reads the counts and sets mark on a few.
 * LRU: a process's functions age out after it exits. */
struct launch_fn_key {
	__u32 tgid;
	__u32 _pad;
	__u64 handle;
};

struct launch_fn {
	__u64 count;
	__u32 mark; /* set by user space: emit every launch of it */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct launch_fn_key);
	__type(value, struct launch_fn);
} launch_fns SEC(".maps");

/* Launches are counted per function only under the full probe set, where
 * user space reads the counts (set before load). */
const volatile bool count_launches = false;

/* count_launch counts a launch of handle by the current process and says
 * whether user space marked the function. */
static __always_inline bool count_launch(__u64 id, __u64 handle)
{
	if (!count_launches || !handle)
		return false;
	struct launch_fn_key k = {.tgid = id >> 32, .handle = handle};
	struct launch_fn *f = bpf_map_lookup_elem(&launch_fns, &k);
	if (!f) {
		struct launch_fn n = {.count = 1};
		bpf_map_update_elem(&launch_fns, &k, &n, BPF_NOEXIST);
		return false;
	}
	__sync_fetch_and_add(&f->count, 1);
	return f->mark != 0;
}

/* An async copy in flight, from its entry probe to its return probe. */
struct copy_call {
	__u64 start;
	__u64 stream;
	__u64 bytes;
	__u32 dir; /* cookie byte 3: CU_MEMCPY_HTOD, CU_MEMCPY_DTOH or CU_MEMCPY_OTHER */
	__u32 _pad;
};

/* Keyed by pid_tgid, in this object only: the entry and return of one copy
 * pair here. LRU: a return lost to a thread's exit cannot leak an entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct copy_call);
} copy_calls SEC(".maps");

/* BTF for the enums user space shares (bpf2go -type). */
const enum launch_layout *unused_launch_layout __attribute__((unused));
const enum async_layout *unused_async_layout __attribute__((unused));
const enum block_layout *unused_block_layout __attribute__((unused));
const enum cuda_func *unused_cuda_func __attribute__((unused));

SEC("uprobe")
int cuda_launch(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter(&id);
	if (!t)
		return 0;
	/* A launch long after the thread's previous one is emitted too: the
	 * host paused feeding the GPU without blocking (computing), and the
	 * queue may have drained meanwhile (correlate/quiet.go). */
	__u64 now = bpf_ktime_get_ns();
	__u64 prev = t->last_launch;
	t->last_launch = now;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 layout = (cookie >> 8) & 0xff;
	/* The function: cuLaunchKernelEx takes it second, after its config;
	 * a graph launch's exec is its first argument like a kernel's. */
	__u64 arg1 = PT_REGS_PARM1(ctx), arg2 = PT_REGS_PARM2(ctx);
	/* Both loaded as they are: a select between two context offsets
	 * would be compiled into one load at a computed offset, which the
	 * verifier refuses. */
	asm volatile("" : "+r"(arg1), "+r"(arg2));
	__u64 handle = layout == LL_CONFIG ? arg2 : arg1;
	bool marked = count_launch(id, handle);
	bool busy = t->busy && (prev == 0 || now - prev < launch_pause_ns);
	if (busy) {
		t->launches++;
		if (!marked)
			return 0;
	}

	__u64 stream = 0;
	switch (layout) {
	case LL_STREAM_ARG9:
		stream = stack_arg(ctx, 9);
		break;
	case LL_CONFIG: {
		/* CUlaunchConfig: seven unsigned ints, then CUstream hStream at 32. */
		void *cfg = (void *)PT_REGS_PARM1(ctx);
		bpf_probe_read_user(&stream, sizeof(stream), cfg + 32);
		break;
	}
	case LL_STREAM_ARG2:
		stream = PT_REGS_PARM2(ctx);
		break;
	}

	struct cuda_event *e = reserve(sizeof(*e));
	if (!e) {
		/* keep the launch in the count so totals stay right */
		if (!busy)
			t->launches++;
		return 0;
	}
	hdr_fill(&e->hdr, EV_CUDA, K_ENQUEUE, id, now);
	e->stack_id = -1;
	e->start_ns = now;
	e->stream = stream;
	e->last_launch_ns = prev;
	e->func = cookie & 0xff;
	e->mark = marked ? handle : 0;
	if (busy) {
		/* A marked launch amid a burst flushes nothing: it says how many
		 * launches the thread made since its last flush, itself included,
		 * as a copy does. */
		e->pending = t->launches;
		submit(e);
		return 0;
	}
	e->count = t->launches + 1;
	submit(e);
	t->launches = 0;
	t->busy = 1;
	return 0;
}

SEC("uprobe")
int cuda_async(struct pt_regs *ctx)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 func = cookie & 0xff;
	__u64 elt = (cookie >> 16) & 0xff;
	__u64 bytes = 0, stream = 0;
	switch ((cookie >> 8) & 0xff) {
	case AL_BYTES3_STREAM4:
		bytes = PT_REGS_PARM3(ctx);
		stream = PT_REGS_PARM4(ctx);
		break;
	case AL_PEER:
		bytes = PT_REGS_PARM5(ctx);
		stream = PT_REGS_PARM6(ctx);
		break;
	case AL_2D: {
		/* CUDA_MEMCPY2D: WidthInBytes at 112, Height at 120. */
		void *p = (void *)PT_REGS_PARM1(ctx);
		__u64 wh[2] = {};
		bpf_probe_read_user(wh, sizeof(wh), p + 112);
		bytes = wh[0] * wh[1];
		stream = PT_REGS_PARM2(ctx);
		break;
	}
	case AL_3D:
		stream = PT_REGS_PARM2(ctx);
		break;
	case AL_MEMSET2D:
		bytes = PT_REGS_PARM4(ctx) * PT_REGS_PARM5(ctx);
		stream = PT_REGS_PARM6(ctx);
		break;
	}
	if (elt > 1)
		bytes *= elt;

	__u64 now = bpf_ktime_get_ns();
	__u32 dir = (cookie >> 24) & 0xff;
	if (dir) {
		/* A return probe is attached: pair the call with it. */
		struct copy_call c = {.start = now, .stream = stream, .bytes = bytes, .dir = dir};
		bpf_map_update_elem(&copy_calls, &id, &c, BPF_ANY);
	}
	struct cuda_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	/* Every async probe but the memsets is a copy. */
	hdr_fill(&e->hdr, EV_CUDA, func == CU_MEMSET_ASYNC ? K_MEMSET : K_MEMCPY_ASYNC, id, now);
	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (t) {
		e->last_launch_ns = t->last_launch;
		e->pending = t->launches;
	}
	e->stack_id = -1;
	e->start_ns = now;
	e->stream = stream;
	e->bytes = bytes;
	e->func = func;
	e->dir = dir;
	submit(e);
	return 0;
}

SEC("uprobe")
int cuda_block_enter(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter(&id);
	if (!t)
		return 0;
	/* Only the outermost probed call is timed: the driver may implement one
	 * entry point with another. */
	if (t->call_depth++ > 0)
		return 0;

	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 bytes = 0, stream = 0;
	switch ((cookie >> 8) & 0xff) {
	case BL_STREAM1:
		stream = PT_REGS_PARM1(ctx);
		break;
	case BL_BYTES3:
		bytes = PT_REGS_PARM3(ctx);
		break;
	case BL_BYTES2:
		bytes = PT_REGS_PARM2(ctx);
		break;
	case BL_BYTES2_STREAM3:
		bytes = PT_REGS_PARM2(ctx);
		stream = PT_REGS_PARM3(ctx);
		break;
	case BL_STREAM2:
		stream = PT_REGS_PARM2(ctx);
		break;
	}
	t->call_func = cookie & 0xff;
	t->call_stream = stream;
	t->call_bytes = bytes;
	t->call_start = bpf_ktime_get_ns();
	return 0;
}

SEC("uretprobe")
int cuda_block_exit(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter_ret(&id);
	if (!t || t->call_depth == 0)
		return 0;
	if (--t->call_depth > 0)
		return 0;

	__u64 now = bpf_ktime_get_ns();
	__u32 func = t->call_func;
	__u32 kind;
	switch (func) {
	case CU_STREAM_SYNC:
	case CU_CTX_SYNC:
	case CU_EVENT_SYNC:
		kind = K_SYNC;
		break;
	case CU_MEM_ALLOC:
		kind = K_ALLOC;
		break;
	case CU_MEM_FREE:
		kind = K_FREE;
		break;
	default:
		kind = K_MEMCPY;
	}
	/* The queue may have drained while the host waited: the next launch
	 * ends a gap. */
	arm_enqueue(t);

	py_stack(id, now);
	struct cuda_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_CUDA, kind, id, now);
	e->start_ns = t->call_start;
	e->stream = t->call_stream;
	e->bytes = t->call_bytes;
	e->ret = (__s32)PT_REGS_RC(ctx);
	e->func = func;
	/* At the return the walk starts in the caller: no driver frames. */
	e->stack_id = user_stack(ctx);
	e->last_launch_ns = t->last_launch;
	if (kind == K_SYNC) {
		e->count = t->launches;
		t->launches = 0;
	} else {
		e->pending = t->launches;
	}
	submit(e);
	return 0;
}

SEC("uretprobe")
int cuda_async_exit(struct pt_regs *ctx)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	struct copy_call *c = bpf_map_lookup_elem(&copy_calls, &id);
	if (!c)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct copy_call call = *c;
	bpf_map_delete_elem(&copy_calls, &id);
	if (now - call.start < copy_block_ns)
		return 0;
	/* The host was blocked: the queue may have drained meanwhile, so the
	 * next launch ends a gap. */
	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (t)
		arm_enqueue(t);

	/* The Python frames that made the copy ("pin the host buffer" names
	 * the line), as for a blocking call. */
	py_stack(id, now);
	struct cuda_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_CUDA, K_MEMCPY_STAGED, id, now);
	e->start_ns = call.start;
	e->stream = call.stream;
	e->bytes = call.bytes;
	e->ret = (__s32)PT_REGS_RC(ctx);
	e->func = call.dir;
	e->dir = call.dir;
	e->stack_id = user_stack(ctx);
	submit(e);
	return 0;
}
