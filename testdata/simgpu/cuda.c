//go:build ignore

/*
 * cuda.c - the simulated CUDA driver (libcuda.so.1).
 *
 * Exports the real driver-API names with the real signatures so that uprobes
 * written for the NVIDIA driver attach to it unchanged. Nothing runs on a
 * device: every stream keeps the simulated time at which its queued work
 * completes (busy_until), work is appended to the shared per-device
 * timeline (timeline.h) that the simulated NVML reads, and synchronizing
 * calls block the host in clock_nanosleep until that time, as a real driver
 * blocks in a syscall.
 *
 * Stream semantics follow CUDA's:
 *  - work on a stream starts when the previous work on that stream ends, or
 *    at the host time of the call if the stream is idle;
 *  - the legacy default stream (NULL / CU_STREAM_LEGACY) waits for all
 *    blocking streams of its context, and blocking streams wait for it;
 *    streams created with CU_STREAM_NON_BLOCKING do neither;
 *  - the per-thread default stream (the _ptsz entry points with a NULL
 *    stream, or CU_STREAM_PER_THREAD) is simulated as one blocking stream
 *    per context.
 *
 * Kernel duration is encoded in the function name: cuModuleGetFunction(&f,
 * mod, "sim_kernel_<US>") returns a function whose launches run US
 * microseconds; any other name runs SIMGPU_KERNEL_US (default 50).
 *
 * Every exported entry point is a separate, non-inlined function that only
 * calls internal helpers (hidden: -fvisibility=hidden), never another
 * exported entry point, so one API call hits exactly one uprobe.
 * -fno-ipa-icf in the Makefile keeps the compiler from folding look-alike
 * entry points into thunks of each other.
 *
 * This file holds the driver's state and its stream and device model;
 * cuda_ctx.c the entry points for initialization, devices, contexts,
 * streams and events; cuda_launch.c modules, launches and graphs;
 * cuda_mem.c copies, memsets and memory. cuda_internal.h declares what
 * they share.
 */
#include "cuda_internal.h"

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
int initialized;
int ndev;
struct device devs[MAX_DEVICES];
struct CUctx_st *contexts;
struct alloc *allocs;
__thread struct CUctx_st *current;

uint64_t cfg_kernel_ns = 50000;
uint64_t cfg_graph_ns = 500000;
double cfg_pcie_gbps = 20.0;   /* host<->device copies, bytes per ns */
double cfg_device_gbps = 1000; /* device-to-device copies and memsets */
double cfg_pageable_gbps = 6; /* host staging of pageable async copies */
uint64_t cfg_mem_bytes = 80ull << 30;
_Atomic uint64_t alloc_delay_ns;

simgpu_busy_fn busy_fn;
void *busy_arg;

void stream_init(struct CUstream_st *s, struct CUctx_st *ctx, uint32_t id)
{
	memset(s, 0, sizeof(*s));
	s->magic = MAGIC_STREAM;
	s->id = id;
	s->ctx = ctx;
}

struct CUctx_st *ctx_new(int dev, int primary)
{
	struct CUctx_st *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->magic = MAGIC_CTX;
	c->dev = dev;
	c->primary = primary;
	stream_init(&c->legacy, c, 0);
	stream_init(&c->per_thread, c, 1);
	c->next_stream_id = 2;
	c->next = contexts;
	contexts = c;
	/* A context makes the process visible on the device, as in nvidia-smi. */
	simgpu_timeline_register_pid(devs[dev].tl, (uint32_t)getpid(), devs[dev].mem_used);
	return c;
}

/* Resolve a stream handle; caller holds mu. NULL means invalid. */
struct CUstream_st *resolve(CUstream h, int ptsz)
{
	if (!initialized)
		return NULL;
	if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
		if (current == NULL)
			return NULL;
		if (h == CU_STREAM_PER_THREAD || (h == NULL && ptsz))
			return &current->per_thread;
		return &current->legacy;
	}
	if (h->magic != MAGIC_STREAM)
		return NULL;
	return h;
}

/* Time at which new work on s may start: the stream's own queue plus the
 * legacy default stream's implicit synchronization. Caller holds mu. */
static uint64_t ready_time(struct CUstream_st *s, uint64_t now)
{
	uint64_t t = s->busy_until > now ? s->busy_until : now;
	struct CUctx_st *c = s->ctx;
	if (s == &c->legacy) {
		if (c->orphan_until > t)
			t = c->orphan_until;
		if (c->per_thread.busy_until > t)
			t = c->per_thread.busy_until;
		for (struct CUstream_st *o = c->streams; o != NULL; o = o->next)
			if (!(o->flags & CU_STREAM_NON_BLOCKING) && o->busy_until > t)
				t = o->busy_until;
	} else if (!(s->flags & CU_STREAM_NON_BLOCKING) && c->legacy.busy_until > t) {
		t = c->legacy.busy_until;
	}
	return t;
}

