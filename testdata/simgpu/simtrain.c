//go:build ignore

/*
 * simtrain - a simulated training process for the simulated GPU.
 *
 * Runs steps of kernel launches, a batch copy, optional gradient all-reduces
 * and a final synchronization against the simulated libcuda/libnccl, and
 * injects host stalls of known causes on the main (feeder) thread. With
 * --truth it writes the ground truth (steps, stalls, device busy intervals,
 * driver calls) as JSON Lines with CLOCK_MONOTONIC nanosecond timestamps,
 * which the tracer's integration and accuracy tests compare against.
 *
 * Steps are numbered from 1; a stall with every=E runs before every step n
 * with n % E == 0, in the order the --stall flags were given; with at=ahead
 * it runs inside step n instead, after its launches and before its sync, so
 * the host is blocked while the GPU drains its queue and then sits idle
 * without any sync telling the host so. See README.md for the full contract.
 */
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

static const struct {
	const char *name;
	enum cause c;
} cause_names[] = {
	{"io.read", C_IO_READ},
	{"io.write", C_IO_WRITE},
	{"net", C_NET},
	{"loader.wait", C_LOADER_IO},
	{"loader.wait.io", C_LOADER_IO},
	{"loader.wait.cpu", C_LOADER_CPU},
	{"comm", C_COMM},
	{"cuda.memcpy", C_CUDA_MEMCPY},
	{"cuda.alloc", C_CUDA_ALLOC},
	{"cpu", C_CPU},
	{"cpu.contention", C_CPU_CONTENTION},
	{"sleep", C_SLEEP},
	{"lock", C_LOCK},
	{"pageable", C_PAGEABLE},
	{"checkpoint", C_CHECKPOINT},
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
static const char *launch_api_names[] = {"kernel", "ex", "cooperative", "graph", "ptsz", "mix"};

/* Entry points of the per-step batch copy (--copy-api); CP_ALL cycles
 * through the others, one per step. */
enum copy_api {
	CP_HTOD, CP_DTOH, CP_ASYNC, CP_DTOD, CP_PEER, CP_2D, CP_3D, CP_D8, CP_D16, CP_D32,
	CP_D2D8, CP_D2D16, CP_D2D32, CP_ALL,
};
static const char *copy_api_names[] = {
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync", "cuMemcpyDtoDAsync_v2",
	"cuMemcpyPeerAsync", "cuMemcpy2DAsync_v2", "cuMemcpy3DAsync_v2", "cuMemsetD8Async",
	"cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
	"cuMemsetD2D32Async", "all",
};

static struct {
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
} opt = {
	.steps = -1,
	.kernels = 8,
	.kernel_us = 200,
	.gap_us = 20,
	.streams = 1,
	.rank = 0,
	.nranks = 2,
	.workers = 2,
	.batch_bytes = 1 << 20,
	.bucket_bytes = 25 << 20,
	.kernel_fns = 1,
	.sync_every = 1,
};

#define MAX_KFNS 64 /* --kernel-fns */

static volatile sig_atomic_t stop_requested;

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */

static uint64_t process_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t realtime_minus_monotonic(void)
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

static void spin_until(uint64_t t)
{
	while (now_ns() < t)
		;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
			      .tv_nsec = (long)(t % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("simtrain: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static const char *ctx_sync_name(void)
{
	return opt.ctx_sync == 2 ? "cuCtxSynchronize_v2" : opt.ctx_sync ? "cuCtxSynchronize" : "cuStreamSynchronize";
}

static void usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("simtrain: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\nrun 'simtrain --help' for usage\n", stderr);
	va_end(ap);
	exit(2);
}

static void check_cu(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS) {
		const char *s = NULL;
		cuGetErrorString(r, &s);
		die("%s: %s (%d)", what, s ? s : "unknown error", r);
	}
}

static int gettid_(void)
{
	return (int)gettid();
}

static double env_gbps(const char *name, double def)
{
	const char *s = getenv(name);
	if (s == NULL || *s == '\0')
		return def;
	double v = strtod(s, NULL);
	return v > 0 ? v : def;
}

/* ------------------------------------------------------------------ */
/* Ground truth                                                        */

struct sbuf {
	char *p;
	size_t len, cap;
};

static struct sbuf truth_buf;
static FILE *truth_f;

static void bprintf(struct sbuf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		size_t room = b->cap - b->len;
		int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0)
			die("format truth record");
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		size_t ncap = b->cap ? b->cap * 2 : 1 << 16;
		while (ncap - b->len <= (size_t)n)
			ncap *= 2;
		char *np = realloc(b->p, ncap);
		if (np == NULL)
			die("out of memory");
		b->p = np;
		b->cap = ncap;
	}
}

/* Busy intervals reported by the driver, merged per kind at flush time. */
struct busy {
	uint64_t s, e;
	uint32_t kind;
};
static struct busy *busy_v;
static size_t busy_n, busy_cap;
static uint64_t comm_capture_start; /* GPU start of the delayed collective */
static int comm_capture;

static void on_busy(void *arg, int dev, uint64_t s, uint64_t e, uint32_t kind, uint32_t stream)
{
	if (comm_capture && kind == SIMGPU_KIND_COLLECTIVE) {
		comm_capture_start = s;
		comm_capture = 0;
	}
	if (truth_f == NULL)
		return;
	if (busy_n == busy_cap) {
		size_t nc = busy_cap ? busy_cap * 2 : 4096;
		struct busy *nv = realloc(busy_v, nc * sizeof(*nv));
		if (nv == NULL)
			die("out of memory");
		busy_v = nv;
		busy_cap = nc;
	}
	busy_v[busy_n++] = (struct busy){s, e, kind};
}

static int busy_cmp(const void *a, const void *b)
{
	const struct busy *x = a, *y = b;
	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	return x->s < y->s ? -1 : x->s > y->s;
}

static const char *kind_name(uint32_t k)
{
	switch (k) {
	case SIMGPU_KIND_KERNEL: return "kernel";
	case SIMGPU_KIND_COLLECTIVE: return "collective";
	case SIMGPU_KIND_COPY: return "copy";
	case SIMGPU_KIND_MEMSET: return "memset";
	default: return "unknown";
	}
}

/*
 * Truth is handed to a writer thread in batches so that the feeder thread
 * never writes (or sorts) between steps: its only syscalls are the ones the
 * trainer model means it to make. A batch is cut only between steps, after
 * the final sync, when no simulated work is pending, so no busy interval
 * straddles two batches and merging within a batch is exact.
 */
struct batch {
	struct sbuf text;
	struct busy *busy;
	size_t nbusy;
	struct batch *next;
};

static pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wcv = PTHREAD_COND_INITIALIZER;
static struct batch *whead, **wtail = &whead;
static int wdone, wstarted;
static pthread_t wthread;

static void write_out(const struct sbuf *t)
{
	if (t->len > 0 && fwrite(t->p, 1, t->len, truth_f) != t->len)
		die("write truth file %s: %s", opt.truth, strerror(errno));
}

/* Busy records first, so that the end record stays the file's last line. */
static void write_batch(struct batch *b)
{
	struct sbuf busy = {NULL, 0, 0};
	qsort(b->busy, b->nbusy, sizeof(*b->busy), busy_cmp);
	for (size_t i = 0; i < b->nbusy;) {
		struct busy cur = b->busy[i++];
		while (i < b->nbusy && b->busy[i].kind == cur.kind && b->busy[i].s <= cur.e) {
			if (b->busy[i].e > cur.e)
				cur.e = b->busy[i].e;
			i++;
		}
		bprintf(&busy, "{\"type\":\"busy\",\"start\":%llu,\"end\":%llu,\"kind\":\"%s\"}\n",
			(unsigned long long)cur.s, (unsigned long long)cur.e, kind_name(cur.kind));
	}
	write_out(&busy);
	write_out(&b->text);
	if (fflush(truth_f) != 0)
		die("write truth file %s: %s", opt.truth, strerror(errno));
	free(busy.p);
	free(b->text.p);
	free(b->busy);
	free(b);
}

static void *writer_main(void *arg)
{
	pthread_setname_np(pthread_self(), "simtrain-truth");
	for (;;) {
		pthread_mutex_lock(&wmu);
		while (whead == NULL && !wdone)
			pthread_cond_wait(&wcv, &wmu);
		struct batch *b = whead;
		if (b != NULL) {
			whead = b->next;
			if (whead == NULL)
				wtail = &whead;
		}
		pthread_mutex_unlock(&wmu);
		if (b == NULL)
			return NULL;
		write_batch(b);
	}
}

static void truth_flush(void)
{
	if (truth_f == NULL)
		return;
	struct batch *b = calloc(1, sizeof(*b));
	if (b == NULL)
		die("out of memory");
	b->text = truth_buf;
	b->busy = busy_v;
	b->nbusy = busy_n;
	truth_buf = (struct sbuf){NULL, 0, 0};
	busy_v = NULL;
	busy_n = busy_cap = 0;
	if (!wstarted) {
		write_batch(b);
		return;
	}
	pthread_mutex_lock(&wmu);
	*wtail = b;
	wtail = &b->next;
	pthread_cond_signal(&wcv);
	pthread_mutex_unlock(&wmu);
}

static void truth_start_writer(void)
{
	if (truth_f == NULL)
		return;
	int rc = pthread_create(&wthread, NULL, writer_main, NULL);
	if (rc != 0)
		die("start truth writer: %s", strerror(rc));
	wstarted = 1;
}

static void truth_close(void)
{
	if (truth_f == NULL)
		return;
	truth_flush();
	if (wstarted) {
		pthread_mutex_lock(&wmu);
		wdone = 1;
		pthread_cond_signal(&wcv);
		pthread_mutex_unlock(&wmu);
		pthread_join(wthread, NULL);
		wstarted = 0;
	}
	if (fclose(truth_f) != 0)
		die("close truth file %s: %s", opt.truth, strerror(errno));
	truth_f = NULL;
}

