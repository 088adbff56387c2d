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
 * calls static helpers, never another exported entry point, so one API call
 * hits exactly one uprobe. -fno-ipa-icf in the Makefile keeps the compiler
 * from folding look-alike entry points into thunks of each other.
 */
#define _GNU_SOURCE
#include "simgpu.h"
#include "timeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((noinline, visibility("default")))

#define MAX_DEVICES 64
#define MAGIC_CTX    0x43545831u
#define MAGIC_STREAM 0x53545231u
#define MAGIC_FUNC   0x46554e31u
#define MAGIC_MOD    0x4d4f4431u
#define MAGIC_EVENT  0x45564e31u
#define MAGIC_GRAPH  0x47525031u
#define MAGIC_GEXEC  0x47455831u

struct CUstream_st {
	uint32_t magic;
	uint32_t id; /* 0 = legacy default stream of the context */
	unsigned int flags;
	struct CUctx_st *ctx;
	uint64_t busy_until;
	struct CUstream_st *next;
};

struct CUctx_st {
	uint32_t magic;
	int dev;
	int primary;
	struct CUstream_st legacy;
	struct CUstream_st per_thread;
	struct CUstream_st *streams; /* created streams */
	uint64_t orphan_until;       /* end of work queued on destroyed streams */
	uint32_t next_stream_id;
	struct CUctx_st *next;
};

struct CUmod_st {
	uint32_t magic;
};

struct CUfunc_st {
	uint32_t magic;
	uint64_t dur_ns;
};

struct CUevent_st {
	uint32_t magic;
	int recorded;
	uint64_t time;
};

struct CUgraph_st {
	uint32_t magic;
};

struct CUgraphExec_st {
	uint32_t magic;
	uint64_t dur_ns;
};

struct alloc {
	CUdeviceptr ptr;
	size_t bytes;
	int dev;
	struct alloc *next;
};

struct device {
	struct simgpu_timeline *tl;
	struct CUctx_st *primary;
	uint64_t mem_used;
	CUdeviceptr next_ptr;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int ndev;
static struct device devs[MAX_DEVICES];
static struct CUctx_st *contexts;
static struct alloc *allocs;
static __thread struct CUctx_st *current;

static uint64_t cfg_kernel_ns = 50000;
static uint64_t cfg_graph_ns = 500000;
static double cfg_pcie_gbps = 20.0;   /* host<->device copies, bytes per ns */
static double cfg_device_gbps = 1000; /* device-to-device copies and memsets */
static double cfg_pageable_gbps = 6; /* host staging of pageable async copies */
static uint64_t cfg_mem_bytes = 80ull << 30;
static _Atomic uint64_t alloc_delay_ns;

static simgpu_busy_fn busy_fn;
static void *busy_arg;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Block until CLOCK_MONOTONIC reaches t, in a syscall like a real driver. */
static void wait_until(uint64_t t)
{
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
			      .tv_nsec = (long)(t % 1000000000ull)};
	while (now_ns() < t) {
		int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		if (rc != 0 && rc != EINTR)
			break;
	}
}

static double env_double(const char *name, double def)
{
	const char *s = getenv(name);
	if (s == NULL || *s == '\0')
		return def;
	char *end;
	double v = strtod(s, &end);
	if (*end != '\0' || v <= 0) {
		fprintf(stderr, "simgpu: ignoring invalid %s=%s\n", name, s);
		return def;
	}
	return v;
}

static uint64_t copy_ns(size_t bytes, double gbps)
{
	uint64_t d = (uint64_t)((double)bytes / gbps);
	return d < 1000 ? 1000 : d; /* ~1 us minimum, like a real copy engine */
}

static void stream_init(struct CUstream_st *s, struct CUctx_st *ctx, uint32_t id)
{
	memset(s, 0, sizeof(*s));
	s->magic = MAGIC_STREAM;
	s->id = id;
	s->ctx = ctx;
}

static struct CUctx_st *ctx_new(int dev, int primary)
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
static struct CUstream_st *resolve(CUstream h, int ptsz)
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

