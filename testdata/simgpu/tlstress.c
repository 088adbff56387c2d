//go:build ignore

/*
 * tlstress - checks the shared timeline under concurrent writers and ring
 * wraparound (run by simgpu_test.go).
 *
 * W writer processes append the same synthetic pattern, interval i =
 * [T0 + i*1000, T0 + i*1000 + 500) of kind KERNEL for even i and COPY for
 * odd i, so the expected busy time of any window is known exactly no matter
 * how the writers interleave or merge. Each writer appends far more
 * intervals than the ring holds. Meanwhile the reader queries recent
 * windows (which must be exact) and windows older than the ring (which may
 * have lost history but must never report more than the truth).
 *
 * usage: tlstress WRITERS INTERVALS_PER_WRITER; exit 0 when every check
 * passed, 1 with a message otherwise.
 */
#define _GNU_SOURCE
#include "timeline.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define T0 1000000000000ull
#define MAX_W 16

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	int w = atoi(argv[1]);
	long n = atol(argv[2]);
	if (w < 1 || w > MAX_W || n < 1000)
		return 2;
	_Atomic long *progress = mmap(NULL, sizeof(long) * MAX_W, PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (progress == MAP_FAILED)
		return 1;
	struct simgpu_timeline *t = simgpu_timeline_open(0, 1);
	if (t == NULL) {
		perror("open timeline");
		return 1;
	}
	for (int k = 0; k < w; k++) {
		if (fork() == 0) {
			struct simgpu_timeline *wt = simgpu_timeline_open(0, 1);
			if (wt == NULL)
				_exit(1);
			for (long i = 0; i < n; i++) {
				uint64_t s = T0 + (uint64_t)i * 1000;
				simgpu_timeline_add(wt, s, s + 500,
						    i % 2 ? SIMGPU_KIND_COPY : SIMGPU_KIND_KERNEL,
						    (uint32_t)k);
				atomic_store(&progress[k], i + 1);
			}
			_exit(0);
		}
	}
	long checks = 0, old_checks = 0, failures = 0;
	for (;;) {
		long done = n;
		for (int k = 0; k < w; k++) {
			long p = atomic_load(&progress[k]);
			if (p < done)
				done = p;
		}
		/* Recent: 100 intervals ending 2000 intervals behind the slowest writer. */
		if (done > 2100) {
			long j = done - 2100;
			uint64_t a = T0 + (uint64_t)j * 1000, b = a + 100 * 1000;
			uint64_t k1 = simgpu_timeline_busy_ns(t, a, b, SIMGPU_KIND_KERNEL);
			uint64_t k2 = simgpu_timeline_busy_ns(t, a, b, SIMGPU_KIND_COPY);
			uint64_t k3 = simgpu_timeline_busy_ns(t, a, b, SIMGPU_KIND_KERNEL | SIMGPU_KIND_COPY);
			/* Window edges inside intervals exercise clipping: [a+250, b-250)
			 * cuts interval j in half when it is a kernel (j even). */
			uint64_t k4 = simgpu_timeline_busy_ns(t, a + 250, b - 250, SIMGPU_KIND_KERNEL);
			uint64_t want4 = j % 2 == 0 ? 49 * 500 + 250 : 50 * 500;
			if (k1 != 50 * 500 || k2 != 50 * 500 || k3 != 100 * 500 || k4 != want4) {
				if (failures++ < 5)
					fprintf(stderr,
						"window %ld: kernel %llu copy %llu both %llu clipped %llu, "
						"want 25000 25000 50000 %llu\n",
						j, (unsigned long long)k1, (unsigned long long)k2,
						(unsigned long long)k3, (unsigned long long)k4,
						(unsigned long long)want4);
			}
			checks++;
			/* Old: from the start, long overwritten once the ring wrapped. */
			uint64_t o = simgpu_timeline_busy_ns(t, T0, T0 + 100 * 1000, SIMGPU_KIND_KERNEL);
			if (o > 50 * 500) {
				if (failures++ < 5)
					fprintf(stderr, "old window reports %llu > 25000\n", (unsigned long long)o);
			}
			old_checks++;
		}
		if (done == n)
			break;
	}
	int st, bad = 0;
	while (wait(&st) > 0)
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad = 1;
	/* After the run the oldest history is gone (the ring wrapped) ... */
	uint64_t o = simgpu_timeline_busy_ns(t, T0, T0 + 100 * 1000, SIMGPU_KIND_KERNEL);
	/* ... and the newest is exact. */
	uint64_t a = T0 + (uint64_t)(n - 100) * 1000;
	uint64_t r = simgpu_timeline_busy_ns(t, a, a + 100 * 1000, SIMGPU_KIND_KERNEL);
	printf("{\"checks\":%ld,\"old_checks\":%ld,\"failures\":%ld,\"oldest_busy_ns\":%llu,\"newest_busy_ns\":%llu}\n",
	       checks, old_checks, failures, (unsigned long long)o, (unsigned long long)r);
	if (bad) {
		fprintf(stderr, "a writer failed\n");
		return 1;
	}
	return failures == 0 && r == 50 * 500 ? 0 : 1;
}
