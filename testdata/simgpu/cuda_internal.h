/*
 * cuda_internal.h - what the files of the simulated CUDA driver share: the
 * handle types, the driver's state (guarded by mu) and the helpers that
 * queue work on streams. Internal to libcuda.so.1: nothing here is exported.
 */
#ifndef SIMGPU_CUDA_INTERNAL_H
#define SIMGPU_CUDA_INTERNAL_H

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

extern pthread_mutex_t mu;
extern int initialized;
extern int ndev;
extern struct device devs[MAX_DEVICES];
extern struct CUctx_st *contexts;
extern struct alloc *allocs;
extern __thread struct CUctx_st *current;

extern uint64_t cfg_kernel_ns;
extern uint64_t cfg_graph_ns;
extern double cfg_pcie_gbps; /* host<->device copies, bytes per ns */
extern double cfg_device_gbps; /* device-to-device copies and memsets */
extern double cfg_pageable_gbps; /* host staging of pageable async copies */
extern uint64_t cfg_mem_bytes;
extern _Atomic uint64_t alloc_delay_ns;

extern simgpu_busy_fn busy_fn;
extern void *busy_arg;

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Block until CLOCK_MONOTONIC reaches t, in a syscall like a real driver. */
static inline void wait_until(uint64_t t)
{
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
			      .tv_nsec = (long)(t % 1000000000ull)};
	while (now_ns() < t) {
		int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		if (rc != 0 && rc != EINTR)
			break;
	}
}

static inline double env_double(const char *name, double def)
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

static inline uint64_t copy_ns(size_t bytes, double gbps)
{
	uint64_t d = (uint64_t)((double)bytes / gbps);
	return d < 1000 ? 1000 : d; /* ~1 us minimum, like a real copy engine */
}

/* cuda.c: the stream and device model */
void stream_init(struct CUstream_st *s, struct CUctx_st *ctx, uint32_t id);
struct CUctx_st *ctx_new(int dev, int primary);
struct CUstream_st *resolve(CUstream h, int ptsz);
uint64_t ctx_busy_until(struct CUctx_st *c);
CUresult enqueue(CUstream h, int ptsz, uint64_t dur, uint32_t kind);
CUresult launch(CUfunction f, CUstream h, int ptsz);
CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, int ptsz);
CUresult graph_launch(CUgraphExec g, CUstream h, int ptsz);
CUresult copy_2d(const CUDA_MEMCPY2D *p, CUstream h, int ptsz);
CUresult copy_3d(const CUDA_MEMCPY3D *p, CUstream h, int ptsz);
CUresult memset_async(size_t n, size_t elt, CUstream h, int ptsz);
CUresult sync_copy(size_t bytes, double gbps);
void run_sync_hook(CUstream h);
CUresult stream_sync(CUstream h, int ptsz);
CUresult event_record(CUevent ev, CUstream h, int ptsz);
CUresult do_alloc(CUdeviceptr *dptr, size_t bytes, int delay);
CUresult do_free(CUdeviceptr p, int sync);
CUresult stream_check_dev(CUdevice dev);

#endif /* SIMGPU_CUDA_INTERNAL_H */