static uint64_t ctx_busy_until(struct CUctx_st *c)
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

static CUresult enqueue(CUstream h, int ptsz, uint64_t dur, uint32_t kind)
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

static CUresult launch(CUfunction f, CUstream h, int ptsz)
{
	if (f == NULL || f->magic != MAGIC_FUNC)
		return CUDA_ERROR_INVALID_HANDLE;
	return enqueue(h, ptsz, f->dur_ns, SIMGPU_KIND_KERNEL);
}

static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, int ptsz)
{
	if (cfg == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, cfg->hStream, ptsz);
}

static CUresult graph_launch(CUgraphExec g, CUstream h, int ptsz)
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

static CUresult copy_2d(const CUDA_MEMCPY2D *p, CUstream h, int ptsz)
{
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	size_t bytes = p->WidthInBytes * p->Height;
	return enqueue(h, ptsz, copy_ns(bytes, copy_gbps(p->srcMemoryType, p->dstMemoryType)),
		       SIMGPU_KIND_COPY);
}

static CUresult copy_3d(const CUDA_MEMCPY3D *p, CUstream h, int ptsz)
{
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	size_t bytes = p->WidthInBytes * p->Height * p->Depth;
	return enqueue(h, ptsz, copy_ns(bytes, copy_gbps(p->srcMemoryType, p->dstMemoryType)),
		       SIMGPU_KIND_COPY);
}

/* A memset of n elements of elt bytes each. */
static CUresult memset_async(size_t n, size_t elt, CUstream h, int ptsz)
{
	return enqueue(h, ptsz, copy_ns(n * elt, cfg_device_gbps), SIMGPU_KIND_MEMSET);
}

/* Synchronous copy: ordered on the legacy default stream, host blocks. */
static CUresult sync_copy(size_t bytes, double gbps)
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

static void run_sync_hook(CUstream h)
{
	simgpu_sync_hook_fn fn = atomic_load(&sync_hook);
	if (fn != NULL)
		fn(h);
}

static CUresult stream_sync(CUstream h, int ptsz)
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

static CUresult event_record(CUevent ev, CUstream h, int ptsz)
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

static CUresult do_alloc(CUdeviceptr *dptr, size_t bytes, int delay)
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

static CUresult do_free(CUdeviceptr p, int sync)
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

