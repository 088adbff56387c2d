//go:build ignore

/*
 * stripped: a native loop built with -s (no symbol table), no Python: the
 * only step signal left is the pattern of the work.
 *
 * Two non-blocking streams: each step uploads 2 MiB on the copy stream,
 * records an event the compute stream waits for, launches eight kernels on
 * the compute stream, records a second event and waits for it with
 * cuEventSynchronize. Every 12th step first sleeps 25 ms (a rate limiter),
 * a sleep stall whose code cannot be named (no symbols): its truth code is
 * empty.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "simgpu.h"

static int64_t rt(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t rq(void)
{
	long long a = 0, b = 0;
	FILE *f = fopen("/proc/thread-self/schedstat", "r");
	if (f) {
		if (fscanf(f, "%lld %lld", &a, &b) != 2)
			b = 0;
		fclose(f);
	}
	return b;
}

static void must(CUresult rc, int line)
{
	if (rc != CUDA_SUCCESS) {
		fprintf(stderr, "stripped: driver call at line %d: %d\n", line, (int)rc);
		exit(1);
	}
}
#define M(x) must((x), __LINE__)

int main(int argc, char **argv)
{
	FILE *out = NULL;
	int n = 500;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--truth"))
			out = fopen(argv[i + 1], "w");
		else if (!strcmp(argv[i], "--steps"))
			n = atoi(argv[i + 1]);
	}
	if (n < 1 || argc % 2 == 0) {
		fprintf(stderr, "usage: stripped [--steps N>0] [--truth FILE]\n");
		return 2;
	}
	if (out)
		fprintf(out, "{\"type\":\"meta\",\"job\":\"stripped\",\"pid\":%d,\"clock\":\"realtime\"}\n",
			(int)getpid()), fflush(out);
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction k[3];
	CUstream cs, xs;
	CUevent in_ready, out_ready;
	CUdeviceptr buf;
	void *pinned;
	static char img[] = "stripped";
	M(cuInit(0));
	M(cuDeviceGet(&dev, 0));
	M(cuDevicePrimaryCtxRetain(&ctx, dev));
	M(cuCtxSetCurrent(ctx));
	M(cuModuleLoadData(&mod, img));
	M(cuModuleGetFunction(&k[0], mod, "sim_kernel_800"));
	M(cuModuleGetFunction(&k[1], mod, "sim_kernel_1200"));
	M(cuModuleGetFunction(&k[2], mod, "sim_kernel_250"));
	M(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
	M(cuStreamCreate(&xs, CU_STREAM_NON_BLOCKING));
	M(cuEventCreate(&in_ready, 0));
	M(cuEventCreate(&out_ready, 0));
	M(cuMemAlloc_v2(&buf, 2 << 20));
	M(cuMemAllocHost_v2(&pinned, 2 << 20));
	for (int s = 1; s <= n; s++) {
		if (s % 12 == 0) {
			int64_t d = rq(), a = rt();
			struct timespec ts = {0, 25000000};
			nanosleep(&ts, NULL);
			if (out)
				fprintf(out, "{\"type\":\"stall\",\"cause\":\"sleep\",\"code\":\"\",\"start\":%lld,"
					"\"end\":%lld,\"tid\":%ld,\"run_delay_ns\":%lld}\n", (long long)a,
					(long long)rt(), (long)syscall(SYS_gettid), (long long)(rq() - d)), fflush(out);
		}
		int64_t a = rt();
		M(cuMemcpyHtoDAsync_v2(buf, pinned, 2 << 20, xs));
		M(cuEventRecord(in_ready, xs));
		M(cuStreamWaitEvent(cs, in_ready, 0));
		for (int j = 0; j < 8; j++)
			M(cuLaunchKernel(k[j % 3], 1, 1, 1, 1, 1, 1, 0, cs, NULL, NULL));
		M(cuEventRecord(out_ready, cs));
		M(cuEventSynchronize(out_ready));
		if (out)
			fprintf(out, "{\"type\":\"step\",\"n\":%d,\"start\":%lld,\"end\":%lld}\n", s,
				(long long)a, (long long)rt()), fflush(out);
	}
	if (out)
		fprintf(out, "{\"type\":\"end\",\"steps\":%d}\n", n), fclose(out);
	return 0;
}
