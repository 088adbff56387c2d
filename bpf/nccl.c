//go:build ignore

/* NCCL (libnccl.so.2) uprobes.
 *
 * Collectives and point-to-point ops are point events carrying what the
 * correlation needs as evidence (op, elements, bytes, communicator, stream,
 * peer or root). The attach cookie is the event.NCCLOp value. User space
 * attaches once per address: NCCL exports ncclX as a weak alias of pncclX,
 * and probing both names would count every call twice.
 * ncclCommGetAsyncError is never probed (a watchdog calls it ~1000/s).
 */
/* Probes on the GPU's libraries: entering one marks the process TGID_GPU. */
#define GAPTRACE_GPU_PROBES 1
#include "common.h"

/* event.NCCLOp (event/event.go), kept numerically equal
 * (tracer/enums_test.go checks). */
enum nccl_op {
	OP_ALL_REDUCE = 1,
	OP_ALL_GATHER = 2,
	OP_REDUCE_SCATTER = 3,
	OP_BROADCAST = 4,
	OP_REDUCE = 5,
	OP_SEND = 6,
	OP_RECV = 7,
};

/* BTF for bpf2go -type. */
const enum nccl_op *unused_nccl_op __attribute__((unused));

/* ncclDataType_t → element size. */
static __always_inline __u64 dtype_size(__u32 dt)
{
	switch (dt) {
	case 0:	 /* ncclInt8 */
	case 1:	 /* ncclUint8 */
	case 10: /* ncclFloat8e4m3 */
	case 11: /* ncclFloat8e5m2 */
		return 1;
	case 6: /* ncclFloat16 */
	case 9: /* ncclBfloat16 */
		return 2;
	case 2: /* ncclInt32 */
	case 3: /* ncclUint32 */
	case 7: /* ncclFloat32 */
		return 4;
	case 4: /* ncclInt64 */
	case 5: /* ncclUint64 */
	case 8: /* ncclFloat64 */
		return 8;
	}
	return 0;
}

SEC("uprobe")
int nccl_coll(struct pt_regs *ctx)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;

	__u32 op = bpf_get_attach_cookie(ctx) & 0xff;
	__u64 count = 0, comm = 0, stream = 0;
	__u32 dt = 0;
	__s32 peer = -1;
	switch (op) {
	case OP_ALL_REDUCE:	/* (send, recv, count, dt, redop, comm, stream) */
	case OP_REDUCE_SCATTER: /* (send, recv, recvcount, dt, redop, comm, stream) */
		count = PT_REGS_PARM3(ctx);
		dt = PT_REGS_PARM4(ctx);
		comm = PT_REGS_PARM6(ctx);
		stream = stack_arg(ctx, 7);
		break;
	case OP_ALL_GATHER: /* (send, recv, sendcount, dt, comm, stream) */
		count = PT_REGS_PARM3(ctx);
		dt = PT_REGS_PARM4(ctx);
		comm = PT_REGS_PARM5(ctx);
		stream = PT_REGS_PARM6(ctx);
		break;
	case OP_BROADCAST: /* (send, recv, count, dt, root, comm, stream) */
		count = PT_REGS_PARM3(ctx);
		dt = PT_REGS_PARM4(ctx);
		peer = PT_REGS_PARM5(ctx);
		comm = PT_REGS_PARM6(ctx);
		stream = stack_arg(ctx, 7);
		break;
	case OP_REDUCE: /* (send, recv, count, dt, redop, root, comm, stream) */
		count = PT_REGS_PARM3(ctx);
		dt = PT_REGS_PARM4(ctx);
		peer = PT_REGS_PARM6(ctx);
		comm = stack_arg(ctx, 7);
		stream = stack_arg(ctx, 8);
		break;
	case OP_SEND: /* (buf, count, dt, peer, comm, stream) */
	case OP_RECV:
		count = PT_REGS_PARM2(ctx);
		dt = PT_REGS_PARM3(ctx);
		peer = PT_REGS_PARM4(ctx);
		comm = PT_REGS_PARM5(ctx);
		stream = PT_REGS_PARM6(ctx);
		break;
	default:
		return 0;
	}

	struct thread_state *t = bpf_map_lookup_elem(&threads, &id);
	if (t && t->group_depth > 0)
		t->group_ops++;

	__u64 now = bpf_ktime_get_ns();
	struct nccl_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_NCCL, K_COLLECTIVE, id, now);
	e->start_ns = now;
	e->count = count;
	e->bytes = count * dtype_size(dt);
	e->comm = comm;
	e->stream = stream;
	e->peer = peer;
	e->op = op;
	e->datatype = dt;
	submit(e);
	return 0;
}

/* ncclCommInitRank(comm*, nranks, ncclUniqueId id, rank),
 * ncclCommInitRankConfig(comm*, nranks, id, rank, config) and
 * ncclCommInitRankScalable(comm*, nranks, rank, nId, ids*, config): the
 * 128-byte ncclUniqueId goes on the stack (System V: a MEMORY-class argument
 * takes no register), so the rank is in the third register for all three.
 * Once per communicator: it tells a comm stall's evidence who the peers are. */
SEC("uprobe")
int nccl_comm_init_enter(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter(&id);
	if (!t)
		return 0;
	t->init_commp = PT_REGS_PARM1(ctx);
	t->init_nranks = PT_REGS_PARM2(ctx);
	t->init_rank = PT_REGS_PARM3(ctx);
	return 0;
}

SEC("uretprobe")
int nccl_comm_init_exit(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter_ret(&id);
	if (!t || t->init_commp == 0)
		return 0;
	__u64 comm = 0;
	bpf_probe_read_user(&comm, sizeof(comm), (void *)t->init_commp);
	t->init_commp = 0;
	__u64 now = bpf_ktime_get_ns();
	struct nccl_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_NCCL, K_COMM_INIT, id, now);
	e->start_ns = now;
	e->count = t->init_nranks;
	e->comm = comm;
	e->peer = t->init_rank;
	e->ret = (__s32)PT_REGS_RC(ctx);
	submit(e);
	return 0;
}

SEC("uprobe")
int nccl_group_start(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter(&id);
	if (!t)
		return 0;
	if (t->group_depth++ == 0)
		t->group_ops = 0;
	return 0;
}

SEC("uprobe")
int nccl_group_end_enter(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter(&id);
	if (!t)
		return 0;
	t->group_start = bpf_ktime_get_ns();
	/* syscalls made while NCCL launches the group are explained by it */
	t->call_depth++;
	return 0;
}

SEC("uretprobe")
int nccl_group_end_exit(struct pt_regs *ctx)
{
	__u64 id;
	struct thread_state *t = enter_ret(&id);
	if (!t || t->group_start == 0)
		return 0;
	if (t->call_depth > 0)
		t->call_depth--;
	if (t->group_depth > 0)
		t->group_depth--;
	/* Only the outermost ncclGroupEnd launches the group. */
	if (t->group_depth > 0)
		return 0;

	__u64 now = bpf_ktime_get_ns();
	__u64 start = t->group_start;
	t->group_start = 0;
	struct nccl_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_NCCL, K_GROUP_END, id, now);
	e->start_ns = start;
	e->count = t->group_ops;
	e->peer = -1;
	e->ret = (__s32)PT_REGS_RC(ctx);
	submit(e);
	t->group_ops = 0;
	return 0;
}
