/*
 * writer.c - drives the simulated GPU timeline from a test: reads commands
 * on stdin and answers "ok" after each so the test knows it has landed.
 *
 *   add <start_ns> <end_ns> <kind> <stream>   busy interval (CLOCK_MONOTONIC ns)
 *   pid <pid> <mem_bytes>                     register a process holding a context
 *   now                                       print CLOCK_MONOTONIC ns
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timeline.h"

int main(int argc, char **argv)
{
	int dev = argc > 1 ? atoi(argv[1]) : 0;
	struct simgpu_timeline *t = simgpu_timeline_open(dev, 1);
	if (!t) {
		fprintf(stderr, "writer: cannot open timeline of device %d\n", dev);
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	char line[256];
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long long a, b, c, d;
		if (sscanf(line, "add %llu %llu %llu %llu", &a, &b, &c, &d) == 4) {
			simgpu_timeline_add(t, a, b, (uint32_t)c, (uint32_t)d);
		} else if (sscanf(line, "pid %llu %llu", &a, &b) == 2) {
			simgpu_timeline_register_pid(t, (uint32_t)a, b);
		} else if (!strncmp(line, "now", 3)) {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			printf("%llu\n", (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
			continue;
		} else {
			fprintf(stderr, "writer: bad command: %s", line);
			return 2;
		}
		printf("ok\n");
	}
	simgpu_timeline_close(t);
	return 0;
}
