//go:build ignore

#include "cuda_internal.h"


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

