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
 *
 * This file sets up the device and runs the main loop; simtrain_opts.c
 * parses the command line, simtrain_stall.c injects the stalls,
 * simtrain_env.c keeps their files and child processes, simtrain_truth.c
 * writes the ground truth, and simtrain.h declares what they share.
 */
#include "simtrain.h"

static volatile sig_atomic_t stop_requested;

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
/* The simulated device                                                */

CUstream streams[MAX_STREAMS];
/* --kernel-fns: a step's kernels cycle through the first F-1 functions and
 * its last kernel (the optimizer's, say) has a function of its own, so the
 * functions repeat a fixed number of times per step, as a model's do. */
static CUfunction kfunc, ktrail, kfns[MAX_KFNS];
static CUgraphExec kgraph;
CUdeviceptr dbatch;
static CUdeviceptr dgrad, dcopy;
char *hbatch;
static CUcontext cu_ctx;
static ncclComm_t comm;
double pcie_gbps;

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

/* Enqueues a step's batch copies and kernels, with the scalar reads
 * (extra syncs) among them; returns the launch entry point the step used
 * (*mixed set when it used several). */
static const char *launch_step(long step, int *mixed)
{
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
	for (long i = 0; i < opt.kernels; i++) {
		if (i > 0 && opt.gap_us > 0)
			spin_until(now_ns() + (uint64_t)opt.gap_us * 1000ull);
		const char *a = launch_one(i, streams[i % opt.streams]);
		if (api != NULL && strcmp(api, a) != 0)
			*mixed = 1;
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
	return api;
}

/* Enqueues the step's batch copy and its collectives. */
static void copy_and_reduce(long step)
{
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
}

/* The step's final synchronization; returns when it began (0: none). */
static uint64_t sync_step(long step)
{
	uint64_t comm_sync_start = 0;
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
	return comm_sync_start;
}

/* When a step's phases began and ended, and the run-queue waits at its
 * start and at its final sync, for its truth records. */
struct step_times {
	uint64_t start, launches_end, end, sync_start, comm_rd0, rd0;
};

/* The truth of one step: a late collective's stall, the launch count and
 * the step itself. */
static void record_step(long step, const char *api, int mixed, const struct step_times *tm)
{
	if (pending_comm_delay_ns > 0) {
		/* The feeder waited on the late collective from when it started
		 * on the GPU (or the sync began) until the sync returned. */
		uint64_t s = comm_capture_start > tm->sync_start ? comm_capture_start
								 : tm->sync_start;
		bprintf(&truth_buf,
			"{\"type\":\"stall\",\"step\":%ld,\"cause\":\"%s\",\"start\":%llu,"
			"\"end\":%llu,\"tid\":%d,\"ms\":%llu,\"run_delay_ns\":%llu,"
			"\"op\":\"AllReduce\"}\n",
			step, pending_comm_name, (unsigned long long)s,
			(unsigned long long)tm->end, gettid_(),
			(unsigned long long)(pending_comm_delay_ns / 1000000ull),
			(unsigned long long)(thread_run_delay_ns() - tm->comm_rd0));
	} else if (opt.comm_id != NULL) {
		/* A peer process reached the step's last collective later
		 * than this rank's stream did: this rank's kernel spun on it
		 * from then (or from the sync) until the last rank's stream
		 * reached it. The collective's own time after that, and the
		 * sync's return, are not the peer's lateness. */
		uint64_t reach, last;
		int late_rank;
		if (simgpu_nccl_last_rendezvous(&reach, &last, &late_rank) &&
		    last >= reach + 1000000ull && last > tm->sync_start) {
			uint64_t s = reach > tm->sync_start ? reach : tm->sync_start;
			uint64_t e = last < tm->end ? last : tm->end;
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
		mixed ? "mix" : api, step, (unsigned long long)tm->start,
		(unsigned long long)tm->launches_end, gettid_(), opt.kernels);
	/* cpu_ns: the process's CPU time so far (every thread; a
	 * uprobe's trap is charged to the thread that hit it), for
	 * the overhead benchmark's CPU time per step. */
	bprintf(&truth_buf,
		"{\"type\":\"step\",\"step\":%ld,\"start\":%llu,\"end\":%llu,\"cpu_ns\":%llu,"
		"\"run_delay_ns\":%llu}\n",
		step, (unsigned long long)tm->start, (unsigned long long)tm->end,
		(unsigned long long)process_cpu_ns(),
		(unsigned long long)(thread_run_delay_ns() - tm->rd0));
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

	open_data_dir();
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

	if (truth_f != NULL)
		write_meta();

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
		int mixed = 0;
		const char *api = launch_step(step, &mixed);
		uint64_t launches_end = now_ns();
		copy_and_reduce(step);
		/* The CPU runs ahead: everything is enqueued, nothing waits for it yet. */
		for (int i = 0; i < opt.nstalls; i++)
			if (opt.stalls[i].ahead && step % opt.stalls[i].every == 0)
				run_stall(&opt.stalls[i], step);

		uint64_t comm_rd0 = pending_comm_delay_ns > 0 ? thread_run_delay_ns() : 0;
		uint64_t comm_sync_start = sync_step(step);
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
			struct step_times tm = {step_start, launches_end, step_end, comm_sync_start, comm_rd0, step_rd0};
			record_step(step, api, mixed, &tm);
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
