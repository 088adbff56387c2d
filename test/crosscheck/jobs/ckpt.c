//go:build ignore

/*
 * ckpt: a single-threaded C trainer on the legacy stream whose checkpoint
 * copies go the same way as its loss read.
 *
 * Per step: six kernels of two functions on the legacy default stream, then
 * the loss read as a 4-byte cuMemcpyDtoHAsync_v2 and cuStreamSynchronize of
 * that stream. Every 25 steps, after the step, save_checkpoint copies 48
 * tensors of 512 KiB to a host buffer with the very same pair of calls
 * (copy, then sync, per tensor), writes each to a file and fsyncs it: the
 * whole of save_checkpoint is an io.write stall (torch.save of a CUDA
 * state_dict). A step is from its first launch to its loss sync's return.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "simgpu.h"

#define TENSORS 48
#define TENSOR_BYTES (512 << 10)

static FILE *truth;

static int64_t wall(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t queued_ns(void)
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

#define CU(call)                                                                      \
	do {                                                                          \
		CUresult rc_ = (call);                                                \
		if (rc_ != CUDA_SUCCESS) {                                            \
			fprintf(stderr, "ckpt: %s: CUresult %d\n", #call, (int)rc_); \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

static __attribute__((noinline)) void save_checkpoint(const char *path, CUdeviceptr *weights,
						      unsigned char *staging)
{
	int64_t d0 = queued_ns(), t0 = wall();
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (fd < 0) {
		perror(path);
		exit(1);
	}
	for (int i = 0; i < TENSORS; i++) {
		CU(cuMemcpyDtoHAsync_v2(staging, weights[i], TENSOR_BYTES, NULL));
		CU(cuStreamSynchronize(NULL));
		if (write(fd, staging, TENSOR_BYTES) != TENSOR_BYTES) {
			perror("write");
			exit(1);
		}
	}
	fsync(fd);
	close(fd);
	int64_t t1 = wall();
	if (truth)
		fprintf(truth, "{\"type\":\"stall\",\"cause\":\"io.write\",\"code\":\"save_checkpoint\","
			"\"start\":%lld,\"end\":%lld,\"tid\":%ld,\"run_delay_ns\":%lld}\n", (long long)t0,
			(long long)t1, (long)syscall(SYS_gettid), (long long)(queued_ns() - d0)), fflush(truth);
}

int main(int argc, char **argv)
{
	int steps = 400;
	const char *dir = "/var/tmp";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--truth"))
			truth = fopen(argv[i + 1], "w");
		else if (!strcmp(argv[i], "--steps"))
			steps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--dir"))
			dir = argv[i + 1];
	}
	if (steps < 1 || argc % 2 == 0) {
		fprintf(stderr, "usage: ckpt [--steps N>0] [--dir DIR] [--truth FILE]\n");
		return 2;
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/ckpt-%d.bin", dir, (int)getpid());
	if (truth)
		fprintf(truth, "{\"type\":\"meta\",\"job\":\"ckpt\",\"pid\":%d,\"clock\":\"realtime\"}\n",
			(int)getpid()), fflush(truth);
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction layer, head;
	static char image[] = "ckpt";
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, 0));
	CU(cuCtxCreate_v2(&ctx, 0, dev));
	CU(cuModuleLoadData(&mod, image));
	CU(cuModuleGetFunction(&layer, mod, "sim_kernel_1500"));
	CU(cuModuleGetFunction(&head, mod, "sim_kernel_400"));
	CUdeviceptr weights[TENSORS], loss_dev;
	for (int i = 0; i < TENSORS; i++)
		CU(cuMemAlloc_v2(&weights[i], TENSOR_BYTES));
	CU(cuMemAlloc_v2(&loss_dev, 4));
	unsigned char *staging = malloc(TENSOR_BYTES);
	float loss;
	for (int step = 1; step <= steps; step++) {
		int64_t t0 = wall();
		for (int l = 0; l < 5; l++)
			CU(cuLaunchKernel(layer, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		CU(cuLaunchKernel(head, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		CU(cuMemcpyDtoHAsync_v2(&loss, loss_dev, sizeof loss, NULL));
		CU(cuStreamSynchronize(NULL));
		if (truth)
			fprintf(truth, "{\"type\":\"step\",\"n\":%d,\"start\":%lld,\"end\":%lld}\n", step,
				(long long)t0, (long long)wall()), fflush(truth);
		if (step % 25 == 0)
			save_checkpoint(path, weights, staging);
	}
	unlink(path);
	free(staging);
	if (truth)
		fprintf(truth, "{\"type\":\"end\",\"steps\":%d}\n", steps), fclose(truth);
	return 0;
}