static CUresult stream_check_dev(CUdevice dev)
{
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev < 0 || dev >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Initialization, devices, contexts                                   */

API CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (!initialized) {
		cfg_kernel_ns = (uint64_t)(env_double("SIMGPU_KERNEL_US", 50) * 1000);
		cfg_graph_ns = (uint64_t)(env_double("SIMGPU_GRAPH_US", 500) * 1000);
		cfg_pcie_gbps = env_double("SIMGPU_PCIE_GBPS", 20);
		cfg_device_gbps = env_double("SIMGPU_DEVICE_GBPS", 1000);
		cfg_pageable_gbps = env_double("SIMGPU_PAGEABLE_GBPS", 6);
		cfg_mem_bytes = (uint64_t)(env_double("SIMGPU_MEM_GIB", 80) * (double)(1ull << 30));
		const char *a = getenv("SIMGPU_ALLOC_US");
		if (a != NULL && *a != '\0')
			atomic_store(&alloc_delay_ns, (uint64_t)(strtod(a, NULL) * 1000));
		ndev = simgpu_device_count();
		for (int i = 0; i < ndev; i++) {
			devs[i].tl = simgpu_timeline_open(i, 1);
			if (devs[i].tl == NULL) {
				fprintf(stderr, "simgpu: cannot open timeline of device %d: %s\n", i,
					strerror(errno));
				for (int j = 0; j < i; j++) {
					simgpu_timeline_close(devs[j].tl);
					devs[j].tl = NULL;
				}
				pthread_mutex_unlock(&mu);
				return CUDA_ERROR_NO_DEVICE;
			}
			devs[i].next_ptr = 0x7f0000000000ull + ((CUdeviceptr)i << 36);
		}
		initialized = 1;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *version)
{
	if (version == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*version = 13000;
	return CUDA_SUCCESS;
}

static const char *err_string(CUresult e, int name)
{
	switch (e) {
	case CUDA_SUCCESS: return name ? "CUDA_SUCCESS" : "no error";
	case CUDA_ERROR_INVALID_VALUE: return name ? "CUDA_ERROR_INVALID_VALUE" : "invalid argument";
	case CUDA_ERROR_OUT_OF_MEMORY: return name ? "CUDA_ERROR_OUT_OF_MEMORY" : "out of memory";
	case CUDA_ERROR_NOT_INITIALIZED: return name ? "CUDA_ERROR_NOT_INITIALIZED" : "initialization error";
	case CUDA_ERROR_NO_DEVICE: return name ? "CUDA_ERROR_NO_DEVICE" : "no CUDA-capable device is detected";
	case CUDA_ERROR_INVALID_DEVICE: return name ? "CUDA_ERROR_INVALID_DEVICE" : "invalid device ordinal";
	case CUDA_ERROR_INVALID_IMAGE: return name ? "CUDA_ERROR_INVALID_IMAGE" : "device kernel image is invalid";
	case CUDA_ERROR_INVALID_CONTEXT: return name ? "CUDA_ERROR_INVALID_CONTEXT" : "invalid device context";
	case CUDA_ERROR_INVALID_HANDLE: return name ? "CUDA_ERROR_INVALID_HANDLE" : "invalid resource handle";
	case CUDA_ERROR_NOT_FOUND: return name ? "CUDA_ERROR_NOT_FOUND" : "named symbol not found";
	case CUDA_ERROR_NOT_READY: return name ? "CUDA_ERROR_NOT_READY" : "device not ready";
	default: return NULL;
	}
}

API CUresult cuGetErrorString(CUresult error, const char **str)
{
	if (str == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*str = err_string(error, 0);
	return *str != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorName(CUresult error, const char **str)
{
	if (str == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*str = err_string(error, 1);
	return *str != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuDeviceGetCount(int *count)
{
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*count = ndev;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = stream_check_dev(ordinal);
	if (r == CUDA_SUCCESS)
		*device = ordinal;
	return r;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	if (name == NULL || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = stream_check_dev(dev);
	if (r == CUDA_SUCCESS)
		snprintf(name, (size_t)len, "gaptrace simulated GPU");
	return r;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	if (bytes == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = stream_check_dev(dev);
	if (r == CUDA_SUCCESS)
		*bytes = cfg_mem_bytes;
	return r;
}

API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = stream_check_dev(dev);
	if (r == CUDA_SUCCESS) {
		struct CUctx_st *c = ctx_new(dev, 0);
		if (c == NULL) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			current = c;
			*pctx = c;
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	if (ctx == NULL || ctx->magic != MAGIC_CTX || ctx->primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	uint64_t t = ctx_busy_until(ctx);
	pthread_mutex_unlock(&mu);
	wait_until(t);
	pthread_mutex_lock(&mu);
	for (struct CUctx_st **pp = &contexts; *pp != NULL; pp = &(*pp)->next)
		if (*pp == ctx) {
			*pp = ctx->next;
			break;
		}
	for (struct CUstream_st *s = ctx->streams, *n; s != NULL; s = n) {
		n = s->next;
		s->magic = 0;
		free(s);
	}
	if (current == ctx)
		current = NULL;
	ctx->magic = 0;
	free(ctx);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = stream_check_dev(dev);
	if (r == CUDA_SUCCESS) {
		if (devs[dev].primary == NULL)
			devs[dev].primary = ctx_new(dev, 1);
		if (devs[dev].primary == NULL)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*pctx = devs[dev].primary;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	/* The primary context lives until exit; release only validates. */
	return stream_check_dev(dev);
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (ctx != NULL && ctx->magic != MAGIC_CTX)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	current = ctx;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*pctx = current;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *device)
{
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (current == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = current->dev;
	return CUDA_SUCCESS;
}

static CUresult ctx_synchronize(CUcontext ctx)
{
	run_sync_hook(NULL);
	pthread_mutex_lock(&mu);
	if (ctx == NULL)
		ctx = current;
	if (ctx == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
	}
	uint64_t t = ctx_busy_until(ctx);
	pthread_mutex_unlock(&mu);
	wait_until(t);
	return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void)
{
	return ctx_synchronize(NULL);
}

/* CUDA 13's runtime implements cudaDeviceSynchronize with this one: the
 * context is explicit (NULL: the current one). */
API CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	return ctx_synchronize(ctx);
}

/* ------------------------------------------------------------------ */
/* Streams, modules, functions                                         */

API CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
	if (phStream == NULL || (flags & ~CU_STREAM_NON_BLOCKING) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (current == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
	}
	struct CUstream_st *s = malloc(sizeof(*s));
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	stream_init(s, current, current->next_stream_id++);
	s->flags = flags;
	s->next = current->streams;
	current->streams = s;
	*phStream = s;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(CUstream hStream)
{
	if (hStream == NULL || (uintptr_t)hStream <= 2 || hStream->magic != MAGIC_STREAM)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct CUctx_st *c = hStream->ctx;
	for (struct CUstream_st **pp = &c->streams; *pp != NULL; pp = &(*pp)->next)
		if (*pp == hStream) {
			*pp = hStream->next;
			/* Queued work still completes: the context keeps waiting for it. */
			if (hStream->busy_until > c->orphan_until)
				c->orphan_until = hStream->busy_until;
			hStream->magic = 0;
			free(hStream);
			break;
		}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(CUstream hStream)
{
	return stream_sync(hStream, 0);
}

API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	return stream_sync(hStream, 1);
}

API CUresult cuStreamQuery(CUstream hStream)
{
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(hStream, 0);
	uint64_t t = s != NULL ? s->busy_until : 0;
	pthread_mutex_unlock(&mu);
	if (s == NULL)
		return initialized ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_NOT_INITIALIZED;
	return now_ns() >= t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags)
{
	if (hEvent == NULL || hEvent->magic != MAGIC_EVENT)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct CUstream_st *s = resolve(hStream, 0);
	if (s != NULL && hEvent->recorded && hEvent->time > s->busy_until)
		s->busy_until = hEvent->time;
	pthread_mutex_unlock(&mu);
	return s != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	if (module == NULL || image == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	struct CUmod_st *m = malloc(sizeof(*m));
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->magic = MAGIC_MOD;
	*module = m;
	return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(CUmodule hmod)
{
	if (hmod == NULL || hmod->magic != MAGIC_MOD)
		return CUDA_ERROR_INVALID_HANDLE;
	hmod->magic = 0;
	free(hmod);
	return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	if (hfunc == NULL || name == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (hmod == NULL || hmod->magic != MAGIC_MOD)
		return CUDA_ERROR_INVALID_HANDLE;
	struct CUfunc_st *f = malloc(sizeof(*f));
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->magic = MAGIC_FUNC;
	f->dur_ns = cfg_kernel_ns;
	const char *prefix = "sim_kernel_";
	if (strncmp(name, prefix, strlen(prefix)) == 0) {
		char *end;
		unsigned long long us = strtoull(name + strlen(prefix), &end, 10);
		if (*end == '\0' && end != name + strlen(prefix))
			f->dur_ns = us * 1000ull;
	}
	*hfunc = f;
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Launches                                                            */

API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
			    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
			    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
			    void **kernelParams, void **extra)
{
	return launch(f, hStream, 0);
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				 unsigned int gridDimZ, unsigned int blockDimX,
				 unsigned int blockDimY, unsigned int blockDimZ,
				 unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
				 void **extra)
{
	return launch(f, hStream, 1);
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
			      void **extra)
{
	return launch_ex(config, f, 0);
}

API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				   void **kernelParams, void **extra)
{
	return launch_ex(config, f, 1);
}

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				       unsigned int gridDimZ, unsigned int blockDimX,
				       unsigned int blockDimY, unsigned int blockDimZ,
				       unsigned int sharedMemBytes, CUstream hStream,
				       void **kernelParams)
{
	return launch(f, hStream, 0);
}

API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
					    unsigned int gridDimY, unsigned int gridDimZ,
					    unsigned int blockDimX, unsigned int blockDimY,
					    unsigned int blockDimZ, unsigned int sharedMemBytes,
					    CUstream hStream, void **kernelParams)
{
	return launch(f, hStream, 1);
}

API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
	if (phGraph == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraph_st *g = malloc(sizeof(*g));
	if (g == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = MAGIC_GRAPH;
	*phGraph = g;
	return CUDA_SUCCESS;
}

API CUresult cuGraphDestroy(CUgraph hGraph)
{
	if (hGraph == NULL || hGraph->magic != MAGIC_GRAPH)
		return CUDA_ERROR_INVALID_HANDLE;
	hGraph->magic = 0;
	free(hGraph);
	return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
					 unsigned long long flags)
{
	if (phGraphExec == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (hGraph == NULL || hGraph->magic != MAGIC_GRAPH)
		return CUDA_ERROR_INVALID_HANDLE;
	struct CUgraphExec_st *e = malloc(sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = MAGIC_GEXEC;
	e->dur_ns = cfg_graph_ns;
	*phGraphExec = e;
	return CUDA_SUCCESS;
}

API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	if (hGraphExec == NULL || hGraphExec->magic != MAGIC_GEXEC)
		return CUDA_ERROR_INVALID_HANDLE;
	hGraphExec->magic = 0;
	free(hGraphExec);
	return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	return graph_launch(hGraphExec, hStream, 0);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	return graph_launch(hGraphExec, hStream, 1);
}

/* ------------------------------------------------------------------ */
/* Copies and memsets                                                  */

/* Pinned host memory: what cuMemAllocHost_v2/cuMemHostAlloc returned and
 * what cuMemHostRegister_v2 registered. Everything else is pageable. */
#define MAX_PINNED 256
static struct {
	uintptr_t base;
	size_t len;
	int owned; /* allocated here: cuMemFreeHost frees it */
} pinned[MAX_PINNED];
static int npinned;

static CUresult pin_add(void *p, size_t bytes, int owned)
{
	pthread_mutex_lock(&mu);
	if (npinned == MAX_PINNED) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pinned[npinned].base = (uintptr_t)p;
	pinned[npinned].len = bytes;
	pinned[npinned].owned = owned;
	npinned++;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* Removes the pinned range that starts at p and was allocated here (owned)
 * or registered (!owned); 0 when there is none. */
static int pin_remove(const void *p, int owned)
{
	pthread_mutex_lock(&mu);
	for (int i = 0; i < npinned; i++)
		if (pinned[i].base == (uintptr_t)p && pinned[i].owned == owned) {
			pinned[i] = pinned[--npinned];
			pthread_mutex_unlock(&mu);
			return 1;
		}
	pthread_mutex_unlock(&mu);
	return 0;
}

static int is_pinned(const void *p, size_t bytes)
{
	uintptr_t a = (uintptr_t)p;
	int ok = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < npinned && !ok; i++)
		ok = a >= pinned[i].base && a + bytes <= pinned[i].base + pinned[i].len;
	pthread_mutex_unlock(&mu);
	return ok;
}

/* The driver stages a pageable copy through its own pinned buffer with the
 * CPU: the calling thread is busy for bytes / SIMGPU_PAGEABLE_GBPS, on a CPU
 * and in no syscall, like a memcpy. */
static void stage_pageable(size_t bytes)
{
	uint64_t end = now_ns() + copy_ns(bytes, cfg_pageable_gbps);
	while (now_ns() < end)
		;
}

API CUresult cuMemAllocHost_v2(void **pp, size_t bytes)
{
	if (pp == NULL || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *p = calloc(1, bytes);
	if (p == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = pin_add(p, bytes, 1);
	if (r != CUDA_SUCCESS) {
		free(p);
		return r;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

API CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
	(void)flags;
	return cuMemAllocHost_v2(pp, bytes);
}

API CUresult cuMemFreeHost(void *p)
{
	if (!pin_remove(p, 1))
		return CUDA_ERROR_INVALID_VALUE;
	free(p);
	return CUDA_SUCCESS;
}

API CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags)
{
	(void)flags;
	if (p == NULL || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return pin_add(p, bytes, 0);
}

API CUresult cuMemHostUnregister(void *p)
{
	return pin_remove(p, 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Host-to-device from pageable memory: the host stages every byte before
 * the call returns; the DMA of the staged chunks runs on the stream. */
static CUresult htod_async(const void *src, size_t bytes, CUstream h, int ptsz)
{
	CUresult r = enqueue(h, ptsz, copy_ns(bytes, cfg_pcie_gbps), SIMGPU_KIND_COPY);
	if (r == CUDA_SUCCESS && !is_pinned(src, bytes))
		stage_pageable(bytes);
	return r;
}

/* Device-to-host into pageable memory: the host copies every byte out of
 * the staging buffer before the call returns. */
static CUresult dtoh_async(void *dst, size_t bytes, CUstream h, int ptsz)
{
	CUresult r = enqueue(h, ptsz, copy_ns(bytes, cfg_pcie_gbps), SIMGPU_KIND_COPY);
	if (r == CUDA_SUCCESS && !is_pinned(dst, bytes))
		stage_pageable(bytes);
	return r;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream hStream)
{
	return htod_async(src, bytes, hStream, 0);
}

API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t bytes,
				       CUstream hStream)
{
	return htod_async(src, bytes, hStream, 1);
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream hStream)
{
	return dtoh_async(dst, bytes, hStream, 0);
}

API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t bytes, CUstream hStream)
{
	return dtoh_async(dst, bytes, hStream, 1);
}

API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hStream)
{
	return enqueue(hStream, 0, copy_ns(bytes, cfg_device_gbps), SIMGPU_KIND_COPY);
}

API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hStream)
{
	return enqueue(hStream, 1, copy_ns(bytes, cfg_device_gbps), SIMGPU_KIND_COPY);
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hStream)
{
	return enqueue(hStream, 0, copy_ns(n, cfg_device_gbps), SIMGPU_KIND_MEMSET);
}

API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hStream)
{
	return enqueue(hStream, 1, copy_ns(n, cfg_device_gbps), SIMGPU_KIND_MEMSET);
}

API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream hStream)
{
	return enqueue(hStream, 0, copy_ns(n * 4, cfg_device_gbps), SIMGPU_KIND_MEMSET);
}

API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int ui, size_t n, CUstream hStream)
{
	return enqueue(hStream, 1, copy_ns(n * 4, cfg_device_gbps), SIMGPU_KIND_MEMSET);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hStream)
{
	return enqueue(hStream, 0, copy_ns(bytes, cfg_device_gbps), SIMGPU_KIND_COPY);
}

API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
				       CUstream hStream)
{
	return enqueue(hStream, 1, copy_ns(bytes, cfg_device_gbps), SIMGPU_KIND_COPY);
}

API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			       CUcontext srcContext, size_t bytes, CUstream hStream)
{
	return enqueue(hStream, 0, copy_ns(bytes, cfg_device_gbps), SIMGPU_KIND_COPY);
}

API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext,
				    CUdeviceptr srcDevice, CUcontext srcContext, size_t bytes,
				    CUstream hStream)
{
	return enqueue(hStream, 1, copy_ns(bytes, cfg_device_gbps), SIMGPU_KIND_COPY);
}

API CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	return copy_2d(pCopy, hStream, 0);
}

API CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	return copy_2d(pCopy, hStream, 1);
}

API CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
	return copy_3d(pCopy, hStream, 0);
}

API CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
	return copy_3d(pCopy, hStream, 1);
}

API CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t n, CUstream hStream)
{
	return memset_async(n, 2, hStream, 0);
}

API CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short us, size_t n, CUstream hStream)
{
	return memset_async(n, 2, hStream, 1);
}

API CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t dstPitch, unsigned char uc, size_t width,
			       size_t height, CUstream hStream)
{
	return memset_async(width * height, 1, hStream, 0);
}

API CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dst, size_t dstPitch, unsigned char uc,
				    size_t width, size_t height, CUstream hStream)
{
	return memset_async(width * height, 1, hStream, 1);
}

