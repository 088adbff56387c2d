/*
 * timeline.h - the shared virtual GPU timeline of the simulated GPU.
 *
 * One memory-mapped file per device (SIMGPU_DIR, default /dev/shm, file
 * gaptrace-simgpu-<dev>) holds a ring of busy intervals. The simulated
 * libcuda in the trainer process appends to it; the simulated NVML in the
 * sidecar process reads it to report utilization, memory and the processes
 * holding a context. The ring is bounded: history older than the ring is
 * lost, so readers query recent windows only (NVML looks back seconds).
 *
 * All times are CLOCK_MONOTONIC nanoseconds.
 */
#ifndef GAPTRACE_SIMGPU_TIMELINE_H
#define GAPTRACE_SIMGPU_TIMELINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIMGPU_KIND_KERNEL     1u  /* compute kernel: counts as busy and as SM activity */
#define SIMGPU_KIND_COLLECTIVE 2u  /* NCCL kernel: counts as busy (utilization) but low SM activity */
#define SIMGPU_KIND_COPY       4u  /* copy engine: NOT counted in utilization.gpu */
#define SIMGPU_KIND_MEMSET     8u

struct simgpu_timeline;

/* Directory from env SIMGPU_DIR, default /dev/shm; file gaptrace-simgpu-<dev>.
 * create=1 creates/opens for writing. NULL on error. */
struct simgpu_timeline *simgpu_timeline_open(int dev, int create);
void simgpu_timeline_close(struct simgpu_timeline *t);

/* Append a busy interval (CLOCK_MONOTONIC ns; may end in the future).
 * Thread- and process-safe. */
void simgpu_timeline_add(struct simgpu_timeline *t, uint64_t start_ns, uint64_t end_ns,
                         uint32_t kind, uint32_t stream);

/* ns within [a,b) during which at least one interval whose kind is in
 * kind_mask was active (union over streams). */
uint64_t simgpu_timeline_busy_ns(struct simgpu_timeline *t, uint64_t a, uint64_t b,
                                 uint32_t kind_mask);

/* Processes with a context on the device (registered by cuInit/cuCtxCreate;
 * dead pids pruned). Returns count. */
int simgpu_timeline_pids(struct simgpu_timeline *t, uint32_t *pids, int max);
void simgpu_timeline_register_pid(struct simgpu_timeline *t, uint32_t pid, uint64_t mem_bytes);
uint64_t simgpu_timeline_mem_used(struct simgpu_timeline *t); /* sum of cuMemAlloc'd bytes */

int simgpu_device_count(void); /* env SIMGPU_DEVICES, default 1 */

#ifdef __cplusplus
}
#endif

#endif /* GAPTRACE_SIMGPU_TIMELINE_H */