static void truth_call(const char *what, const char *api, long step, uint64_t s, uint64_t e,
		       CUstream stream, unsigned long long bytes)
{
	if (truth_f == NULL)
		return;
	bprintf(&truth_buf,
		"{\"type\":\"call\",\"what\":\"%s\",\"api\":\"%s\",\"step\":%ld,\"start\":%llu,"
		"\"end\":%llu,\"tid\":%d,\"stream\":%llu,\"bytes\":%llu}\n",
		what, api, step, (unsigned long long)s, (unsigned long long)e, gettid_(),
		(unsigned long long)(uintptr_t)stream, bytes);
}

/* ------------------------------------------------------------------ */
/* Option parsing                                                      */

static long parse_long(const char *flag, const char *s, long min, long max)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
		usage_error("invalid value %s for %s (want an integer in [%ld, %ld])", s, flag, min,
			    max);
	return v;
}

static void parse_stall(const char *arg)
{
	if (opt.nstalls == MAX_STALLS)
		usage_error("too many --stall flags (at most %d)", MAX_STALLS);
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", arg);
	char *save = NULL;
	char *name = strtok_r(buf, ":", &save);
	if (name == NULL)
		usage_error("invalid --stall %s (want CAUSE:every=E:ms=M)", arg);
	struct stall *st = &opt.stalls[opt.nstalls];
	int found = 0;
	for (size_t i = 0; i < sizeof(cause_names) / sizeof(cause_names[0]); i++)
		if (strcmp(name, cause_names[i].name) == 0) {
			st->c = cause_names[i].c;
			found = 1;
		}
	if (!found) {
		fprintf(stderr, "simtrain: unknown stall cause \"%s\"; known causes:", name);
		for (size_t i = 0; i < sizeof(cause_names) / sizeof(cause_names[0]); i++)
			fprintf(stderr, " %s", cause_names[i].name);
		fputc('\n', stderr);
		exit(2);
	}
	snprintf(st->name, sizeof(st->name), "%s", name);
	st->every = -1;
	st->ms = -1;
	for (char *kv; (kv = strtok_r(NULL, ":", &save)) != NULL;) {
		if (strncmp(kv, "every=", 6) == 0)
			st->every = parse_long("--stall every", kv + 6, 1, 1L << 40);
		else if (strncmp(kv, "ms=", 3) == 0)
			st->ms = parse_long("--stall ms", kv + 3, 1, 3600 * 1000);
		else if (strcmp(kv, "at=before") == 0)
			st->ahead = 0;
		else if (strcmp(kv, "at=ahead") == 0)
			st->ahead = 1;
		else if (strcmp(kv, "via=recv") == 0)
			st->poll = 0;
		else if (strcmp(kv, "via=poll") == 0)
			st->poll = 1;
		else
			usage_error("invalid --stall field %s in %s (want every=E, ms=M, "
				    "at=before|ahead or, for net, via=recv|poll)",
				    kv, arg);
	}
	if (st->poll && st->c != C_NET)
		usage_error("invalid --stall %s: via=poll is for net only", arg);
	if (st->every < 0 || st->ms < 0)
		usage_error("invalid --stall %s: both every=E and ms=M are required", arg);
	/*
	 * Running ahead means the host is busy elsewhere while the queue drains.
	 * A late collective is already a wait in the sync, and the synchronous
	 * driver calls would first wait for the queued kernels, so the truth
	 * interval would not be the cause's own time.
	 */
	if (st->ahead && (st->c == C_COMM || st->c == C_CUDA_MEMCPY || st->c == C_CUDA_ALLOC ||
			  st->c == C_PAGEABLE || st->c == C_CHECKPOINT))
		usage_error("invalid --stall %s: at=ahead needs a cause that does not synchronize "
			    "with the device (not comm, cuda.memcpy, cuda.alloc, pageable or checkpoint)",
			    arg);
	opt.nstalls++;
}

static void usage(FILE *f)
{
	fputs("usage: simtrain --steps N [--kernels-per-step K] [--kernel-us U] [--launch-gap-us G]\n"
	      "                [--streams S] [--truth FILE] [--stall CAUSE:every=E:ms=M[:at=before|ahead][:via=recv|poll]]...\n"
	      "                [--device D] [--rank R] [--nranks N] [--collectives C] [--server ADDR]\n"
	      "                [--workers W] [--data-dir DIR] [--batch-bytes B] [--bucket-bytes B]\n"
	      "                [--launch-api kernel|ex|cooperative|graph|ptsz|mix] [--copy-api API|all]\n"
	      "                [--ctx-sync|--ctx-sync-v2] [--extra-syncs N] [--batch-copies C] [--comm-id NAME] [--await-probes S]\n"
	      "                [--trailing-launches T] [--kernel-fns F] [--sync-every N] [--quiet]\n"
	      "       simtrain --dump-timeline FROM,TO[,MASK] [--device D]\n"
	      "causes: io.read io.write net loader.wait loader.wait.io loader.wait.cpu comm\n"
	      "        cuda.memcpy cuda.alloc cpu cpu.contention sleep\n"
	      "copy APIs (default cuMemcpyHtoDAsync_v2 on stream 0; with --copy-api step N copies\n"
	      "on stream (N-1) mod S, and all takes them in this order, one per step):\n"
	      "        cuMemcpyHtoDAsync_v2 cuMemcpyDtoHAsync_v2 cuMemcpyAsync cuMemcpyDtoDAsync_v2\n"
	      "        cuMemcpyPeerAsync cuMemcpy2DAsync_v2 cuMemcpy3DAsync_v2 cuMemsetD8Async\n"
	      "        cuMemsetD16Async cuMemsetD32Async cuMemsetD2D8Async cuMemsetD2D16Async\n"
	      "        cuMemsetD2D32Async\n",
	      f);
}