API CUresult cuMemsetD2D16Async(CUdeviceptr dst, size_t dstPitch, unsigned short us, size_t width,
				size_t height, CUstream hStream)
{
	return memset_async(width * height, 2, hStream, 0);
}

API CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dst, size_t dstPitch, unsigned short us,
				     size_t width, size_t height, CUstream hStream)
{
	return memset_async(width * height, 2, hStream, 1);
}

API CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t dstPitch, unsigned int ui, size_t width,
				size_t height, CUstream hStream)
{
	return memset_async(width * height, 4, hStream, 0);
}

API CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dst, size_t dstPitch, unsigned int ui,
				     size_t width, size_t height, CUstream hStream)
{
	return memset_async(width * height, 4, hStream, 1);
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
	return sync_copy(bytes, cfg_pcie_gbps);
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
	return sync_copy(bytes, cfg_pcie_gbps);
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
	return sync_copy(bytes, cfg_device_gbps);
}

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
	return sync_copy(bytes, cfg_device_gbps);
}

/* ------------------------------------------------------------------ */
/* Events                                                              */

API CUresult cuEventCreate(CUevent *phEvent, unsigned int flags)
{
	if (phEvent == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	struct CUevent_st *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = MAGIC_EVENT;
	*phEvent = e;
	return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(CUevent hEvent)
{
	if (hEvent == NULL || hEvent->magic != MAGIC_EVENT)
		return CUDA_ERROR_INVALID_HANDLE;
	hEvent->magic = 0;
	free(hEvent);
	return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	return event_record(hEvent, hStream, 0);
}

API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	return event_record(hEvent, hStream, 1);
}

API CUresult cuEventQuery(CUevent hEvent)
{
	if (hEvent == NULL || hEvent->magic != MAGIC_EVENT)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	uint64_t t = hEvent->time;
	pthread_mutex_unlock(&mu);
	return now_ns() >= t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

API CUresult cuEventSynchronize(CUevent hEvent)
{
	if (hEvent == NULL || hEvent->magic != MAGIC_EVENT)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	uint64_t t = hEvent->time;
	pthread_mutex_unlock(&mu);
	wait_until(t);
	return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime(float *ms, CUevent hStart, CUevent hEnd)
{
	if (ms == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (hStart == NULL || hStart->magic != MAGIC_EVENT || hEnd == NULL ||
	    hEnd->magic != MAGIC_EVENT)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	uint64_t s = hStart->time, e = hEnd->time;
	int ok = hStart->recorded && hEnd->recorded;
	pthread_mutex_unlock(&mu);
	if (!ok)
		return CUDA_ERROR_INVALID_HANDLE;
	if (now_ns() < e)
		return CUDA_ERROR_NOT_READY;
	*ms = (float)((double)((int64_t)(e - s)) / 1e6);
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	return do_alloc(dptr, bytes, 1);
}

API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return do_free(dptr, 1);
}

API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream hStream)
{
	return do_alloc(dptr, bytes, 0);
}

API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	return do_free(dptr, 0);
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
	if (free_bytes == NULL || total_bytes == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (current == NULL) {
		pthread_mutex_unlock(&mu);
		return initialized ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
	}
	*total_bytes = cfg_mem_bytes;
	*free_bytes = cfg_mem_bytes - devs[current->dev].mem_used;
	pthread_mutex_unlock(&mu);
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
