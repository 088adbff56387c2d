/*
 * simtrain.h - declarations shared by simtrain's files: the options, the
 * stall causes, and the state the main loop, the stalls, the child
 * processes and the truth writer share. Internal to simtrain.
 */
#ifndef SIMTRAIN_H
#define SIMTRAIN_H

#define _GNU_SOURCE
#include "simgpu.h"
#include "timeline.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_STALLS  32
#define MAX_STREAMS 64
#define MAX_WORKERS 64
#define IO_CHUNK    (256u << 10)
#define DATA_FILE_BYTES (64ull << 20)

enum cause {
	C_IO_READ,
	C_IO_WRITE,
	C_NET,
	C_LOADER_IO,
	C_LOADER_CPU,
	C_COMM,
	C_CUDA_MEMCPY,
	C_CUDA_ALLOC,
	C_CPU,
	C_CPU_CONTENTION,
	C_SLEEP,
	C_LOCK,
	C_PAGEABLE,   /* an async copy from pageable memory: truth cuda.memcpy */
	C_CHECKPOINT, /* torch.save of a CUDA state_dict: truth io.write */
};

/* Tensors of a checkpoint stall: each one a device-to-host copy, a sync,
 * its serialization and a write, as torch.save does per storage. */
#define CKPT_TENSORS      12
#define CKPT_TENSOR_BYTES (2u << 20)

struct stall {
	char name[32]; /* as given on the command line */
	enum cause c;
	long every;
	long ms;
	int ahead; /* at=ahead: after the step's launches, before its sync */
	int poll;  /* net via=poll: a socket with a timeout (waits in poll, not in recv) */
};

enum launch_api { L_KERNEL, L_EX, L_COOP, L_GRAPH, L_PTSZ, L_MIX };
extern const char *launch_api_names[];

/* Entry points of the per-step batch copy (--copy-api); CP_ALL cycles
 * through the others, one per step. */
enum copy_api {
	CP_HTOD, CP_DTOH, CP_ASYNC, CP_DTOD, CP_PEER, CP_2D, CP_3D, CP_D8, CP_D16, CP_D32,
	CP_D2D8, CP_D2D16, CP_D2D32, CP_ALL,
};
extern const char *copy_api_names[];

struct options {
	long steps;
	long kernels;
	long kernel_us;
	long gap_us;
	long streams;
	long collectives;
	long device;
	long rank;
	long nranks;
	long workers;
	long batch_bytes;
	long bucket_bytes;
	long extra_syncs;  /* most .item()-like reads per step; each step has its own count */
	long batch_copies; /* async host-to-device copies at the start of each step */
	long trailing;	   /* short kernels launched after each step's final sync */
	long kernel_fns;   /* distinct kernel functions a step launches (--kernel-fns) */
	long sync_every;   /* the step's sync only every Nth step (--sync-every) */
	int ctx_sync; /* 1: cuCtxSynchronize, 2: cuCtxSynchronize_v2 (CUDA 13's cudaDeviceSynchronize) */
	int quiet;
	enum launch_api api;
	enum copy_api copy_api;
	int copy_api_set; /* --copy-api given: copy truth records, streams rotate */
	const char *truth;
	const char *server;
	const char *data_dir;
	const char *dump_timeline;
	const char *comm_id; /* --comm-id: the ranks' shared communicator id (rendezvous) */
	long await_probes;   /* --await-probes: seconds to wait for a tracer's probe on comm init */
	struct stall stalls[MAX_STALLS];
	int nstalls;
};
extern struct options opt;

#define MAX_KFNS 64 /* --kernel-fns */

/* The ground truth file's text, built in memory. */
struct sbuf {
	char *p;
	size_t len, cap;
};

/*
 * Read the data file, cold, until ms elapsed. Each pread goes to the device:
 * O_DIRECT where the filesystem supports it, else the range is evicted from
 * the page cache first. Returns bytes read.
 */
struct reader {
	int fd;
	int direct;
	char *buf;
	uint64_t off;
};

/* A data-loader worker process and its pipes. */
struct worker {
	pid_t pid;
	int req_w;   /* trainer -> worker */
	int reply_r; /* worker -> trainer */
};

struct loader_req {
	uint32_t kind;     /* 1 = read files, 2 = compute */
	uint32_t ms;
	uint64_t deadline; /* CLOCK_MONOTONIC: the reply is due then, however late the worker woke */
};

