//go:build ignore

/*
 * nccl.c - the simulated NCCL (libnccl.so.2).
 *
 * Exports the real NCCL entry points with the real signatures. As in the
 * NCCL wheel, every public ncclX is a weak alias of pncclX at the same
 * address, so a tracer that attaches by symbol name must deduplicate by
 * address or count every call twice.
 *
 * A collective enqueues one COLLECTIVE interval on its stream through the
 * simulated driver (simgpu_enqueue), lasting
 *     SIMGPU_NCCL_LAT_US + bus bytes / SIMGPU_NCCL_GBPS + injected delay,
 * where bus bytes follow the ring algorithm (all-reduce moves 2(n-1)/n of
 * the buffer, all-gather and reduce-scatter (n-1)/n of the full buffer,
 * the others the buffer once). The injected delay, set with
 * simgpu_nccl_set_delay_ns, models a late peer: the NCCL kernel spins
 * (busy for utilization) until the peer arrives. It applies to the next
 * collective only. Between ncclGroupStart and the outermost ncclGroupEnd
 * collectives are queued and enqueued at ncclGroupEnd, as NCCL launches
 * its kernels there.
 *
 * Ranks of one communicator in different processes rendezvous when its id
 * was made out of band (as torch.distributed shares rank 0's id through its
 * store): an id whose text is "simgpu-rendezvous:NAME" links every
 * communicator created with it under the same SIMGPU_DIR, through the file
 * gaptrace-simgpu-nccl-NAME there. Each rank publishes when its stream
 * reached its k-th collective; the collective then ends, on every rank, at
 * the latest rank's reach plus its own duration. A rank's stream stays busy
 * (spinning, as an NCCL kernel does) until then: its syncs settle the
 * collectives they cover (the sync hook of the simulated driver), extending
 * the kernel while peers are missing. NAME must be new for every run of a
 * job: the file keeps what earlier runs published. Ids from
 * ncclGetUniqueId keep the single-process model: every rank is local, and
 * a late peer is the injected delay.
 */
#define _GNU_SOURCE
#include "simgpu.h"
#include "timeline.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((noinline, visibility("default")))
#define ALIAS(name) \
	extern __typeof(p##name) name __attribute__((weak, alias("p" #name), visibility("default")))

#define NCCL_VERSION_CODE 22703 /* 2.27.3 */
#define COMM_MAGIC 0x4e43434cu
#define MAX_GROUP_OPS 4096

#define RDV_PREFIX "simgpu-rendezvous:"
#define RDV_MAX_RANKS 16
#define RDV_SLOTS 1024
#define RDV_MAX_PENDING 256
#define RDV_CHUNK_NS 500000ull   /* a waiting kernel is extended by this much */
#define RDV_MARGIN_NS 500000ull  /* when it has less than this left */
#define RDV_GIVE_UP_NS 120000000000ull /* a peer this late has died */

/* The rendezvous file: seq[r][k % RDV_SLOTS] is k+1 once rank r published
 * reach[r][k % RDV_SLOTS], when its stream reached its k-th collective. */
struct rdv_file {
	_Atomic uint64_t seq[RDV_MAX_RANKS][RDV_SLOTS];
	_Atomic uint64_t reach[RDV_MAX_RANKS][RDV_SLOTS];
};

struct ncclComm {
	uint32_t magic;
	int nranks;
	int rank;
	ncclUniqueId id;
	struct rdv_file *rdv; /* NULL: every rank is local */
	uint64_t next_seq;
};

struct pending {
	struct ncclComm *comm;
	CUstream stream;
	uint64_t dur_ns;
};

/* A rendezvous collective of this process not yet settled by a sync. */
struct rdv_op {
	struct ncclComm *comm;
	CUstream stream;
	uint64_t seq, reach, dur, end;
};

static pthread_mutex_t rdv_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rdv_op rdv_ops[RDV_MAX_PENDING];
static int rdv_n;
static int rdv_have_last;
static uint64_t rdv_last_reach, rdv_last_last;
static int rdv_last_rank;

static __thread int group_depth;
static __thread int group_n;
static __thread struct pending *group_ops;
static __thread ncclResult_t group_err;

static _Atomic uint64_t next_delay_ns;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static double cfg_gbps = 100.0;
static uint64_t cfg_lat_ns = 10000;

static void load_cfg(void)
{
	const char *s = getenv("SIMGPU_NCCL_GBPS");
	if (s != NULL && strtod(s, NULL) > 0)
		cfg_gbps = strtod(s, NULL);
	s = getenv("SIMGPU_NCCL_LAT_US");
	if (s != NULL && strtod(s, NULL) >= 0)
		cfg_lat_ns = (uint64_t)(strtod(s, NULL) * 1000);
}

static size_t type_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	default: return 0;
	}
}