/* Queue dur ns of work on s; caller holds mu. */
static void occupy(struct CUstream_st *s, uint64_t dur, uint32_t kind, uint64_t *start,
		   uint64_t *end)
{
	uint64_t st = ready_time(s, now_ns());
	uint64_t en = st + dur;
	s->busy_until = en;
	int dev = s->ctx->dev;
	simgpu_timeline_add(devs[dev].tl, st, en, kind, s->id);
	if (busy_fn != NULL)
		busy_fn(busy_arg, dev, st, en, kind, s->id);
	if (start != NULL)
		*start = st;
	if (end != NULL)
		*end = en;
}

uint64_t ctx_busy_until(struct CUctx_st *c)
{
	uint64_t t = c->legacy.busy_until;
	if (c->orphan_until > t)
		t = c->orphan_until;
	if (c->per_thread.busy_until > t)
		t = c->per_thread.busy_until;
	for (struct CUstream_st *o = c->streams; o != NULL; o = o->next)
		if (o->busy_until > t)
			t = o->busy_until;
	return t;
}

static uint64_t device_busy_until(int dev)
{
	uint64_t t = 0;
	for (struct CUctx_st *c = contexts; c != NULL; c = c->next)
		if (c->dev == dev) {
			uint64_t u = ctx_busy_until(c);
			if (u > t)
				t = u;
		}
	return t;
}

CUresult enqueue(CUstream h, int ptsz, uint64_t dur, uint32_t kind)
{
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(h, ptsz);
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_NOT_INITIALIZED;
	}
	occupy(s, dur, kind, NULL, NULL);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult launch(CUfunction f, CUstream h, int ptsz)
{
	if (f == NULL || f->magic != MAGIC_FUNC)
		return CUDA_ERROR_INVALID_HANDLE;
	return enqueue(h, ptsz, f->dur_ns, SIMGPU_KIND_KERNEL);
}

CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, int ptsz)
{
	if (cfg == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, cfg->hStream, ptsz);
}

CUresult graph_launch(CUgraphExec g, CUstream h, int ptsz)
{
	if (g == NULL || g->magic != MAGIC_GEXEC)
		return CUDA_ERROR_INVALID_HANDLE;
	return enqueue(h, ptsz, g->dur_ns, SIMGPU_KIND_KERNEL);
}

/* The tracer reads these two fields of cuMemcpy2DAsync's argument at fixed
 * offsets (bpf/cuda.c, AL_2D). */
_Static_assert(offsetof(CUDA_MEMCPY2D, WidthInBytes) == 112, "CUDA_MEMCPY2D.WidthInBytes at 112");
_Static_assert(offsetof(CUDA_MEMCPY2D, Height) == 120, "CUDA_MEMCPY2D.Height at 120");
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes");
_Static_assert(offsetof(CUDA_MEMCPY3D, WidthInBytes) == 176, "CUDA_MEMCPY3D.WidthInBytes at 176");
_Static_assert(sizeof(CUDA_MEMCPY3D) == 200, "CUDA_MEMCPY3D is 200 bytes");

/* Copies that touch host memory go over PCIe, the others stay on the device. */
static double copy_gbps(CUmemorytype src, CUmemorytype dst)
{
	return src == CU_MEMORYTYPE_HOST || dst == CU_MEMORYTYPE_HOST ? cfg_pcie_gbps
								       : cfg_device_gbps;
}

CUresult copy_2d(const CUDA_MEMCPY2D *p, CUstream h, int ptsz)
{
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	size_t bytes = p->WidthInBytes * p->Height;
	return enqueue(h, ptsz, copy_ns(bytes, copy_gbps(p->srcMemoryType, p->dstMemoryType)),
		       SIMGPU_KIND_COPY);
}

CUresult copy_3d(const CUDA_MEMCPY3D *p, CUstream h, int ptsz)
{
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	size_t bytes = p->WidthInBytes * p->Height * p->Depth;
	return enqueue(h, ptsz, copy_ns(bytes, copy_gbps(p->srcMemoryType, p->dstMemoryType)),
		       SIMGPU_KIND_COPY);
}

/* A memset of n elements of elt bytes each. */
CUresult memset_async(size_t n, size_t elt, CUstream h, int ptsz)
{
	return enqueue(h, ptsz, copy_ns(n * elt, cfg_device_gbps), SIMGPU_KIND_MEMSET);
}

