//go:build ignore

/*
 * accum: a C trainer with gradient accumulation, run by a worker pthread.
 *
 * The process's main thread only parses arguments, starts "trainer" and
 * joins it. One optimizer step is four micro-batches (forward_backward:
 * batch upload from pinned memory, three kernels, the micro-batch loss read
 * with an async copy and a stream sync) followed by apply_update (two
 * optimizer kernels, an event recorded and waited for). Every 15 steps
 * evaluate() runs 10 batches with synchronous copies on the legacy stream.
 * Stalls: wait_for_shard sleeps 30 ms before every 9th step, augment_batch
 * computes 25 ms before every 13th.
 *
 * Truth (--truth FILE): JSON Lines, CLOCK_REALTIME ns: meta, one step per
 * optimizer step (first upload to the update's event wait), stall (cause,
 * code, start, end, tid, run_delay_ns), end.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "simgpu.h"

#define MICRO 4

struct model {
	CUstream s;
	CUfunction fwd, bwd, opt;
	CUdeviceptr batch_dev, loss_dev;
	void *batch_host;
	CUevent done;
	float loss;
};

static FILE *truth;
static int nsteps = 300;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t run_delay(void)
{
	long long a = 0, b = 0;
	FILE *f = fopen("/proc/thread-self/schedstat", "r");
	if (!f)
		return 0;
	if (fscanf(f, "%lld %lld", &a, &b) != 2)
		b = 0;
	fclose(f);
	return b;
}

static void check(CUresult rc, const char *what)
{
	if (rc != CUDA_SUCCESS) {
		fprintf(stderr, "accum: %s failed: %d\n", what, (int)rc);
		exit(1);
	}
}

static void note_stall(const char *cause, const char *code, int64_t t0, int64_t t1, int64_t d)
{
	if (truth)
		fprintf(truth, "{\"type\":\"stall\",\"cause\":\"%s\",\"code\":\"%s\",\"start\":%lld,"
			"\"end\":%lld,\"tid\":%ld,\"run_delay_ns\":%lld}\n", cause, code, (long long)t0,
			(long long)t1, (long)syscall(SYS_gettid), (long long)d), fflush(truth);
}

static __attribute__((noinline)) void wait_for_shard(void)
{
	int64_t d = run_delay(), t0 = now_ns();
	struct timespec ts = {0, 30 * 1000000};
	nanosleep(&ts, NULL);
	note_stall("sleep", "wait_for_shard", t0, now_ns(), run_delay() - d);
}

static __attribute__((noinline)) void augment_batch(unsigned char *p, size_t n)
{
	int64_t d = run_delay(), t0 = now_ns(), until = t0 + 25 * 1000000;
	while (now_ns() < until)
		for (size_t i = 0; i < n; i += 4096)
			p[i] = (unsigned char)(p[i] * 13 + 1);
	note_stall("cpu", "augment_batch", t0, now_ns(), run_delay() - d);
}

static __attribute__((noinline)) void forward_backward(struct model *m)
{
	check(cuMemcpyHtoDAsync_v2(m->batch_dev, m->batch_host, 1 << 20, m->s), "upload");
	check(cuLaunchKernel(m->fwd, 1, 1, 1, 1, 1, 1, 0, m->s, NULL, NULL), "fwd");
	check(cuLaunchKernel(m->bwd, 1, 1, 1, 1, 1, 1, 0, m->s, NULL, NULL), "bwd");
	check(cuLaunchKernel(m->bwd, 1, 1, 1, 1, 1, 1, 0, m->s, NULL, NULL), "bwd");
	check(cuMemcpyDtoHAsync_v2(&m->loss, m->loss_dev, sizeof m->loss, m->s), "loss read");
	check(cuStreamSynchronize(m->s), "loss sync");
}

static __attribute__((noinline)) void apply_update(struct model *m)
{
	check(cuLaunchKernel(m->opt, 1, 1, 1, 1, 1, 1, 0, m->s, NULL, NULL), "opt");
	check(cuLaunchKernel(m->opt, 1, 1, 1, 1, 1, 1, 0, m->s, NULL, NULL), "opt");
	check(cuEventRecord(m->done, m->s), "record");
	check(cuEventSynchronize(m->done), "event sync");
}

static __attribute__((noinline)) void evaluate(struct model *m)
{
	static unsigned char host[1 << 20];
	float metric;
	for (int b = 0; b < 10; b++) {
		check(cuMemcpyHtoD_v2(m->batch_dev, host, sizeof host), "eval upload");
		check(cuLaunchKernel(m->fwd, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), "eval fwd");
		check(cuMemcpyDtoH_v2(&metric, m->loss_dev, sizeof metric), "eval read");
	}
}

static void *trainer(void *arg)
{
	struct model *m = arg;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	static char image[] = "accum-module";
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
	check(cuCtxSetCurrent(ctx), "set current");
	check(cuModuleLoadData(&mod, image), "module");
	check(cuModuleGetFunction(&m->fwd, mod, "sim_kernel_700"), "fwd fn");
	check(cuModuleGetFunction(&m->bwd, mod, "sim_kernel_900"), "bwd fn");
	check(cuModuleGetFunction(&m->opt, mod, "sim_kernel_300"), "opt fn");
	check(cuStreamCreate(&m->s, CU_STREAM_NON_BLOCKING), "stream");
	check(cuEventCreate(&m->done, 0), "event");
	check(cuMemAlloc_v2(&m->batch_dev, 1 << 20), "alloc");
	check(cuMemAlloc_v2(&m->loss_dev, 64), "alloc");
	check(cuMemAllocHost_v2(&m->batch_host, 1 << 20), "pinned");
	for (int step = 1; step <= nsteps; step++) {
		if (step % 9 == 0)
			wait_for_shard();
		if (step % 13 == 0)
			augment_batch(m->batch_host, 1 << 20);
		int64_t t0 = now_ns();
		for (int k = 0; k < MICRO; k++)
			forward_backward(m);
		apply_update(m);
		int64_t t1 = now_ns();
		if (truth)
			fprintf(truth, "{\"type\":\"step\",\"n\":%d,\"start\":%lld,\"end\":%lld}\n", step,
				(long long)t0, (long long)t1), fflush(truth);
		if (step % 15 == 0)
			evaluate(m);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--truth") && i + 1 < argc) {
			truth = fopen(argv[++i], "w");
			if (!truth) {
				perror(argv[i]);
				return 1;
			}
		} else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
			nsteps = atoi(argv[++i]);
			if (nsteps < 1) {
				fprintf(stderr, "accum: --steps must be at least 1\n");
				return 2;
			}
		} else {
			fprintf(stderr, "usage: accum [--steps N] [--truth FILE]\n");
			return 2;
		}
	}
	if (truth)
		fprintf(truth, "{\"type\":\"meta\",\"job\":\"accum\",\"pid\":%d,\"clock\":\"realtime\"}\n",
			(int)getpid()), fflush(truth);
	struct model m;
	memset(&m, 0, sizeof m);
	pthread_t t;
	if (pthread_create(&t, NULL, trainer, &m) != 0) {
		fprintf(stderr, "accum: pthread_create failed\n");
		return 1;
	}
	pthread_setname_np(t, "trainer");
	pthread_join(t, NULL);
	if (truth)
		fprintf(truth, "{\"type\":\"end\",\"steps\":%d}\n", nsteps), fclose(truth);
	return 0;
}