enum op { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_REDUCE, OP_P2P };

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether every peer reached op's collective; *last is the latest reach
 * (this rank's own included) and *rank whose it was. */
static int rdv_arrived(const struct rdv_op *o, uint64_t *last, int *rank)
{
	struct rdv_file *f = o->comm->rdv;
	uint64_t slot = o->seq % RDV_SLOTS;
	*last = o->reach;
	*rank = o->comm->rank;
	for (int p = 0; p < o->comm->nranks; p++) {
		if (p == o->comm->rank)
			continue;
		uint64_t sq = atomic_load_explicit(&f->seq[p][slot], memory_order_acquire);
		if (sq < o->seq + 1)
			return 0;
		/* A peer a whole ring ahead overwrote the slot: it reached this
		 * collective long ago. */
		uint64_t r = sq == o->seq + 1 ? atomic_load(&f->reach[p][slot]) : 0;
		if (r > *last) {
			*last = r;
			*rank = p;
		}
	}
	return 1;
}

/* Keeps op's kernel spinning until every peer reached the collective, then
 * makes it end at the latest reach plus its duration: the sync that called
 * it then sleeps until then and wakes once, at the completion. rdv_mu held. */
static void rdv_settle(struct rdv_op *o)
{
	uint64_t last;
	int rank;
	uint64_t t0 = mono_ns();
	while (!rdv_arrived(o, &last, &rank)) {
		uint64_t now = mono_ns();
		if (now - t0 > RDV_GIVE_UP_NS) {
			fprintf(stderr, "simgpu nccl: rank %d gave up waiting for its peers on collective %llu\n",
				o->comm->rank, (unsigned long long)o->seq);
			break;
		}
		if (o->end < now + RDV_MARGIN_NS)
			simgpu_enqueue(o->stream, RDV_CHUNK_NS, SIMGPU_KIND_COLLECTIVE, NULL, &o->end);
		/* Spin, yielding, as a CUDA sync in its default spin/yield mode
		 * does: a sleep here would wake the thread inside the sync, and
		 * a tracer takes a sync's last wake-up for the GPU's completion. */
		sched_yield();
	}
	uint64_t target = last + o->dur;
	uint64_t from = o->end > mono_ns() ? o->end : mono_ns();
	if (target > from)
		simgpu_enqueue(o->stream, target - from, SIMGPU_KIND_COLLECTIVE, NULL, &o->end);
	rdv_have_last = 1;
	rdv_last_reach = o->reach;
	rdv_last_last = last;
	rdv_last_rank = rank;
}

/* The simulated driver's sync hook: settles, in issue order, the pending
 * collectives on stream h. A default stream (NULL, legacy, per-thread)
 * settles every one: which streams it implies is the driver's to know. A
 * trainer that issues collectives on several threads at once would
 * serialize here. */
static void rdv_sync_hook(CUstream h)
{
	int all = h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
	pthread_mutex_lock(&rdv_mu);
	int k = 0;
	for (int i = 0; i < rdv_n; i++) {
		if (all || rdv_ops[i].stream == h)
			rdv_settle(&rdv_ops[i]);
		else
			rdv_ops[k++] = rdv_ops[i];
	}
	rdv_n = k;
	pthread_mutex_unlock(&rdv_mu);
}

/* Settles every pending collective of comm (it is being destroyed). */
static void rdv_settle_comm(struct ncclComm *c)
{
	pthread_mutex_lock(&rdv_mu);
	int k = 0;
	for (int i = 0; i < rdv_n; i++) {
		if (rdv_ops[i].comm == c)
			rdv_settle(&rdv_ops[i]);
		else
			rdv_ops[k++] = rdv_ops[i];
	}
	rdv_n = k;
	pthread_mutex_unlock(&rdv_mu);
}

static ncclResult_t enqueue_one(struct ncclComm *c, CUstream stream, uint64_t dur)
{
	uint64_t st, en;
	if (simgpu_enqueue(stream, dur, SIMGPU_KIND_COLLECTIVE, &st, &en) != CUDA_SUCCESS)
		return ncclUnhandledCudaError;
	if (c->rdv == NULL)
		return ncclSuccess;
	uint64_t k = c->next_seq++;
	atomic_store(&c->rdv->reach[c->rank][k % RDV_SLOTS], st);
	atomic_store_explicit(&c->rdv->seq[c->rank][k % RDV_SLOTS], k + 1, memory_order_release);
	pthread_mutex_lock(&rdv_mu);
	if (rdv_n == RDV_MAX_PENDING) {
		/* Never synced: the oldest must end before more are issued. */
		rdv_settle(&rdv_ops[0]);
		memmove(rdv_ops, rdv_ops + 1, (size_t)(--rdv_n) * sizeof(*rdv_ops));
	}
	rdv_ops[rdv_n++] = (struct rdv_op){c, stream, k, st, dur, en};
	pthread_mutex_unlock(&rdv_mu);
	return ncclSuccess;
}

static ncclResult_t submit(struct ncclComm *c, CUstream stream, uint64_t dur)
{
	if (group_depth > 0) {
		if (group_ops == NULL)
			group_ops = calloc(MAX_GROUP_OPS, sizeof(*group_ops));
		if (group_ops == NULL || group_n == MAX_GROUP_OPS)
			return group_err = ncclSystemError;
		group_ops[group_n].comm = c;
		group_ops[group_n].stream = stream;
		group_ops[group_n].dur_ns = dur;
		group_n++;
		return ncclSuccess;
	}
	return enqueue_one(c, stream, dur);
}

/* Maps the rendezvous file of id name under SIMGPU_DIR. */
static struct rdv_file *rdv_open(const char *name)
{
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      *p == '.' || *p == '_' || *p == '-'))
			return NULL;
	if (*name == '\0')
		return NULL;
	const char *dir = getenv("SIMGPU_DIR");
	char path[4096];
	snprintf(path, sizeof(path), "%s/gaptrace-simgpu-nccl-%s", dir && *dir ? dir : "/dev/shm", name);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, sizeof(struct rdv_file)) != 0) {
		close(fd);
		return NULL;
	}
	void *m = mmap(NULL, sizeof(struct rdv_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return m == MAP_FAILED ? NULL : m;
}

static ncclResult_t collective(enum op op, size_t count, ncclDataType_t dt, ncclComm_t comm,
			       cudaStream_t stream)
{
	pthread_once(&cfg_once, load_cfg);
	if (comm == NULL || comm->magic != COMM_MAGIC)
		return ncclInvalidArgument;
	size_t ts = type_size(dt);
	if (ts == 0)
		return ncclInvalidArgument;
	double n = comm->nranks, bytes = (double)count * (double)ts, bus;
	switch (op) {
	case OP_ALLREDUCE: bus = 2 * (n - 1) / n * bytes; break;
	case OP_ALLGATHER:
	case OP_REDUCESCATTER: bus = (n - 1) * bytes; break; /* count is per rank */
	default: bus = bytes; break;
	}
	uint64_t dur = cfg_lat_ns + (uint64_t)(bus / cfg_gbps) + atomic_exchange(&next_delay_ns, 0);
	return submit(comm, stream, dur);
}

API ncclResult_t pncclGetVersion(int *version)
{
	if (version == NULL)
		return ncclInvalidArgument;
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}
ALIAS(ncclGetVersion);

API ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
	if (uniqueId == NULL)
		return ncclInvalidArgument;
	memset(uniqueId, 0, sizeof(*uniqueId));
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(uniqueId->internal, sizeof(uniqueId->internal), "simgpu-%d-%lld.%09ld",
		 (int)getpid(), (long long)ts.tv_sec, ts.tv_nsec);
	return ncclSuccess;
}
ALIAS(ncclGetUniqueId);