/* Synchronous copy: ordered on the legacy default stream, host blocks. */
CUresult sync_copy(size_t bytes, double gbps)
{
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(NULL, 0);
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
	}
	uint64_t end;
	occupy(s, copy_ns(bytes, gbps), SIMGPU_KIND_COPY, NULL, &end);
	pthread_mutex_unlock(&mu);
	wait_until(end);
	return CUDA_SUCCESS;
}

/* Set by libnccl: settles the collectives a sync covers whose end depends
 * on peers (h NULL: every stream), before the sync reads when its stream
 * is done. Called without mu. */
static _Atomic(simgpu_sync_hook_fn) sync_hook;

void run_sync_hook(CUstream h)
{
	simgpu_sync_hook_fn fn = atomic_load(&sync_hook);
	if (fn != NULL)
		fn(h);
}

CUresult stream_sync(CUstream h, int ptsz)
{
	run_sync_hook(h);
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(h, ptsz);
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_NOT_INITIALIZED;
	}
	uint64_t t = s->busy_until;
	pthread_mutex_unlock(&mu);
	wait_until(t);
	return CUDA_SUCCESS;
}

CUresult event_record(CUevent ev, CUstream h, int ptsz)
{
	if (ev == NULL || ev->magic != MAGIC_EVENT)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(h, ptsz);
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_NOT_INITIALIZED;
	}
	ev->time = ready_time(s, now_ns());
	ev->recorded = 1;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult do_alloc(CUdeviceptr *dptr, size_t bytes, int delay)
{
	if (dptr == NULL || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (delay) {
		uint64_t d = atomic_load(&alloc_delay_ns);
		if (d > 0)
			wait_until(now_ns() + d);
	}
	pthread_mutex_lock(&mu);
	if (current == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
	}
	struct device *d = &devs[current->dev];
	struct alloc *a = malloc(sizeof(*a));
	if (a == NULL || d->mem_used + bytes > cfg_mem_bytes) {
		free(a);
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->ptr = d->next_ptr;
	a->bytes = bytes;
	a->dev = current->dev;
	a->next = allocs;
	allocs = a;
	d->next_ptr += (bytes + 511) & ~(size_t)511;
	d->mem_used += bytes;
	simgpu_timeline_register_pid(d->tl, (uint32_t)getpid(), d->mem_used);
	*dptr = a->ptr;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult do_free(CUdeviceptr p, int sync)
{
	if (p == 0)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	struct alloc **pp = &allocs;
	while (*pp != NULL && (*pp)->ptr != p)
		pp = &(*pp)->next;
	if (*pp == NULL) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	int dev = (*pp)->dev;
	uint64_t t = sync ? device_busy_until(dev) : 0;
	pthread_mutex_unlock(&mu);
	/* cuMemFree implicitly synchronizes the device, like the real driver. */
	if (sync)
		wait_until(t);
	pthread_mutex_lock(&mu);
	pp = &allocs;
	while (*pp != NULL && (*pp)->ptr != p)
		pp = &(*pp)->next;
	if (*pp != NULL) {
		struct alloc *a = *pp;
		*pp = a->next;
		devs[dev].mem_used -= a->bytes;
		simgpu_timeline_register_pid(devs[dev].tl, (uint32_t)getpid(), devs[dev].mem_used);
		free(a);
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult stream_check_dev(CUdevice dev)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Simulator control                                                   */

API CUresult simgpu_enqueue(CUstream hStream, uint64_t dur_ns, uint32_t kind, uint64_t *start_ns,
			    uint64_t *end_ns)
{
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(hStream, 0);
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_NOT_INITIALIZED;
	}
	occupy(s, dur_ns, kind, start_ns, end_ns);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API void simgpu_set_alloc_delay_ns(uint64_t ns)
{
	atomic_store(&alloc_delay_ns, ns);
}

API void simgpu_set_sync_hook(simgpu_sync_hook_fn fn)
{
	atomic_store(&sync_hook, fn);
}

API void simgpu_set_busy_callback(simgpu_busy_fn fn, void *arg)
{
	pthread_mutex_lock(&mu);
	busy_fn = fn;
	busy_arg = arg;
	pthread_mutex_unlock(&mu);
}

API uint32_t simgpu_stream_id(CUstream hStream)
{
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(hStream, 0);
	uint32_t id = s != NULL ? s->id : UINT32_MAX;
	pthread_mutex_unlock(&mu);
	return id;
}
