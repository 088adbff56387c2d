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
 */
#define _GNU_SOURCE
#include "simgpu.h"
#include "timeline.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((noinline, visibility("default")))
#define ALIAS(name) \
	extern __typeof(p##name) name __attribute__((weak, alias("p" #name), visibility("default")))

#define NCCL_VERSION_CODE 22703 /* 2.27.3 */
#define COMM_MAGIC 0x4e43434cu
#define MAX_GROUP_OPS 4096

struct ncclComm {
	uint32_t magic;
	int nranks;
	int rank;
	ncclUniqueId id;
};

struct pending {
	CUstream stream;
	uint64_t dur_ns;
};

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

static ncclResult_t submit(CUstream stream, uint64_t dur)
{
	if (group_depth > 0) {
		if (group_ops == NULL)
			group_ops = calloc(MAX_GROUP_OPS, sizeof(*group_ops));
		if (group_ops == NULL || group_n == MAX_GROUP_OPS)
			return group_err = ncclSystemError;
		group_ops[group_n].stream = stream;
		group_ops[group_n].dur_ns = dur;
		group_n++;
		return ncclSuccess;
	}
	return simgpu_enqueue(stream, dur, SIMGPU_KIND_COLLECTIVE, NULL, NULL) == CUDA_SUCCESS
		       ? ncclSuccess
		       : ncclUnhandledCudaError;
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
	return submit(stream, dur);
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

/* No rendezvous: every rank of the simulated communicator is local. The
 * entry points share this body; it is static, so one API call still hits
 * exactly one probed symbol. */
static ncclResult_t comm_create(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return ncclSystemError;
	c->magic = COMM_MAGIC;
	c->nranks = nranks;
	c->rank = rank;
	c->id = id;
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
	for (int i = 0; i < group_n; i++)
		if (simgpu_enqueue(group_ops[i].stream, group_ops[i].dur_ns, SIMGPU_KIND_COLLECTIVE,
				   NULL, NULL) != CUDA_SUCCESS && r == ncclSuccess)
			r = ncclUnhandledCudaError;
	group_n = 0;
	return r;
}
ALIAS(ncclGroupEnd);

/* Not part of NCCL: lets the simulated trainer model a late peer. */
API void simgpu_nccl_set_delay_ns(uint64_t ns)
{
	atomic_store(&next_delay_ns, ns);
}
