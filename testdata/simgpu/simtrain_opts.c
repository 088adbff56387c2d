//go:build ignore

/*
 * simtrain_opts.c - simtrain's command line: the options, their defaults and
 * their validation, and the errors that end the trainer.
 */
#include "simtrain.h"

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

const char *launch_api_names[] = {"kernel", "ex", "cooperative", "graph", "ptsz", "mix"};

const char *copy_api_names[] = {
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync", "cuMemcpyDtoDAsync_v2",
	"cuMemcpyPeerAsync", "cuMemcpy2DAsync_v2", "cuMemcpy3DAsync_v2", "cuMemsetD8Async",
	"cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
	"cuMemsetD2D32Async", "all",
};

struct options opt = {
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

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("simtrain: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

void usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("simtrain: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\nrun 'simtrain --help' for usage\n", stderr);
	va_end(ap);
	exit(2);
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

/* The checks across options, once all are parsed. */
static void check_args(void)
{
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

void parse_args(int argc, char **argv)
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
	check_args();
}