API const char *pncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error";
	case ncclSystemError: return "unhandled system error";
	case ncclInternalError: return "internal error";
	case ncclInvalidArgument: return "invalid argument";
	case ncclInvalidUsage: return "invalid usage";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}
ALIAS(ncclGetErrorString);

/* The entry points share this body; it is static, so one API call still
 * hits exactly one probed symbol. Only an out-of-band id rendezvous with
 * other processes (see the top of the file). */
static ncclResult_t comm_create(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	struct rdv_file *rdv = NULL;
	char name[sizeof(id.internal) + 1];
	memcpy(name, id.internal, sizeof(id.internal));
	name[sizeof(id.internal)] = '\0';
	if (strncmp(name, RDV_PREFIX, strlen(RDV_PREFIX)) == 0) {
		if (nranks > RDV_MAX_RANKS)
			return ncclInvalidArgument;
		rdv = rdv_open(name + strlen(RDV_PREFIX));
		if (rdv == NULL)
			return ncclSystemError;
		simgpu_set_sync_hook(rdv_sync_hook);
	}
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return ncclSystemError;
	c->magic = COMM_MAGIC;
	c->nranks = nranks;
	c->rank = rank;
	c->id = id;
	c->rdv = rdv;
	*comm = c;
	return ncclSuccess;
}

API ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	return comm_create(comm, nranks, commId, rank);
}
ALIAS(ncclCommInitRank);

/* The config variants PyTorch uses; the configuration itself (blocking,
 * CTAs, ...) means nothing to the simulation. */
API ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
					 ncclConfig_t *config)
{
	(void)config;
	return comm_create(comm, nranks, commId, rank);
}
ALIAS(ncclCommInitRankConfig);

