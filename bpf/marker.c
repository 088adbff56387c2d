//go:build ignore

/* Framework step markers.
 *
 * PyTorch wraps every optimizer step in record_function("Optimizer.step#
 * <Class>.step") even with the profiler off, and the profiler's schedule
 * names each iteration "ProfilerStep#N"; both enter
 * torch::autograd::profiler::record_function_enter_new(std::string const&,
 * std::optional<std::string> const&). One uprobe there reads the name (a
 * libstdc++ std::string: char* at offset 0, length at offset 8), keeps the
 * two prefixes and drops every other region in the kernel. Cost: one trap
 * per record_function call; with the profiler off that is one per optimizer
 * step plus the user's own regions.
 */
#include "common.h"

#define MARKER_NAME_LEN 64

/* marker_event.marker: which marker the name starts with. */
enum marker_kind {
	MARKER_OPTIMIZER_STEP = 1,
	MARKER_PROFILER_STEP = 2,
};

/* EV_MARKER: a framework marker entered (point event). */
struct marker_event {
	struct event_hdr hdr;
	__u32 marker;	/* enum marker_kind */
	__u32 len;	/* bytes of name used (<= MARKER_NAME_LEN) */
	char name[MARKER_NAME_LEN]; /* the name's first bytes, not terminated */
};

/* BTF for bpf2go -type. */
const enum marker_kind *unused_marker_kind __attribute__((unused));
const struct marker_event *unused_marker_event __attribute__((unused));
const enum event_type *unused_marker_event_type __attribute__((unused));
const enum event_kind *unused_marker_event_kind __attribute__((unused));

/* The prefixes as little-endian words: the name's first 16 bytes are
 * compared as two, masked to the prefix's length. */
#define W8(a, b, c, d, e, f, g, h)                                                                 \
	((__u64)(a) | (__u64)(b) << 8 | (__u64)(c) << 16 | (__u64)(d) << 24 | (__u64)(e) << 32 |   \
	 (__u64)(f) << 40 | (__u64)(g) << 48 | (__u64)(h) << 56)
#define OPTIMIZER_PREFIX_LEN 15 /* "Optimizer.step#" */
#define OPTIMIZER_W0	     W8('O', 'p', 't', 'i', 'm', 'i', 'z', 'e')
#define OPTIMIZER_W1	     W8('r', '.', 's', 't', 'e', 'p', '#', 0)
#define OPTIMIZER_M1	     0x00ffffffffffffffULL
#define PROFILER_PREFIX_LEN  13 /* "ProfilerStep#" */
#define PROFILER_W0	     W8('P', 'r', 'o', 'f', 'i', 'l', 'e', 'r')
#define PROFILER_W1	     W8('S', 't', 'e', 'p', '#', 0, 0, 0)
#define PROFILER_M1	     0x000000ffffffffffULL

SEC("uprobe")
int marker_enter(struct pt_regs *ctx)
{
	__u64 id;
	if (!enter_traced(&id))
		return 0;
	struct {
		__u64 ptr;
		__u64 len;
	} str = {};
	/* The function returns a c10::intrusive_ptr, which is not trivially
	 * copyable: the Itanium C++ ABI passes the return slot's address
	 * first (rdi), so the name is the second argument. */
	if (bpf_probe_read_user(&str, sizeof(str), (void *)PT_REGS_PARM2(ctx)) != 0)
		return 0;
	/* Shorter than either prefix, or absurd: not a marker. */
	if (str.len < PROFILER_PREFIX_LEN || str.len > 4096 || str.ptr == 0)
		return 0;
	/* 16 bytes: at least 13 are the string's, the rest its terminator
	 * and whatever follows in the same buffer (masked off below). */
	__u64 head[2] = {};
	if (bpf_probe_read_user(head, sizeof(head), (void *)str.ptr) != 0)
		return 0;
	__u32 kind;
	if (str.len >= OPTIMIZER_PREFIX_LEN && head[0] == OPTIMIZER_W0 &&
	    (head[1] & OPTIMIZER_M1) == OPTIMIZER_W1)
		kind = MARKER_OPTIMIZER_STEP;
	else if (head[0] == PROFILER_W0 && (head[1] & PROFILER_M1) == PROFILER_W1)
		kind = MARKER_PROFILER_STEP;
	else
		return 0;
	struct marker_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	hdr_fill(&e->hdr, EV_MARKER, K_MARKER, id, bpf_ktime_get_ns());
	__u32 n = str.len > MARKER_NAME_LEN ? MARKER_NAME_LEN : (__u32)str.len;
	e->marker = kind;
	e->len = n;
	if (bpf_probe_read_user(e->name, n, (void *)str.ptr) != 0)
		e->len = 0;
	submit(e);
	return 0;
}
