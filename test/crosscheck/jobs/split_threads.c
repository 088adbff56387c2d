//go:build ignore

/*
 * split_threads: a C trainer whose launches and syncs run on two threads.
 *
 * The "producer" pthread enqueues each step (batch upload from pinned
 * memory, forward, two backward, optimizer kernels) on the compute stream,
 * records the step's event and hands the slot to the "consumer" pthread
 * through a semaphore. The consumer waits for the event, reads the loss
 * with an async copy on its own stream and a sync of that stream, and only
 * then returns a credit: the producer runs at most two steps ahead. The
 * process's main thread parses arguments and joins both. Every 20 steps
 * the producer's log_lr() sleeps 20 ms (sleep).
 *
 * Truth (--truth FILE): JSON Lines, CLOCK_REALTIME ns: meta, one step per
 * optimizer step (the producer's first enqueue to the consumer's loss
 * read), stall, end.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "simgpu.h"

#define SLOTS 2

struct shared {
	CUcontext ctx;
	CUstream compute;
	CUfunction fwd, bwd, opt;
	CUdeviceptr batch_dev, loss_dev;
	void *batch_host;
	CUevent done[SLOTS];
	int64_t started[SLOTS];
	sem_t ready, credit;
	float loss;
};

static FILE *truth;
static int nsteps = 1200;
static pthread_mutex_t truth_mu = PTHREAD_MUTEX_INITIALIZER;

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
		fprintf(stderr, "split_threads: %s failed: %d\n", what, (int)rc);
		exit(1);
	}
}

static void put(const char *line)
{
	if (!truth)
		return;
	pthread_mutex_lock(&truth_mu);
	fputs(line, truth);
	fflush(truth);
	pthread_mutex_unlock(&truth_mu);
}

static __attribute__((noinline)) void log_lr(void)
{
	char line[256];
	int64_t d = run_delay(), t0 = now_ns();
	struct timespec ts = {0, 20 * 1000000};
	nanosleep(&ts, NULL);
	snprintf(line, sizeof line, "{\"type\":\"stall\",\"cause\":\"sleep\",\"code\":\"log_lr\",\"start\":%lld,"
		 "\"end\":%lld,\"tid\":%ld,\"run_delay_ns\":%lld}\n", (long long)t0, (long long)now_ns(),
		 (long)syscall(SYS_gettid), (long long)(run_delay() - d));
	put(line);
}

static __attribute__((noinline)) void enqueue_step(struct shared *s, int slot)
{
	check(cuMemcpyHtoDAsync_v2(s->batch_dev, s->batch_host, 1 << 19, s->compute), "upload");
	check(cuLaunchKernel(s->fwd, 1, 1, 1, 1, 1, 1, 0, s->compute, NULL, NULL), "fwd");
	check(cuLaunchKernel(s->bwd, 1, 1, 1, 1, 1, 1, 0, s->compute, NULL, NULL), "bwd");
	check(cuLaunchKernel(s->bwd, 1, 1, 1, 1, 1, 1, 0, s->compute, NULL, NULL), "bwd");
	check(cuLaunchKernel(s->opt, 1, 1, 1, 1, 1, 1, 0, s->compute, NULL, NULL), "opt");
	check(cuEventRecord(s->done[slot], s->compute), "record");
}

static void *producer(void *arg)
{
	struct shared *s = arg;
	check(cuCtxSetCurrent(s->ctx), "producer ctx");
	for (int step = 1; step <= nsteps; step++) {
		sem_wait(&s->credit);
		if (step % 20 == 0)
			log_lr();
		s->started[step % SLOTS] = now_ns();
		enqueue_step(s, step % SLOTS);
		sem_post(&s->ready);
	}
	return NULL;
}

static __attribute__((noinline)) float read_loss(struct shared *s, CUstream own, int slot)
{
	check(cuEventSynchronize(s->done[slot]), "event sync");
	check(cuMemcpyDtoHAsync_v2(&s->loss, s->loss_dev, sizeof s->loss, own), "loss read");
	check(cuStreamSynchronize(own), "loss sync");
	return s->loss;
}

static void *consumer(void *arg)
{
	struct shared *s = arg;
	CUstream own;
	char line[160];
	check(cuCtxSetCurrent(s->ctx), "consumer ctx");
	check(cuStreamCreate(&own, CU_STREAM_NON_BLOCKING), "consumer stream");
	for (int step = 1; step <= nsteps; step++) {
		sem_wait(&s->ready);
		read_loss(s, own, step % SLOTS);
		int64_t t0 = s->started[step % SLOTS];
		sem_post(&s->credit);
		snprintf(line, sizeof line, "{\"type\":\"step\",\"n\":%d,\"start\":%lld,\"end\":%lld}\n", step,
			 (long long)t0, (long long)now_ns());
		put(line);
	}
	return NULL;
}

static void setup(struct shared *s)
{
	CUdevice dev;
	CUmodule mod;
	static char image[] = "split-module";
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuDevicePrimaryCtxRetain(&s->ctx, dev), "retain");
	check(cuCtxSetCurrent(s->ctx), "set current");
	check(cuModuleLoadData(&mod, image), "module");
	check(cuModuleGetFunction(&s->fwd, mod, "sim_kernel_1100"), "fwd fn");
	check(cuModuleGetFunction(&s->bwd, mod, "sim_kernel_1400"), "bwd fn");
	check(cuModuleGetFunction(&s->opt, mod, "sim_kernel_500"), "opt fn");
	check(cuStreamCreate(&s->compute, CU_STREAM_NON_BLOCKING), "stream");
	for (int i = 0; i < SLOTS; i++)
		check(cuEventCreate(&s->done[i], 0), "event");
	check(cuMemAlloc_v2(&s->batch_dev, 1 << 19), "alloc");
	check(cuMemAlloc_v2(&s->loss_dev, 64), "alloc");
	check(cuMemAllocHost_v2(&s->batch_host, 1 << 19), "pinned");
	sem_init(&s->ready, 0, 0);
	sem_init(&s->credit, 0, SLOTS);
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
				fprintf(stderr, "split_threads: --steps must be at least 1\n");
				return 2;
			}
		} else {
			fprintf(stderr, "usage: split_threads [--steps N] [--truth FILE]\n");
			return 2;
		}
	}
	if (truth)
		fprintf(truth, "{\"type\":\"meta\",\"job\":\"split_threads\",\"pid\":%d,\"clock\":\"realtime\"}\n",
			(int)getpid()), fflush(truth);
	static struct shared s;
	setup(&s);
	pthread_t p, c;
	if (pthread_create(&c, NULL, consumer, &s) != 0 || pthread_create(&p, NULL, producer, &s) != 0) {
		fprintf(stderr, "split_threads: pthread_create failed\n");
		return 1;
	}
	pthread_setname_np(p, "producer");
	pthread_setname_np(c, "consumer");
	pthread_join(p, NULL);
	pthread_join(c, NULL);
	if (truth)
		fprintf(truth, "{\"type\":\"end\",\"steps\":%d}\n", nsteps), fclose(truth);
	return 0;
}
