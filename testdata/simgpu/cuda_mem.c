//go:build ignore

#include "cuda_internal.h"


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