struct loader_reply {
	uint64_t bytes;
	uint64_t run_delay_ns; /* the worker's own run-queue wait while serving */
};

/* cpu.contention: the hog's page shared with the trainer. */
struct hog_shared {
	_Atomic uint32_t done;
};

void die(const char *fmt, ...) __attribute__((noreturn));
void usage_error(const char *fmt, ...) __attribute__((noreturn));

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */

static inline uint64_t process_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t realtime_minus_monotonic(void)
{
	struct timespec r, m1, m2;
	clock_gettime(CLOCK_MONOTONIC, &m1);
	clock_gettime(CLOCK_REALTIME, &r);
	clock_gettime(CLOCK_MONOTONIC, &m2);
	uint64_t rt = (uint64_t)r.tv_sec * 1000000000ull + (uint64_t)r.tv_nsec;
	uint64_t mt = ((uint64_t)m1.tv_sec * 1000000000ull + (uint64_t)m1.tv_nsec +
		       (uint64_t)m2.tv_sec * 1000000000ull + (uint64_t)m2.tv_nsec) / 2;
	return rt - mt;
}

static inline void spin_until(uint64_t t)
{
	while (now_ns() < t)
		;
}

static inline void sleep_until(uint64_t t)
{
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
			      .tv_nsec = (long)(t % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static inline const char *ctx_sync_name(void)
{
	return opt.ctx_sync == 2 ? "cuCtxSynchronize_v2" : opt.ctx_sync ? "cuCtxSynchronize" : "cuStreamSynchronize";
}

static inline void check_cu(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS) {
		const char *s = NULL;
		cuGetErrorString(r, &s);
		die("%s: %s (%d)", what, s ? s : "unknown error", r);
	}
}

static inline int gettid_(void)
{
	return (int)gettid();
}

static inline double env_gbps(const char *name, double def)
{
	const char *s = getenv(name);
	if (s == NULL || *s == '\0')
		return def;
	double v = strtod(s, NULL);
	return v > 0 ? v : def;
}

/* simtrain_truth.c: the ground truth file */
extern struct sbuf truth_buf;
extern FILE *truth_f;
void bprintf(struct sbuf *b, const char *fmt, ...);
extern uint64_t comm_capture_start; /* GPU start of the delayed collective */
extern int comm_capture;
void on_busy(void *arg, int dev, uint64_t s, uint64_t e, uint32_t kind, uint32_t stream);
void truth_flush(void);
void truth_close(void);
void write_meta(void);
void truth_call(const char *what, const char *api, long step, uint64_t s, uint64_t e,
		       CUstream stream, unsigned long long bytes);

/* simtrain_opts.c: the command line */
void parse_args(int argc, char **argv);

/* simtrain_env.c: data files and child processes */
extern char data_dir[4096];
extern char data_path[4200];
extern char ckpt_path[4200];
extern char state_path[4200]; /* the checkpoint stall's file */
void create_data_file(void);
void open_data_dir(void);
extern struct worker workers[MAX_WORKERS];
extern int nworkers, next_worker;
void start_workers(void);
extern pid_t logsrv_pid;
extern char server_addr[128];
void start_logsrv(void);
extern struct hog_shared *hog;
extern pid_t hog_pid;
extern int hog_req_w;
extern int hog_cpu;
void start_hog(void);
extern pthread_mutex_t lock_mu;
extern int lock_req_w;
extern _Atomic uint64_t lock_acquired; /* CLOCK_MONOTONIC when the holder took the mutex */
extern _Atomic int lock_holder_tid;
void start_lock_holder(void);
extern int schedstat_fd;
uint64_t thread_run_delay_ns(void);
void stop_children(void);

/* simtrain_stall.c: the injected stalls */
void reader_open(struct reader *r);
uint64_t read_cold_until(struct reader *r, uint64_t deadline);
extern uint64_t pending_comm_delay_ns;
extern const char *pending_comm_name;
void run_stall(const struct stall *st, long step);

/* simtrain.c: the device and the main loop */
extern CUstream streams[MAX_STREAMS];
extern CUdeviceptr dbatch;
extern char *hbatch;
extern double pcie_gbps;

#endif /* SIMTRAIN_H */