static void parse_args(int argc, char **argv)
{
	enum {
		O_STEPS = 256, O_KERNELS, O_KUS, O_GAP, O_STREAMS, O_TRUTH, O_STALL, O_DEVICE,
		O_RANK, O_NRANKS, O_COLL, O_SERVER, O_WORKERS, O_DATADIR, O_QUIET, O_BATCH,
		O_BUCKET, O_API, O_COPYAPI, O_CTXSYNC, O_CTXSYNC2, O_DUMP, O_HELP, O_EXTRA, O_BCOPIES, O_TRAIL,
		O_COMMID, O_AWAIT, O_KFNS, O_SYNCEVERY,
	};
	static const struct option lo[] = {
		{"steps", required_argument, 0, O_STEPS},
		{"kernels-per-step", required_argument, 0, O_KERNELS},
		{"kernel-us", required_argument, 0, O_KUS},
		{"launch-gap-us", required_argument, 0, O_GAP},
		{"streams", required_argument, 0, O_STREAMS},
		{"truth", required_argument, 0, O_TRUTH},
		{"stall", required_argument, 0, O_STALL},
		{"device", required_argument, 0, O_DEVICE},
		{"rank", required_argument, 0, O_RANK},
		{"nranks", required_argument, 0, O_NRANKS},
		{"collectives", required_argument, 0, O_COLL},
		{"comm-id", required_argument, 0, O_COMMID},
		{"await-probes", required_argument, 0, O_AWAIT},
		{"server", required_argument, 0, O_SERVER},
		{"workers", required_argument, 0, O_WORKERS},
		{"data-dir", required_argument, 0, O_DATADIR},
		{"batch-bytes", required_argument, 0, O_BATCH},
		{"bucket-bytes", required_argument, 0, O_BUCKET},
		{"launch-api", required_argument, 0, O_API},
		{"copy-api", required_argument, 0, O_COPYAPI},
		{"ctx-sync", no_argument, 0, O_CTXSYNC},
		{"ctx-sync-v2", no_argument, 0, O_CTXSYNC2},
		{"extra-syncs", required_argument, 0, O_EXTRA},
		{"batch-copies", required_argument, 0, O_BCOPIES},
		{"trailing-launches", required_argument, 0, O_TRAIL},
		{"kernel-fns", required_argument, 0, O_KFNS},
		{"sync-every", required_argument, 0, O_SYNCEVERY},
		{"dump-timeline", required_argument, 0, O_DUMP},
		{"quiet", no_argument, 0, O_QUIET},
		{"help", no_argument, 0, O_HELP},
		{0, 0, 0, 0},
	};
	int c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case O_STEPS: opt.steps = parse_long("--steps", optarg, 1, 1L << 40); break;
		case O_KERNELS: opt.kernels = parse_long("--kernels-per-step", optarg, 1, 1 << 20); break;
		case O_KUS: opt.kernel_us = parse_long("--kernel-us", optarg, 1, 10 * 1000 * 1000); break;
		case O_GAP: opt.gap_us = parse_long("--launch-gap-us", optarg, 0, 10 * 1000 * 1000); break;
		case O_STREAMS: opt.streams = parse_long("--streams", optarg, 1, MAX_STREAMS); break;
		case O_TRUTH: opt.truth = optarg; break;
		case O_STALL: parse_stall(optarg); break;
		case O_DEVICE: opt.device = parse_long("--device", optarg, 0, 63); break;
		case O_RANK: opt.rank = parse_long("--rank", optarg, 0, 1 << 20); break;
		case O_NRANKS: opt.nranks = parse_long("--nranks", optarg, 1, 1 << 20); break;
		case O_COLL: opt.collectives = parse_long("--collectives", optarg, 0, 1024); break;
		case O_COMMID: opt.comm_id = optarg; break;
		case O_AWAIT: opt.await_probes = parse_long("--await-probes", optarg, 0, 3600); break;
		case O_SERVER: opt.server = optarg; break;
		case O_WORKERS: opt.workers = parse_long("--workers", optarg, 0, MAX_WORKERS); break;
		case O_DATADIR: opt.data_dir = optarg; break;
		case O_BATCH: opt.batch_bytes = parse_long("--batch-bytes", optarg, 0, 1L << 40); break;
		case O_BUCKET: opt.bucket_bytes = parse_long("--bucket-bytes", optarg, 4, 1L << 40); break;
		case O_API: {
			int ok = 0;
			for (int i = 0; i <= L_MIX; i++)
				if (strcmp(optarg, launch_api_names[i]) == 0) {
					opt.api = (enum launch_api)i;
					ok = 1;
				}
			if (!ok)
				usage_error("invalid --launch-api %s", optarg);
			break;
		}
		case O_COPYAPI: {
			int ok = 0;
			for (int i = 0; i <= CP_ALL; i++)
				if (strcmp(optarg, copy_api_names[i]) == 0) {
					opt.copy_api = (enum copy_api)i;
					ok = 1;
				}
			if (!ok)
				usage_error("invalid --copy-api %s", optarg);
			opt.copy_api_set = 1;
			break;
		}
		case O_CTXSYNC: opt.ctx_sync = 1; break;
		case O_CTXSYNC2: opt.ctx_sync = 2; break;
		case O_EXTRA: opt.extra_syncs = parse_long("--extra-syncs", optarg, 0, 64); break;
		case O_BCOPIES: opt.batch_copies = parse_long("--batch-copies", optarg, 0, 16); break;
		case O_TRAIL: opt.trailing = parse_long("--trailing-launches", optarg, 0, 16); break;
		case O_KFNS: opt.kernel_fns = parse_long("--kernel-fns", optarg, 1, MAX_KFNS); break;
		case O_SYNCEVERY: opt.sync_every = parse_long("--sync-every", optarg, 1, 1 << 20); break;
		case O_DUMP: opt.dump_timeline = optarg; break;
		case O_QUIET: opt.quiet = 1; break;
		case O_HELP: usage(stdout); exit(0);
		default:
			usage_error("unknown or incomplete option %s", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument %s", argv[optind]);
	if (opt.dump_timeline == NULL && opt.steps < 0)
		usage_error("--steps is required");
	if (opt.rank >= opt.nranks)
		usage_error("--rank %ld must be below --nranks %ld", opt.rank, opt.nranks);
	if (opt.kernel_fns > opt.kernels)
		usage_error("--kernel-fns %ld exceeds --kernels-per-step %ld", opt.kernel_fns, opt.kernels);
	if (opt.batch_bytes == 0 && opt.copy_api_set)
		usage_error("--batch-bytes 0 (no batch copy) cannot go with --copy-api");
	if (opt.comm_id != NULL) {
		/* The ranks of one job are separate processes that meet in the
		 * simulated NCCL: every one must issue collectives. */
		size_t n = strlen(opt.comm_id);
		if (n == 0 || n > 64 || strspn(opt.comm_id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n)
			usage_error("invalid --comm-id %s (want 1-64 of A-Z a-z 0-9 . _ -)", opt.comm_id);
		if (opt.collectives == 0)
			usage_error("--comm-id needs --collectives > 0");
	}
	for (int i = 0; i < opt.nstalls; i++) {
		enum cause c = opt.stalls[i].c;
		if ((c == C_LOADER_IO || c == C_LOADER_CPU) && opt.workers == 0)
			usage_error("--stall %s needs --workers > 0", opt.stalls[i].name);
	}
}

/* --await-probes: a trainer creates its communicators seconds into its run
 * (imports, process-group setup); this one does so at once, before a tracer
 * that attaches when the libraries are mapped has its probes in. Waits until
 * the entry of fn holds a uprobe's breakpoint (int3, visible in the
 * process's own copy of the page), or the time is up. */
static void await_probe(const char *fn)
{
	if (opt.await_probes <= 0)
		return;
	const volatile unsigned char *p = dlsym(RTLD_DEFAULT, fn);
	if (p == NULL)
		die("--await-probes: %s not found", fn);
	for (long i = 0; i < opt.await_probes * 100 && *p != 0xcc; i++) {
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
}

static int has_cause(enum cause c)
{
	for (int i = 0; i < opt.nstalls; i++)
		if (opt.stalls[i].c == c)
			return 1;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Files for the I/O stalls                                            */

static char data_dir[4096];
static int data_dir_is_temp;
static char data_path[4200];
static char ckpt_path[4200];
static char state_path[4200]; /* the checkpoint stall's file */

static pid_t main_pid;

/* Runs at any exit of the trainer (die() included), never in a child. */
static void remove_temp_data_dir(void)
{
	if (!data_dir_is_temp || getpid() != main_pid)
		return;
	unlink(data_path);
	unlink(ckpt_path);
	unlink(state_path);
	rmdir(data_dir);
}

static void create_data_file(void)
{
	struct stat st;
	if (stat(data_path, &st) == 0 && (uint64_t)st.st_size >= DATA_FILE_BYTES)
		return;
	int fd = open(data_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		die("create %s: %s", data_path, strerror(errno));
	char *buf = malloc(IO_CHUNK);
	if (buf == NULL)
		die("out of memory");
	for (size_t i = 0; i < IO_CHUNK; i++)
		buf[i] = (char)(i * 2654435761u >> 13); /* incompressible-ish */
	for (uint64_t off = 0; off < DATA_FILE_BYTES; off += IO_CHUNK)
		if (write(fd, buf, IO_CHUNK) != (ssize_t)IO_CHUNK)
			die("write %s: %s", data_path, strerror(errno));
	/* Written back so that POSIX_FADV_DONTNEED can really evict it. */
	if (fsync(fd) != 0)
		die("fsync %s: %s", data_path, strerror(errno));
	close(fd);
	free(buf);
}

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

static void reader_open(struct reader *r)
{
	r->off = 0;
	r->direct = 1;
	r->fd = open(data_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (r->fd < 0) {
		r->direct = 0;
		r->fd = open(data_path, O_RDONLY | O_CLOEXEC);
	}
	if (r->fd < 0)
		die("open %s: %s", data_path, strerror(errno));
	if (posix_memalign((void **)&r->buf, 4096, IO_CHUNK) != 0)
		die("out of memory");
}

/*
 * Paces a loop of blocking I/O calls to end as close to a deadline as it
 * can: it stops early when the next call, at the recent average duration,
 * would overshoot by more than stopping now undershoots. Disk latency on
 * shared machines has outliers that one call can still carry past it.
 */
struct pacer {
	uint64_t last, avg;
};

static int pacer_more(struct pacer *p, uint64_t deadline)
{
	uint64_t now = now_ns();
	if (p->last != 0) {
		uint64_t d = now - p->last;
		p->avg = p->avg == 0 ? d : (p->avg * 3 + d) / 4;
	}
	p->last = now;
	return now < deadline && now + p->avg / 2 < deadline;
}

static uint64_t read_cold_until(struct reader *r, uint64_t deadline)
{
	uint64_t total = 0;
	struct pacer pc = {0, 0};
	while (pacer_more(&pc, deadline)) {
		if (r->off + IO_CHUNK > DATA_FILE_BYTES)
			r->off = 0;
		if (!r->direct)
			posix_fadvise(r->fd, (off_t)r->off, IO_CHUNK, POSIX_FADV_DONTNEED);
		ssize_t n = pread(r->fd, r->buf, IO_CHUNK, (off_t)r->off);
		if (n < 0 && errno == EINVAL && r->direct) {
			/* O_DIRECT accepted at open but not for reads here. */
			close(r->fd);
			r->fd = open(data_path, O_RDONLY | O_CLOEXEC);
			r->direct = 0;
			if (r->fd < 0)
				die("open %s: %s", data_path, strerror(errno));
			continue;
		}
		if (n < 0)
			die("read %s: %s", data_path, strerror(errno));
		if (n == 0) {
			r->off = 0;
			continue;
		}
		r->off += (uint64_t)n;
		total += (uint64_t)n;
	}
	return total;
}

/* ------------------------------------------------------------------ */
/* Child processes: data-loader workers, log server, contention helper */

struct worker {
	pid_t pid;
	int req_w;   /* trainer -> worker */
	int reply_r; /* worker -> trainer */
};
static struct worker workers[MAX_WORKERS];
static int nworkers, next_worker;

struct loader_req {
	uint32_t kind;     /* 1 = read files, 2 = compute */
	uint32_t ms;
	uint64_t deadline; /* CLOCK_MONOTONIC: the reply is due then, however late the worker woke */
};

static void child_setup(const char *name)
{
	prctl(PR_SET_NAME, name, 0, 0, 0);
	/* Never outlive the trainer, even if it is killed. */
	prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_DFL);
}

struct loader_reply {
	uint64_t bytes;
	uint64_t run_delay_ns; /* the worker's own run-queue wait while serving */
};

static uint64_t thread_run_delay_ns(void);
static int schedstat_fd;

static void worker_main(int req_r, int reply_w)
{
	child_setup("simtrain-worker");
	if (getppid() == 1)
		_exit(0);
	/* The inherited descriptor describes the trainer's main thread. */
	if (schedstat_fd >= 0)
		close(schedstat_fd);
	schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
	struct reader r;
	int opened = 0;
	struct loader_req q;
	for (;;) {
		ssize_t n = read(req_r, &q, sizeof(q));
		if (n == 0)
			_exit(0);
		if (n != (ssize_t)sizeof(q)) {
			if (n < 0 && errno == EINTR)
				continue;
			_exit(1);
		}
		uint64_t deadline = q.deadline;
		uint64_t done = 0, rd0 = thread_run_delay_ns();
		if (q.kind == 1) {
			if (!opened) {
				reader_open(&r);
				opened = 1;
			}
			done = read_cold_until(&r, deadline);
		} else {
			spin_until(deadline);
		}
		struct loader_reply rep = {done, thread_run_delay_ns() - rd0};
		if (write(reply_w, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
			_exit(1);
	}
}

static void start_workers(void)
{
	for (int i = 0; i < opt.workers; i++) {
		int req[2], rep[2];
		if (pipe2(req, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0)
			die("pipe: %s", strerror(errno));
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0)
			die("fork worker: %s", strerror(errno));
		if (pid == 0) {
			close(req[1]);
			close(rep[0]);
			for (int j = 0; j < nworkers; j++) {
				close(workers[j].req_w);
				close(workers[j].reply_r);
			}
			worker_main(req[0], rep[1]);
		}
		close(req[0]);
		close(rep[1]);
		workers[nworkers++] = (struct worker){pid, req[1], rep[0]};
	}
}

static pid_t logsrv_pid;
static char server_addr[128];

static void logsrv_main(int lfd)
{
	child_setup("simtrain-logsrv");
	char req[8192];
	for (;;) {
		int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		size_t len = 0;
		long body = -1;
		char *hdr_end = NULL;
		/* Read headers, then Content-Length bytes of body. */
		for (;;) {
			ssize_t n = recv(c, req + len, sizeof(req) - 1 - len, 0);
			if (n <= 0)
				break;
			len += (size_t)n;
			req[len] = '\0';
			if (hdr_end == NULL && (hdr_end = strstr(req, "\r\n\r\n")) != NULL) {
				char *cl = strcasestr(req, "content-length:");
				body = cl != NULL && cl < hdr_end ? strtol(cl + 15, NULL, 10) : 0;
			}
			if (hdr_end != NULL && (long)(len - (size_t)(hdr_end + 4 - req)) >= body)
				break;
			if (len == sizeof(req) - 1)
				break;
		}
		long ms = 0;
		char *d = strstr(req, "delay_ms=");
		if (d != NULL)
			ms = strtol(d + 9, NULL, 10);
		if (ms > 0)
			sleep_until(now_ns() + (uint64_t)ms * 1000000ull);
		const char *resp = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				   "Content-Length: 12\r\nConnection: close\r\n\r\n{\"ok\":true}\n";
		ssize_t w = send(c, resp, strlen(resp), MSG_NOSIGNAL);
		(void)w;
		close(c);
	}
}

static void start_logsrv(void)
{
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		die("socket: %s", strerror(errno));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t alen = sizeof(a);
	if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 16) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
		die("listen on 127.0.0.1: %s", strerror(errno));
	snprintf(server_addr, sizeof(server_addr), "127.0.0.1:%d", ntohs(a.sin_port));
	fflush(NULL);
	logsrv_pid = fork();
	if (logsrv_pid < 0)
		die("fork log server: %s", strerror(errno));
	if (logsrv_pid == 0)
		logsrv_main(lfd);
	close(lfd);
}

/* cpu.contention: a SCHED_FIFO hog pinned to the trainer's CPU. */
struct hog_shared {
	_Atomic uint32_t done;
};
static struct hog_shared *hog;
static pid_t hog_pid;
static int hog_req_w;
static int hog_cpu;

static void start_hog(void)
{
	hog = mmap(NULL, sizeof(*hog), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (hog == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	int p[2], ready[2];
	if (pipe2(p, O_CLOEXEC) != 0 || pipe2(ready, O_CLOEXEC) != 0)
		die("pipe: %s", strerror(errno));
	/* Pin to the CPU the trainer runs on now; the trainer pins itself there during the stall. */
	hog_cpu = sched_getcpu();
	if (hog_cpu < 0)
		hog_cpu = 0;
	fflush(NULL);
	hog_pid = fork();
	if (hog_pid < 0)
		die("fork contention helper: %s", strerror(errno));
	if (hog_pid == 0) {
		child_setup("simtrain-hog");
		close(p[1]);
		close(ready[0]);
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(hog_cpu, &set);
		struct sched_param sp = {.sched_priority = 1};
		int err = 0;
		if (sched_setaffinity(0, sizeof(set), &set) != 0 ||
		    sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
			err = errno;
		/* Tell the trainer whether the helper can preempt it at all. */
		if (write(ready[1], &err, sizeof(err)) != (ssize_t)sizeof(err) || err != 0)
			_exit(1);
		close(ready[1]);
		uint64_t deadline;
		for (;;) {
			ssize_t n = read(p[0], &deadline, sizeof(deadline));
			if (n == 0)
				_exit(0);
			if (n != (ssize_t)sizeof(deadline)) {
				if (n < 0 && errno == EINTR)
					continue;
				_exit(1);
			}
			spin_until(deadline);
			atomic_store(&hog->done, 1);
		}
	}
	close(p[0]);
	close(ready[1]);
	hog_req_w = p[1];
	/* Fail now, with a clear message, if the helper could not become real-time. */
	int err;
	ssize_t n;
	while ((n = read(ready[0], &err, sizeof(err))) < 0 && errno == EINTR)
		;
	close(ready[0]);
	if (n != (ssize_t)sizeof(err))
		die("contention helper exited during setup");
	if (err != 0)
		die("cpu.contention needs a SCHED_FIFO helper pinned to CPU %d (root or "
		    "CAP_SYS_NICE): %s",
		    hog_cpu, strerror(err));
}

/*
 * lock: a second thread of the trainer holds a mutex while it computes (a
 * background thread holding the GIL, a logger holding a queue's lock); the
 * main thread needs the mutex and blocks in the futex until it is released.
 */
static pthread_mutex_t lock_mu = PTHREAD_MUTEX_INITIALIZER;
static int lock_req_w = -1;
static _Atomic uint64_t lock_acquired; /* CLOCK_MONOTONIC when the holder took the mutex */
static _Atomic int lock_holder_tid;

static void *lock_holder_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	prctl(PR_SET_NAME, "simtrain-holder", 0, 0, 0);
	atomic_store(&lock_holder_tid, gettid_());
	uint64_t ms_ns;
	for (;;) {
		ssize_t n = read(fd, &ms_ns, sizeof(ms_ns));
		if (n == 0)
			return NULL;
		if (n != (ssize_t)sizeof(ms_ns)) {
			if (n < 0 && errno == EINTR)
				continue;
			return NULL;
		}
		pthread_mutex_lock(&lock_mu);
		uint64_t t = now_ns();
		atomic_store(&lock_acquired, t);
		spin_until(t + ms_ns);
		pthread_mutex_unlock(&lock_mu);
	}
}

static void start_lock_holder(void)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		die("pipe: %s", strerror(errno));
	pthread_t th;
	int err = pthread_create(&th, NULL, lock_holder_main, (void *)(intptr_t)p[0]);
	if (err != 0)
		die("start lock holder thread: %s", strerror(err));
	pthread_detach(th);
	lock_req_w = p[1];
}

/*
 * Run-queue wait of the main thread so far, from the kernel's schedstat
 * ("on-CPU ns, run-queue wait ns, timeslices"). The file stays open so a
 * sample costs one pread; it is recorded for every stall so that a scorer
 * can tell time the machine's own load added (the thread was runnable but
 * not running) from the injected cause.
 */
static int schedstat_fd = -1;

static uint64_t thread_run_delay_ns(void)
{
	if (schedstat_fd < 0)
		return 0;
	char buf[128];
	ssize_t n = pread(schedstat_fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	unsigned long long run = 0, wait = 0;
	if (sscanf(buf, "%llu %llu", &run, &wait) != 2)
		return 0;
	return wait;
}

static void stop_children(void)
{
	pid_t pids[MAX_WORKERS + 2];
	int n = 0;
	for (int i = 0; i < nworkers; i++) {
		close(workers[i].req_w);
		close(workers[i].reply_r);
		pids[n++] = workers[i].pid;
	}
	if (logsrv_pid > 0)
		pids[n++] = logsrv_pid;
	if (hog_pid > 0) {
		close(hog_req_w);
		pids[n++] = hog_pid;
	}
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGTERM);
	for (int i = 0; i < n; i++)
		waitpid(pids[i], NULL, 0);
	nworkers = 0;
	logsrv_pid = hog_pid = 0;
}

/* ------------------------------------------------------------------ */
/* The simulated device                                                */

static CUstream streams[MAX_STREAMS];
/* --kernel-fns: a step's kernels cycle through the first F-1 functions and
 * its last kernel (the optimizer's, say) has a function of its own, so the
 * functions repeat a fixed number of times per step, as a model's do. */
static CUfunction kfunc, ktrail, kfns[MAX_KFNS];
static CUgraphExec kgraph;
static CUdeviceptr dbatch, dgrad, dcopy;
static char *hbatch;
static CUcontext cu_ctx;
static ncclComm_t comm;
static double pcie_gbps;

static void setup_device(void)
{
	check_cu(cuInit(0), "cuInit");
	int n;
	check_cu(cuDeviceGetCount(&n), "cuDeviceGetCount");
	if (opt.device >= n)
		usage_error("--device %ld out of range: %d simulated device(s) (SIMGPU_DEVICES)",
			    opt.device, n);
	CUdevice dev;
	check_cu(cuDeviceGet(&dev, (int)opt.device), "cuDeviceGet");
	CUcontext ctx;
	check_cu(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check_cu(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	cu_ctx = ctx;
	/* Stream 0 of the trainer is the legacy default stream, like PyTorch's. */
	streams[0] = NULL;
	for (long i = 1; i < opt.streams; i++)
		check_cu(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	static const char image[] = "simgpu-module";
	CUmodule mod;
	check_cu(cuModuleLoadData(&mod, image), "cuModuleLoadData");
	char name[64];
	snprintf(name, sizeof(name), "sim_kernel_%ld", opt.kernel_us);
	check_cu(cuModuleGetFunction(&kfunc, mod, name), "cuModuleGetFunction");
	check_cu(cuModuleGetFunction(&ktrail, mod, "sim_kernel_20"), "cuModuleGetFunction");
	kfns[0] = kfunc;
	for (long i = 1; i < opt.kernel_fns; i++)
		check_cu(cuModuleGetFunction(&kfns[i], mod, name), "cuModuleGetFunction");
	CUgraph g;
	check_cu(cuGraphCreate(&g, 0), "cuGraphCreate");
	check_cu(cuGraphInstantiateWithFlags(&kgraph, g, 0), "cuGraphInstantiateWithFlags");
	check_cu(cuMemAlloc_v2(&dbatch, (size_t)(opt.batch_bytes ? opt.batch_bytes : 1)), "cuMemAlloc_v2");
	check_cu(cuMemAlloc_v2(&dgrad, (size_t)opt.bucket_bytes), "cuMemAlloc_v2");
	/* The batch comes from pinned memory (pin_memory=True): its async copy
	 * never blocks the host. */
	check_cu(cuMemAllocHost_v2((void **)&hbatch, (size_t)(opt.batch_bytes ? opt.batch_bytes : 1)), "cuMemAllocHost_v2");
	/* Device-to-device copies go from the batch to a buffer of its size. */
	if (opt.copy_api_set)
		check_cu(cuMemAlloc_v2(&dcopy, (size_t)(opt.batch_bytes ? opt.batch_bytes : 1)), "cuMemAlloc_v2");
	pcie_gbps = env_gbps("SIMGPU_PCIE_GBPS", 20);
	if (opt.collectives > 0 || has_cause(C_COMM)) {
		ncclUniqueId id;
		if (opt.comm_id != NULL) {
			/* Shared out of band, as torch.distributed shares rank 0's id
			 * through its store: the ranks rendezvous (see nccl.c). */
			memset(&id, 0, sizeof(id));
			snprintf(id.internal, sizeof(id.internal), "simgpu-rendezvous:%s", opt.comm_id);
		} else if (ncclGetUniqueId(&id) != ncclSuccess) {
			die("ncclGetUniqueId failed");
		}
		await_probe("ncclCommInitRank");
		if (ncclCommInitRank(&comm, (int)opt.nranks, id, (int)opt.rank) != ncclSuccess)
			die("ncclCommInitRank failed");
	}
}

/* Launch number i of a step through the configured entry point. */
static const char *launch_one(long i, CUstream s)
{
	enum launch_api api = opt.api == L_MIX ? (enum launch_api)(i % 5) : opt.api;
	CUfunction fn = kfns[0];
	if (opt.kernel_fns > 1)
		fn = i == opt.kernels - 1 ? kfns[opt.kernel_fns - 1] : kfns[i % (opt.kernel_fns - 1)];
	CUlaunchConfig cfg = {.gridDimX = 108, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256,
			      .blockDimY = 1, .blockDimZ = 1, .hStream = s};
	void *params[] = {&dbatch};
	switch (api) {
	case L_EX:
		check_cu(cuLaunchKernelEx(&cfg, fn, params, NULL), "cuLaunchKernelEx");
		return "cuLaunchKernelEx";
	case L_COOP:
		check_cu(cuLaunchCooperativeKernel(fn, 108, 1, 1, 256, 1, 1, 0, s, params),
			 "cuLaunchCooperativeKernel");
		return "cuLaunchCooperativeKernel";
	case L_GRAPH:
		check_cu(cuGraphLaunch(kgraph, s), "cuGraphLaunch");
		return "cuGraphLaunch";
	case L_PTSZ:
		check_cu(cuLaunchKernel_ptsz(fn, 108, 1, 1, 256, 1, 1, 0, s, params, NULL),
			 "cuLaunchKernel_ptsz");
		return "cuLaunchKernel_ptsz";
	default:
		check_cu(cuLaunchKernel(fn, 108, 1, 1, 256, 1, 1, 0, s, params, NULL),
			 "cuLaunchKernel");
		return "cuLaunchKernel";
	}
}

/* Rows of the 2D and 3D copies and memsets: the largest power of two up to 64
 * that divides total. */
static size_t rows_of(size_t total)
{
	size_t h = 64;
	while (h > 1 && total % h != 0)
		h /= 2;
	return h;
}

/*
 * The step's batch copy through the --copy-api entry point on stream s. Sizes
 * derive from --batch-bytes B: the 1D copies move B bytes; the memsets set
 * max(1, B/E) elements of E bytes; the 2D copy and memsets view the batch as
 * H rows (H = rows_of(B), pitch B/H bytes) and cover the left half of each
 * row, so that width, pitch and height all differ; the 3D copy moves B bytes
 * as a box of H/2 rows of pitch bytes, 2 deep (1 x 1 when H is 1). *bytes is
 * what a tracer should report: bytes moved or set, and 0 for
 * cuMemcpy3DAsync_v2 whose size is not decoded.
 */
static const char *copy_one(long step, CUstream s, unsigned long long *bytes)
{
	enum copy_api api = opt.copy_api == CP_ALL ? (enum copy_api)((step - 1) % CP_ALL)
						  : opt.copy_api;
	size_t b = (size_t)opt.batch_bytes;
	size_t h = rows_of(b), pitch = b / h;
	size_t n, w, elt = 1;
	switch (api) {
	case CP_DTOH:
		check_cu(cuMemcpyDtoHAsync_v2(hbatch, dbatch, b, s), "cuMemcpyDtoHAsync_v2");
		*bytes = b;
		break;
	case CP_ASYNC:
		check_cu(cuMemcpyAsync(dcopy, dbatch, b, s), "cuMemcpyAsync");
		*bytes = b;
		break;
	case CP_DTOD:
		check_cu(cuMemcpyDtoDAsync_v2(dcopy, dbatch, b, s), "cuMemcpyDtoDAsync_v2");
		*bytes = b;
		break;
	case CP_PEER:
		check_cu(cuMemcpyPeerAsync(dcopy, cu_ctx, dbatch, cu_ctx, b, s), "cuMemcpyPeerAsync");
		*bytes = b;
		break;
	case CP_2D: {
		w = pitch / 2 > 0 ? pitch / 2 : 1;
		CUDA_MEMCPY2D p = {
			.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = hbatch, .srcPitch = pitch,
			.dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = dbatch, .dstPitch = pitch,
			.WidthInBytes = w, .Height = h,
		};
		check_cu(cuMemcpy2DAsync_v2(&p, s), "cuMemcpy2DAsync_v2");
		*bytes = w * h;
		break;
	}
	case CP_3D: {
		size_t d = h > 1 ? 2 : 1;
		CUDA_MEMCPY3D p = {
			.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = dbatch, .srcPitch = pitch,
			.srcHeight = h / d,
			.dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = dcopy, .dstPitch = pitch,
			.dstHeight = h / d,
			.WidthInBytes = pitch, .Height = h / d, .Depth = d,
		};
		check_cu(cuMemcpy3DAsync_v2(&p, s), "cuMemcpy3DAsync_v2");
		*bytes = 0;
		break;
	}
	case CP_D8:
	case CP_D16:
	case CP_D32:
		elt = api == CP_D8 ? 1 : api == CP_D16 ? 2 : 4;
		n = b / elt > 0 ? b / elt : 1;
		if (api == CP_D8)
			check_cu(cuMemsetD8Async(dbatch, 0, n, s), "cuMemsetD8Async");
		else if (api == CP_D16)
			check_cu(cuMemsetD16Async(dbatch, 0, n, s), "cuMemsetD16Async");
		else
			check_cu(cuMemsetD32Async(dbatch, 0, n, s), "cuMemsetD32Async");
		*bytes = n * elt;
		break;
	case CP_D2D8:
	case CP_D2D16:
	case CP_D2D32:
		elt = api == CP_D2D8 ? 1 : api == CP_D2D16 ? 2 : 4;
		w = pitch / elt / 2 > 0 ? pitch / elt / 2 : 1;
		if (api == CP_D2D8)
			check_cu(cuMemsetD2D8Async(dbatch, pitch, 0, w, h, s), "cuMemsetD2D8Async");
		else if (api == CP_D2D16)
			check_cu(cuMemsetD2D16Async(dbatch, pitch, 0, w, h, s), "cuMemsetD2D16Async");
		else
			check_cu(cuMemsetD2D32Async(dbatch, pitch, 0, w, h, s), "cuMemsetD2D32Async");
		*bytes = w * h * elt;
		break;
	default:
		check_cu(cuMemcpyHtoDAsync_v2(dbatch, hbatch, b, s), "cuMemcpyHtoDAsync_v2");
		*bytes = b;
		break;
	}
	return copy_api_names[api];
}

/* ------------------------------------------------------------------ */
/* Stalls                                                              */

static struct reader main_reader;
static int main_reader_open;
static int ckpt_fd = -1;
static uint64_t ckpt_off;
static char *ckpt_buf;
static char *pageable_buf; /* pageable stall: plain malloc'd memory */
static size_t pageable_len;
static CUdeviceptr dpageable;
static char *state_buf; /* checkpoint stall: pageable, like a tensor's .cpu() */
static CUdeviceptr dstate;
static uint64_t pending_comm_delay_ns;
static const char *pending_comm_name;

/* poll_socket waits in poll(2) until fd is ready for events, as a socket
 * with a timeout does before each call (CPython's sock_call). */
static void poll_socket(int fd, short events, int timeout_ms, const char *what)
{
	struct pollfd p = {.fd = fd, .events = events};
	int n;
	while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
		;
	if (n < 0)
		die("poll for %s: %s", what, strerror(errno));
	if (n == 0)
		die("%s: timed out after %d ms", what, timeout_ms);
}

/* net_request posts one metric and reads the reply, which the server
 * delays by ms. via_poll: the socket has a timeout, as in
 * http.client.HTTPConnection(host, port, timeout=10) or requests: it is
 * non-blocking, a non-blocking connect is finished by a poll for POLLOUT,
 * and every recv is preceded by a poll for POLLIN, so the thread waits in
 * poll, never in recv. */
static void net_request(long ms, int via_poll)
{
	char host[128];
	snprintf(host, sizeof(host), "%s", opt.server ? opt.server : server_addr);
	char *colon = strrchr(host, ':');
	if (colon == NULL)
		die("invalid --server %s (want HOST:PORT)", host);
	*colon = '\0';
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		die("invalid --server address %s (want an IPv4 address)", host);
	int timeout_ms = (int)ms + 10000; /* the reply's delay and then some */
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (via_poll ? SOCK_NONBLOCK : 0), 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		if (!via_poll || errno != EINPROGRESS)
			die("connect %s:%s: %s", host, colon + 1, strerror(errno));
		poll_socket(fd, POLLOUT, timeout_ms, "connect");
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
			die("connect %s:%s: %s", host, colon + 1, strerror(err ? err : errno));
	}
	char body[128], req[512];
	int bl = snprintf(body, sizeof(body), "{\"pid\":%d,\"metric\":\"loss\",\"value\":0.5}",
			  (int)getpid());
	int rl = snprintf(req, sizeof(req),
			  "POST /log?delay_ms=%ld HTTP/1.1\r\nHost: %s\r\nContent-Type: "
			  "application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			  ms, host, bl, body);
	if (via_poll)
		poll_socket(fd, POLLOUT, timeout_ms, "send to log server");
	if (send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl)
		die("send to log server: %s", strerror(errno));
	char resp[1024];
	ssize_t n;
	for (;;) {
		if (via_poll)
			poll_socket(fd, POLLIN, timeout_ms, "recv from log server");
		n = recv(fd, resp, sizeof(resp), 0);
		if (n > 0)
			continue;
		if (n < 0 && via_poll && (errno == EAGAIN || errno == EWOULDBLOCK))
			continue; /* woken without data (a spurious wakeup) */
		break;
	}
	if (n < 0)
		die("recv from log server: %s", strerror(errno));
	close(fd);
}

/* The cause a stall's truth record names: what gaptrace should say. */
static const char *truth_cause(const struct stall *st)
{
	switch (st->c) {
	case C_PAGEABLE:
		return "cuda.memcpy";
	case C_CHECKPOINT:
		return "io.write";
	default:
		return st->name;
	}
}

/* Runs one stall on the calling (main) thread and records it. */
static void run_stall(const struct stall *st, long step)
{
	uint64_t ms_ns = (uint64_t)st->ms * 1000000ull;
	char extra[4608] = "";
	cpu_set_t oldset;

	/* Preparation that must not count as stall time. */
	if (st->c == C_CPU_CONTENTION) {
		sched_getaffinity(0, sizeof(oldset), &oldset);
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(hog_cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) != 0)
			die("pin to CPU %d: %s", hog_cpu, strerror(errno));
		atomic_store(&hog->done, 0);
		/* Migrate before measuring. */
		sched_yield();
	}
	if (st->c == C_COMM) {
		/* Applied to the step's last collective; the stall is the wait in the final sync. */
		pending_comm_delay_ns = ms_ns;
		pending_comm_name = st->name;
		return;
	}

	if (st->c == C_LOCK) {
		/* Wait until the holder has the mutex: handing it the request and
		 * its wake-up are not the lock's time. */
		atomic_store(&lock_acquired, 0);
		if (write(lock_req_w, &ms_ns, sizeof(ms_ns)) != (ssize_t)sizeof(ms_ns))
			die("wake lock holder: %s", strerror(errno));
		while (atomic_load(&lock_acquired) == 0)
			sched_yield();
	}

	uint64_t rd0 = thread_run_delay_ns();
	uint64_t start = now_ns();
	uint64_t deadline = start + ms_ns;
	uint64_t fixed_end = 0; /* set where the stall ended before its records were made */
	switch (st->c) {
	case C_IO_READ: {
		if (!main_reader_open) {
			reader_open(&main_reader);
			main_reader_open = 1;
		}
		uint64_t b = read_cold_until(&main_reader, deadline);
		snprintf(extra, sizeof(extra), ",\"path\":\"%s\",\"bytes\":%llu,\"direct\":%s",
			 data_path, (unsigned long long)b, main_reader.direct ? "true" : "false");
		break;
	}
	case C_IO_WRITE: {
		if (ckpt_fd < 0) {
			ckpt_fd = open(ckpt_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
			if (ckpt_fd < 0)
				die("create %s: %s", ckpt_path, strerror(errno));
			ckpt_buf = malloc(IO_CHUNK);
			if (ckpt_buf == NULL)
				die("out of memory");
			memset(ckpt_buf, 0x5a, IO_CHUNK);
		}
		uint64_t b = 0;
		struct pacer pc = {0, 0};
		while (pacer_more(&pc, deadline)) {
			if (ckpt_off >= DATA_FILE_BYTES)
				ckpt_off = 0;
			if (pwrite(ckpt_fd, ckpt_buf, IO_CHUNK, (off_t)ckpt_off) != (ssize_t)IO_CHUNK)
				die("write %s: %s", ckpt_path, strerror(errno));
			ckpt_off += IO_CHUNK;
			b += IO_CHUNK;
			if (fsync(ckpt_fd) != 0)
				die("fsync %s: %s", ckpt_path, strerror(errno));
		}
		snprintf(extra, sizeof(extra), ",\"path\":\"%s\",\"bytes\":%llu", ckpt_path,
			 (unsigned long long)b);
		break;
	}
	case C_NET:
		net_request(st->ms, st->poll);
		snprintf(extra, sizeof(extra), ",\"peer\":\"%s\",\"server_pid\":%d,\"via\":\"%s\"",
			 opt.server ? opt.server : server_addr, opt.server ? 0 : (int)logsrv_pid,
			 st->poll ? "poll" : "recv");
		break;
	case C_LOADER_IO:
	case C_LOADER_CPU: {
		struct worker *w = &workers[next_worker++ % nworkers];
		struct loader_req q = {st->c == C_LOADER_IO ? 1 : 2, (uint32_t)st->ms, deadline};
		struct loader_reply got;
		if (write(w->req_w, &q, sizeof(q)) != (ssize_t)sizeof(q))
			die("send request to worker %d: %s", (int)w->pid, strerror(errno));
		ssize_t n;
		while ((n = read(w->reply_r, &got, sizeof(got))) < 0 && errno == EINTR)
			;
		if (n != (ssize_t)sizeof(got))
			die("worker %d did not reply", (int)w->pid);
		snprintf(extra, sizeof(extra),
			 ",\"worker\":%d,\"worker_did\":\"%s\",\"bytes\":%llu,"
			 "\"worker_run_delay_ns\":%llu",
			 (int)w->pid, q.kind == 1 ? "io" : "cpu", (unsigned long long)got.bytes,
			 (unsigned long long)got.run_delay_ns);
		break;
	}
	case C_CUDA_MEMCPY: {
		size_t bytes = (size_t)((double)ms_ns * pcie_gbps);
		uint64_t s = now_ns();
		check_cu(cuMemcpyHtoD_v2(dbatch, hbatch, bytes), "cuMemcpyHtoD_v2");
		uint64_t e = now_ns();
		truth_call("memcpy", "cuMemcpyHtoD_v2", step, s, e, NULL, bytes);
		start = s;
		fixed_end = e;
		snprintf(extra, sizeof(extra), ",\"bytes\":%zu", bytes);
		break;
	}
	case C_CUDA_ALLOC: {
		size_t bytes = 64u << 20;
		CUdeviceptr p;
		simgpu_set_alloc_delay_ns(ms_ns);
		uint64_t s = now_ns();
		CUresult r = cuMemAlloc_v2(&p, bytes);
		uint64_t m = now_ns();
		simgpu_set_alloc_delay_ns(0);
		check_cu(r, "cuMemAlloc_v2");
		check_cu(cuMemFree_v2(p), "cuMemFree_v2");
		uint64_t e = now_ns();
		truth_call("alloc", "cuMemAlloc_v2", step, s, m, NULL, bytes);
		truth_call("free", "cuMemFree_v2", step, m, e, NULL, bytes);
		start = s;
		fixed_end = e;
		snprintf(extra, sizeof(extra), ",\"bytes\":%zu", bytes);
		break;
	}
	case C_PAGEABLE: {
		/* Sized to keep the host staging for ms at the simulated pageable
		 * rate; the buffers are made once and kept, like a dataset tensor. */
		size_t bytes = (size_t)((double)ms_ns * env_gbps("SIMGPU_PAGEABLE_GBPS", 6));
		if (bytes > pageable_len) {
			free(pageable_buf);
			pageable_buf = calloc(1, bytes);
			if (pageable_buf == NULL)
				die("out of memory");
			if (dpageable != 0)
				check_cu(cuMemFree_v2(dpageable), "cuMemFree_v2");
			check_cu(cuMemAlloc_v2(&dpageable, bytes), "cuMemAlloc_v2");
			pageable_len = bytes;
		}
		uint64_t s = now_ns();
		check_cu(cuMemcpyHtoDAsync_v2(dpageable, pageable_buf, bytes, streams[0]),
			 "cuMemcpyHtoDAsync_v2");
		uint64_t e = now_ns();
		truth_call("copy", "cuMemcpyHtoDAsync_v2", step, s, e, streams[0], bytes);
		start = s;
		fixed_end = e;
		snprintf(extra, sizeof(extra), ",\"kind\":\"pageable\",\"bytes\":%zu,\"direction\":\"htod\"",
			 bytes);
		break;
	}
	case C_CHECKPOINT: {
		if (state_buf == NULL) {
			state_buf = calloc(1, CKPT_TENSOR_BYTES);
			if (state_buf == NULL)
				die("out of memory");
			check_cu(cuMemAlloc_v2(&dstate, CKPT_TENSOR_BYTES), "cuMemAlloc_v2");
		}
		int fd = open(state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0)
			die("create %s: %s", state_path, strerror(errno));
		/* Serialization fills what the copies and writes leave of 90% of
		 * the stall; the fsync takes the rest (what the disk needs). */
		uint64_t per = ms_ns * 9 / 10 / CKPT_TENSORS;
		for (int k = 0; k < CKPT_TENSORS; k++) {
			check_cu(cuMemcpyDtoHAsync_v2(state_buf, dstate, CKPT_TENSOR_BYTES, streams[0]),
				 "cuMemcpyDtoHAsync_v2");
			check_cu(cuStreamSynchronize(streams[0]), "cuStreamSynchronize");
			spin_until(start + (uint64_t)(k + 1) * per);
			if (write(fd, state_buf, CKPT_TENSOR_BYTES) != (ssize_t)CKPT_TENSOR_BYTES)
				die("write %s: %s", state_path, strerror(errno));
		}
		if (fsync(fd) != 0)
			die("fsync %s: %s", state_path, strerror(errno));
		close(fd);
		snprintf(extra, sizeof(extra),
			 ",\"kind\":\"checkpoint\",\"path\":\"%s\",\"tensors\":%d,\"bytes\":%llu",
			 state_path, CKPT_TENSORS, (unsigned long long)CKPT_TENSORS * CKPT_TENSOR_BYTES);
		break;
	}
	case C_CPU:
		spin_until(deadline);
		break;
	case C_CPU_CONTENTION: {
		if (write(hog_req_w, &deadline, sizeof(deadline)) != (ssize_t)sizeof(deadline))
			die("wake contention helper: %s", strerror(errno));
		/* Runnable the whole time; on-CPU only when the helper lets us. */
		while (!atomic_load(&hog->done))
			;
		break;
	}
	case C_SLEEP: {
		struct timespec ts = {.tv_sec = (time_t)(st->ms / 1000),
				      .tv_nsec = (st->ms % 1000) * 1000000L};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		break;
	}
	case C_LOCK: {
		pthread_mutex_lock(&lock_mu);
		pthread_mutex_unlock(&lock_mu);
		uint64_t held = now_ns() - atomic_load(&lock_acquired);
		snprintf(extra, sizeof(extra), ",\"holder_tid\":%d,\"held_ns\":%llu",
			 atomic_load(&lock_holder_tid), (unsigned long long)held);
		break;
	}
	case C_COMM:
		break;
	}
	uint64_t end = fixed_end ? fixed_end : now_ns();
	uint64_t rd = thread_run_delay_ns() - rd0;
	if (st->c == C_CPU_CONTENTION) {
		snprintf(extra, sizeof(extra), ",\"cpu\":%d,\"helper_pid\":%d", hog_cpu,
			 (int)hog_pid);
		sched_setaffinity(0, sizeof(oldset), &oldset);
	}
	if (truth_f != NULL)
		bprintf(&truth_buf,
			"{\"type\":\"stall\",\"step\":%ld,\"cause\":\"%s\",\"start\":%llu,\"end\":%llu,"
			"\"tid\":%d,\"ms\":%ld,\"run_delay_ns\":%llu%s%s}\n",
			step, truth_cause(st), (unsigned long long)start, (unsigned long long)end, gettid_(),
			st->ms, (unsigned long long)rd, st->ahead ? ",\"at\":\"ahead\"" : "", extra);
}

/* ------------------------------------------------------------------ */
/* Main loop                                                           */

static void on_signal(int sig)
{
	stop_requested = 1;
}

static void collective(long step, int last)
{
	size_t count = (size_t)opt.bucket_bytes / 4;
	if (last && pending_comm_delay_ns > 0) {
		simgpu_nccl_set_delay_ns(pending_comm_delay_ns);
		comm_capture = 1;
	}
	uint64_t s = now_ns();
	ncclResult_t r = ncclAllReduce((void *)(uintptr_t)dgrad, (void *)(uintptr_t)dgrad, count,
				       ncclFloat32, ncclSum, comm, streams[0]);
	uint64_t e = now_ns();
	if (r != ncclSuccess)
		die("ncclAllReduce: %s", ncclGetErrorString(r));
	if (truth_f != NULL)
		bprintf(&truth_buf,
			"{\"type\":\"call\",\"what\":\"collective\",\"api\":\"ncclAllReduce\","
			"\"op\":\"AllReduce\",\"step\":%ld,\"start\":%llu,\"end\":%llu,\"tid\":%d,"
			"\"stream\":%llu,\"count\":%zu,\"bytes\":%zu,\"datatype\":\"float32\","
			"\"nranks\":%ld,\"rank\":%ld}\n",
			step, (unsigned long long)s, (unsigned long long)e, gettid_(),
			(unsigned long long)(uintptr_t)streams[0], count, count * 4, opt.nranks,
			opt.rank);
}

static int dump_timeline(void)
{
	unsigned long long from, to;
	unsigned int mask = SIMGPU_KIND_KERNEL | SIMGPU_KIND_COLLECTIVE;
	int n = sscanf(opt.dump_timeline, "%llu,%llu,%u", &from, &to, &mask);
	if (n < 2 || to <= from)
		usage_error("invalid --dump-timeline %s (want FROM,TO[,MASK] in monotonic ns)",
			    opt.dump_timeline);
	struct simgpu_timeline *t = simgpu_timeline_open((int)opt.device, 0);
	if (t == NULL)
		die("open timeline of device %ld: %s", opt.device, strerror(errno));
	uint32_t pids[64];
	int np = simgpu_timeline_pids(t, pids, 64);
	printf("{\"busy_ns\":%llu,\"mem_used\":%llu,\"pids\":%d}\n",
	       (unsigned long long)simgpu_timeline_busy_ns(t, from, to, mask),
	       (unsigned long long)simgpu_timeline_mem_used(t), np);
	simgpu_timeline_close(t);
	return 0;
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	if (opt.dump_timeline != NULL)
		return dump_timeline();

	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (opt.data_dir != NULL) {
		snprintf(data_dir, sizeof(data_dir), "%s", opt.data_dir);
		if (mkdir(data_dir, 0755) != 0 && errno != EEXIST)
			die("create --data-dir %s: %s", data_dir, strerror(errno));
	} else {
		const char *tmp = getenv("TMPDIR");
		snprintf(data_dir, sizeof(data_dir), "%s/simtrain-XXXXXX",
			 tmp && *tmp ? tmp : "/var/tmp");
		if (mkdtemp(data_dir) == NULL)
			die("create temporary data dir: %s", strerror(errno));
		data_dir_is_temp = 1;
		main_pid = getpid();
		atexit(remove_temp_data_dir);
	}
	snprintf(data_path, sizeof(data_path), "%s/simtrain-data.bin", data_dir);
	snprintf(ckpt_path, sizeof(ckpt_path), "%s/simtrain-ckpt.bin", data_dir);
	snprintf(state_path, sizeof(state_path), "%s/simtrain-state.pt", data_dir);
	if (has_cause(C_IO_READ) || has_cause(C_LOADER_IO))
		create_data_file();

	if (opt.truth != NULL) {
		truth_f = fopen(opt.truth, "we");
		if (truth_f == NULL)
			die("create truth file %s: %s", opt.truth, strerror(errno));
	}
	schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
	simgpu_set_busy_callback(on_busy, NULL);
	setup_device();

	start_workers();
	if (has_cause(C_NET) && opt.server == NULL)
		start_logsrv();
	if (has_cause(C_CPU_CONTENTION))
		start_hog();
	if (has_cause(C_LOCK))
		start_lock_holder();

	if (truth_f != NULL) {
		bprintf(&truth_buf,
			"{\"type\":\"meta\",\"clock\":\"monotonic\",\"realtime_minus_monotonic_ns\":%llu,"
			"\"pid\":%d,\"tid\":%d,\"device\":%ld,\"rank\":%ld,\"nranks\":%ld,\"steps\":%ld,"
			"\"kernels_per_step\":%ld,\"kernel_us\":%ld,\"launch_gap_us\":%ld,"
			"\"streams\":%ld,\"collectives\":%ld,\"launch_api\":\"%s\",\"copy_api\":\"%s\","
			"\"sync\":\"%s\","
			"\"batch_bytes\":%ld,\"bucket_bytes\":%ld,\"pcie_gbps\":%g,\"data_dir\":\"%s\","
			"\"server\":\"%s\",\"server_pid\":%d,\"workers\":[",
			(unsigned long long)realtime_minus_monotonic(), (int)getpid(), gettid_(),
			opt.device, opt.rank, opt.nranks, opt.steps, opt.kernels, opt.kernel_us,
			opt.gap_us, opt.streams, opt.collectives, launch_api_names[opt.api],
			copy_api_names[opt.copy_api], ctx_sync_name(), opt.batch_bytes,
			opt.bucket_bytes, pcie_gbps, data_dir,
			opt.server ? opt.server : server_addr, (int)logsrv_pid);
		for (int i = 0; i < nworkers; i++)
			bprintf(&truth_buf, "%s%d", i ? "," : "", (int)workers[i].pid);
		bprintf(&truth_buf, "],\"stalls\":[");
		for (int i = 0; i < opt.nstalls; i++)
			bprintf(&truth_buf, "%s{\"cause\":\"%s\",\"every\":%ld,\"ms\":%ld%s%s}",
				i ? "," : "", opt.stalls[i].name, opt.stalls[i].every,
				opt.stalls[i].ms, opt.stalls[i].ahead ? ",\"at\":\"ahead\"" : "",
				opt.stalls[i].poll ? ",\"via\":\"poll\"" : "");
		bprintf(&truth_buf, "]}\n");
		truth_flush();
		truth_start_writer();
	}

	uint64_t t0 = now_ns(), last_print = t0, last_flush = t0;
	long step;
	for (step = 1; step <= opt.steps && !stop_requested; step++) {
		pending_comm_delay_ns = 0;
		for (int i = 0; i < opt.nstalls; i++)
			if (!opt.stalls[i].ahead && step % opt.stalls[i].every == 0)
				run_stall(&opt.stalls[i], step);

		uint64_t step_start = now_ns();
		/* The feeder's own run-queue wait over the step: a loaded host's
		 * share of the step, which tests judge timing against. */
		uint64_t step_rd0 = truth_f != NULL ? thread_run_delay_ns() : 0;
		/* The batch moves to the device first, as x.to(dev, non_blocking=True)
		 * does: one copy per tensor, each of its own size. */
		for (long i = 0; i < opt.batch_copies; i++) {
			size_t b = (size_t)opt.batch_bytes >> i;
			uint64_t s = now_ns();
			check_cu(cuMemcpyHtoDAsync_v2(dbatch, hbatch, b ? b : 1, streams[0]),
				 "cuMemcpyHtoDAsync_v2");
			truth_call("copy", "cuMemcpyHtoDAsync_v2", step, s, now_ns(), streams[0],
				   b ? b : 1);
		}
		/* Host code reads scalars (.item(), a loss check, logging) a varying
		 * number of times per step, each a small device-to-host copy and a
		 * sync: step n makes extra_of(n) of them, after varying kernels. */
		long nextra = 0, extra_at[64];
		if (opt.extra_syncs > 0) {
			uint64_t h = (uint64_t)step * 0x9e3779b97f4a7c15ull;
			h ^= h >> 29;
			nextra = (long)(h % (uint64_t)(opt.extra_syncs + 1));
			for (long k = 0; k < nextra; k++) {
				h = h * 6364136223846793005ull + 1442695040888963407ull;
				extra_at[k] = (long)((h >> 33) % (uint64_t)opt.kernels);
			}
		}
		const char *api = NULL;
		int mixed = 0;
		for (long i = 0; i < opt.kernels; i++) {
			if (i > 0 && opt.gap_us > 0)
				spin_until(now_ns() + (uint64_t)opt.gap_us * 1000ull);
			const char *a = launch_one(i, streams[i % opt.streams]);
			if (api != NULL && strcmp(api, a) != 0)
				mixed = 1;
			api = a;
			for (long k = 0; k < nextra; k++) {
				if (extra_at[k] != i)
					continue;
				static float scalar;
				uint64_t s = now_ns();
				check_cu(cuMemcpyDtoHAsync_v2(&scalar, dbatch, sizeof(scalar), streams[0]),
					 "cuMemcpyDtoHAsync_v2");
				check_cu(cuStreamSynchronize(streams[0]), "cuStreamSynchronize");
				truth_call("sync", "cuStreamSynchronize", step, s, now_ns(), streams[0], 0);
			}
		}
		uint64_t launches_end = now_ns();
		if (opt.copy_api_set) {
			CUstream cs = streams[(step - 1) % opt.streams];
			unsigned long long cb;
			uint64_t s = now_ns();
			const char *ca = copy_one(step, cs, &cb);
			truth_call("copy", ca, step, s, now_ns(), cs, cb);
		} else if (opt.batch_bytes > 0) { /* 0: a step of kernels and a sync only */
			check_cu(cuMemcpyHtoDAsync_v2(dbatch, hbatch, (size_t)opt.batch_bytes, streams[0]),
				 "cuMemcpyHtoDAsync_v2");
		}
		long ncoll = opt.collectives;
		if (pending_comm_delay_ns > 0 && ncoll == 0)
			ncoll = 1; /* a late peer needs a collective to be late for */
		for (long i = 0; i < ncoll; i++)
			collective(step, i == ncoll - 1);
		/* The CPU runs ahead: everything is enqueued, nothing waits for it yet. */
		for (int i = 0; i < opt.nstalls; i++)
			if (opt.stalls[i].ahead && step % opt.stalls[i].every == 0)
				run_stall(&opt.stalls[i], step);

		uint64_t comm_sync_start = 0;
		uint64_t comm_rd0 = pending_comm_delay_ns > 0 ? thread_run_delay_ns() : 0;
		if (step % opt.sync_every != 0 && step != opt.steps) {
			/* --sync-every: a loop that reads its loss only every Nth
			 * step leaves the others unsynchronized. */
		} else if (opt.ctx_sync) {
			uint64_t s = now_ns();
			if (opt.ctx_sync == 2)
				check_cu(cuCtxSynchronize_v2(NULL), "cuCtxSynchronize_v2");
			else
				check_cu(cuCtxSynchronize(), "cuCtxSynchronize");
			uint64_t e = now_ns();
			truth_call("sync", ctx_sync_name(), step, s, e, NULL, 0);
			comm_sync_start = s;
		} else {
			for (long i = 0; i < opt.streams; i++) {
				uint64_t s = now_ns();
				check_cu(cuStreamSynchronize(streams[i]), "cuStreamSynchronize");
				uint64_t e = now_ns();
				truth_call("sync", "cuStreamSynchronize", step, s, e, streams[i], 0);
				if (i == 0)
					comm_sync_start = s;
			}
		}
		uint64_t step_end = now_ns();
		/* Work right after the step's last sync, as GradScaler.update after
		 * its found_inf read or an optimizer step after loss.item() makes:
		 * a few short kernels, then the host's next step. */
		for (long i = 0; i < opt.trailing; i++) {
			void *params[] = {&dbatch};
			check_cu(cuLaunchKernel(ktrail, 108, 1, 1, 256, 1, 1, 0, streams[0], params, NULL),
				 "cuLaunchKernel");
		}

		if (truth_f != NULL) {
			if (pending_comm_delay_ns > 0) {
				/* The feeder waited on the late collective from when it started
				 * on the GPU (or the sync began) until the sync returned. */
				uint64_t s = comm_capture_start > comm_sync_start ? comm_capture_start
										 : comm_sync_start;
				bprintf(&truth_buf,
					"{\"type\":\"stall\",\"step\":%ld,\"cause\":\"%s\",\"start\":%llu,"
					"\"end\":%llu,\"tid\":%d,\"ms\":%llu,\"run_delay_ns\":%llu,"
					"\"op\":\"AllReduce\"}\n",
					step, pending_comm_name, (unsigned long long)s,
					(unsigned long long)step_end, gettid_(),
					(unsigned long long)(pending_comm_delay_ns / 1000000ull),
					(unsigned long long)(thread_run_delay_ns() - comm_rd0));
			} else if (opt.comm_id != NULL) {
				/* A peer process reached the step's last collective later
				 * than this rank's stream did: this rank's kernel spun on it
				 * from then (or from the sync) until the last rank's stream
				 * reached it. The collective's own time after that, and the
				 * sync's return, are not the peer's lateness. */
				uint64_t reach, last;
				int late_rank;
				if (simgpu_nccl_last_rendezvous(&reach, &last, &late_rank) &&
				    last >= reach + 1000000ull && last > comm_sync_start) {
					uint64_t s = reach > comm_sync_start ? reach : comm_sync_start;
					uint64_t e = last < step_end ? last : step_end;
					bprintf(&truth_buf,
						"{\"type\":\"stall\",\"step\":%ld,\"cause\":\"comm\",\"start\":%llu,"
						"\"end\":%llu,\"tid\":%d,\"ms\":%llu,\"run_delay_ns\":0,"
						"\"op\":\"AllReduce\",\"late_rank\":%d,\"late_ns\":%llu}\n",
						step, (unsigned long long)s, (unsigned long long)e, gettid_(),
						(unsigned long long)((last - reach) / 1000000ull), late_rank,
						(unsigned long long)(last - reach));
				}
			}
			bprintf(&truth_buf,
				"{\"type\":\"call\",\"what\":\"launch_count\",\"api\":\"%s\",\"step\":%ld,"
				"\"start\":%llu,\"end\":%llu,\"tid\":%d,\"count\":%ld,\"copies\":1}\n",
				mixed ? "mix" : api, step, (unsigned long long)step_start,
				(unsigned long long)launches_end, gettid_(), opt.kernels);
			/* cpu_ns: the process's CPU time so far (every thread; a
			 * uprobe's trap is charged to the thread that hit it), for
			 * the overhead benchmark's CPU time per step. */
			bprintf(&truth_buf,
				"{\"type\":\"step\",\"step\":%ld,\"start\":%llu,\"end\":%llu,\"cpu_ns\":%llu,"
				"\"run_delay_ns\":%llu}\n",
				step, (unsigned long long)step_start, (unsigned long long)step_end,
				(unsigned long long)process_cpu_ns(),
				(unsigned long long)(thread_run_delay_ns() - step_rd0));
		}
		comm_capture = 0;
		comm_capture_start = 0;

		uint64_t now = now_ns();
		if (now - last_flush >= 1000000000ull) {
			truth_flush();
			last_flush = now;
		}
		if (!opt.quiet && now - last_print >= 1000000000ull) {
			printf("simtrain: step %ld/%ld, %.1f steps/s\n", step, opt.steps,
			       (double)step * 1e9 / (double)(now - t0));
			fflush(stdout);
			last_print = now;
		}
	}
	long done = step - 1;
	uint64_t wall = now_ns() - t0;
	if (truth_f != NULL) {
		bprintf(&truth_buf, "{\"type\":\"end\",\"steps\":%ld,\"wall_ns\":%llu,\"interrupted\":%s}\n",
			done, (unsigned long long)wall, stop_requested ? "true" : "false");
		truth_close();
	}
	stop_children();
	printf("simtrain: %ld steps in %.3f s (%.1f steps/s)\n", done, (double)wall / 1e9,
	       (double)done * 1e9 / (double)(wall ? wall : 1));
	return 0;
}