API ncclResult_t pncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId, ncclUniqueId *commIds,
					   ncclConfig_t *config)
{
	(void)config;
	if (nId < 1 || commIds == NULL)
		return ncclInvalidArgument;
	return comm_create(comm, nranks, commIds[0], rank);
}
ALIAS(ncclCommInitRankScalable);

API ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
	if (comm == NULL || comm->magic != COMM_MAGIC)
		return ncclInvalidArgument;
	if (comm->rdv != NULL) {
		rdv_settle_comm(comm);
		munmap(comm->rdv, sizeof(struct rdv_file));
	}
	comm->magic = 0;
	free(comm);
	return ncclSuccess;
}
ALIAS(ncclCommDestroy);

API ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
	if (comm == NULL || comm->magic != COMM_MAGIC || count == NULL)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}
ALIAS(ncclCommCount);

API ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (comm == NULL || comm->magic != COMM_MAGIC || rank == NULL)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}
ALIAS(ncclCommUserRank);

API ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	if (comm == NULL || comm->magic != COMM_MAGIC || asyncError == NULL)
		return ncclInvalidArgument;
	*asyncError = ncclSuccess;
	return ncclSuccess;
}
ALIAS(ncclCommGetAsyncError);

API ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
				ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
				cudaStream_t stream)
{
	if ((unsigned)op > ncclAvg)
		return ncclInvalidArgument;
	return collective(OP_ALLREDUCE, count, datatype, comm, stream);
}
ALIAS(ncclAllReduce);

API ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
				ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
	return collective(OP_ALLGATHER, sendcount, datatype, comm, stream);
}
ALIAS(ncclAllGather);

API ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
				    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
				    cudaStream_t stream)
{
	if ((unsigned)op > ncclAvg)
		return ncclInvalidArgument;
	return collective(OP_REDUCESCATTER, recvcount, datatype, comm, stream);
}
ALIAS(ncclReduceScatter);

API ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
				ncclDataType_t datatype, int root, ncclComm_t comm,
				cudaStream_t stream)
{
	if (comm != NULL && comm->magic == COMM_MAGIC && (root < 0 || root >= comm->nranks))
		return ncclInvalidArgument;
	return collective(OP_BROADCAST, count, datatype, comm, stream);
}
ALIAS(ncclBroadcast);

API ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
			     ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
			     cudaStream_t stream)
{
	if ((unsigned)op > ncclAvg ||
	    (comm != NULL && comm->magic == COMM_MAGIC && (root < 0 || root >= comm->nranks)))
		return ncclInvalidArgument;
	return collective(OP_REDUCE, count, datatype, comm, stream);
}
ALIAS(ncclReduce);

API ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
			   ncclComm_t comm, cudaStream_t stream)
{
	if (comm != NULL && comm->magic == COMM_MAGIC && (peer < 0 || peer >= comm->nranks))
		return ncclInvalidArgument;
	return collective(OP_P2P, count, datatype, comm, stream);
}
ALIAS(ncclSend);

API ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
			   ncclComm_t comm, cudaStream_t stream)
{
	if (comm != NULL && comm->magic == COMM_MAGIC && (peer < 0 || peer >= comm->nranks))
		return ncclInvalidArgument;
	return collective(OP_P2P, count, datatype, comm, stream);
}
ALIAS(ncclRecv);

API ncclResult_t pncclGroupStart(void)
{
	if (group_depth == 0) {
		group_n = 0;
		group_err = ncclSuccess;
	}
	group_depth++;
	return ncclSuccess;
}
ALIAS(ncclGroupStart);

API ncclResult_t pncclGroupEnd(void)
{
	if (group_depth == 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	ncclResult_t r = group_err;
	for (int i = 0; i < group_n; i++) {
		ncclResult_t e = enqueue_one(group_ops[i].comm, group_ops[i].stream, group_ops[i].dur_ns);
		if (e != ncclSuccess && r == ncclSuccess)
			r = e;
	}
	group_n = 0;
	return r;
}
ALIAS(ncclGroupEnd);

/* Not part of NCCL: lets the simulated trainer model a late peer. */
API void simgpu_nccl_set_delay_ns(uint64_t ns)
{
	atomic_store(&next_delay_ns, ns);
}

/* Not part of NCCL: what the last settled rendezvous was, for the truth. */
API int simgpu_nccl_last_rendezvous(uint64_t *reach_ns, uint64_t *last_reach_ns, int *last_rank)
{
	pthread_mutex_lock(&rdv_mu);
	int have = rdv_have_last;
	if (have) {
		*reach_ns = rdv_last_reach;
		*last_reach_ns = rdv_last_last;
		*last_rank = rdv_last_rank;
	}
	pthread_mutex_unlock(&rdv_mu);
	return have;
}
