//go:build ignore

/*
 * timeline.c - shared virtual GPU timeline (see timeline.h).
 *
 * Layout of the file gaptrace-simgpu-<dev>: a header page followed by a ring
 * of SIMGPU_RING entries. Writers (the simulated libcuda in any process)
 * serialize on a process-shared spinlock in the header; readers (the
 * simulated NVML) never take it.
 *
 * Invariants that make lock-free reading correct:
 *  - head counts entries ever published; entry i lives in slot i % SIMGPU_RING.
 *  - A slot's idx field is set to SLOT_BUSY before the slot's fields are
 *    rewritten and to i (release) after. A reader that sees the same idx == i
 *    before and after copying the fields has a consistent copy of entry i.
 *  - Only the newest entry (head-1) is modified after publication, and only
 *    by widening it (start moves down, end moves up), so any mix of old and
 *    new start/end a reader observes is a valid busy interval.
 *  - maxend is the maximum end over entries 0..i (a prefix maximum), so a
 *    reader scanning backwards stops as soon as maxend < a: nothing older can
 *    overlap the query window.
 */
#define _GNU_SOURCE
#include "timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIMGPU_MAGIC    0x5550474d49534147ull /* "GASIMGPU" */
#define SIMGPU_VERSION  1u
#define SIMGPU_RING     (1u << 18)
#define SIMGPU_MAX_PIDS 64
#define SLOT_BUSY       UINT64_MAX
#define HDR_SIZE        4096

struct tl_pid {
	_Atomic uint32_t pid; /* 0 = free */
	uint32_t pad;
	_Atomic uint64_t mem_bytes;
};

struct tl_hdr {
	_Atomic uint64_t magic; /* written last during initialization */
	uint32_t version;
	uint32_t ring;
	_Atomic uint32_t lock; /* 0 = free, else pid of the holder */
	uint32_t pad;
	_Atomic uint64_t head;
	struct tl_pid pids[SIMGPU_MAX_PIDS];
};

_Static_assert(sizeof(struct tl_hdr) <= HDR_SIZE, "header must fit its page");

struct tl_entry {
	_Atomic uint64_t idx;
	_Atomic uint64_t start;
	_Atomic uint64_t end;
	_Atomic uint64_t maxend;
	uint32_t kind;
	uint32_t stream;
};

struct simgpu_timeline {
	struct tl_hdr *hdr;
	struct tl_entry *ring;
	size_t map_len;
	int writable;
};

static size_t map_size(void)
{
	return HDR_SIZE + (size_t)SIMGPU_RING * sizeof(struct tl_entry);
}

static void tl_path(int dev, char *buf, size_t len)
{
	const char *dir = getenv("SIMGPU_DIR");
	if (dir == NULL || dir[0] == '\0')
		dir = "/dev/shm";
	snprintf(buf, len, "%s/gaptrace-simgpu-%d", dir, dev);
}

static int pid_alive(uint32_t pid)
{
	return pid != 0 && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

/*
 * The lock word holds the holder's pid so that a writer killed inside the
 * (tiny) critical section cannot wedge every other process forever: after
 * spinning a while, a waiter checks whether the holder still exists and
 * steals the lock if it does not.
 */
static void tl_lock(struct tl_hdr *h)
{
	uint32_t self = (uint32_t)getpid();
	for (unsigned spins = 0;; spins++) {
		uint32_t expect = 0;
		if (atomic_compare_exchange_weak_explicit(&h->lock, &expect, self,
							  memory_order_acquire, memory_order_relaxed))
			return;
		if (spins > 0 && spins % 4096 == 0) {
			if (expect != 0 && expect != self && !pid_alive(expect))
				atomic_compare_exchange_strong(&h->lock, &expect, 0);
			sched_yield();
		}
	}
}

static void tl_unlock(struct tl_hdr *h)
{
	atomic_store_explicit(&h->lock, 0, memory_order_release);
}

struct simgpu_timeline *simgpu_timeline_open(int dev, int create)
{
	char path[4096];
	tl_path(dev, path, sizeof(path));

	int writable = 1;
	int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
	if (fd < 0 && !create && (errno == EACCES || errno == EROFS)) {
		writable = 0;
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0)
		return NULL;

	size_t len = map_size();
	if (writable) {
		/* flock serializes initialization between racing creators. */
		if (flock(fd, LOCK_EX) != 0)
			goto fail;
		struct stat st;
		if (fstat(fd, &st) != 0)
			goto fail_unlock;
		if ((size_t)st.st_size < len) {
			if (!create)
				goto fail_unlock;
			if (ftruncate(fd, (off_t)len) != 0)
				goto fail_unlock;
		}
		if (create)
			(void)fchmod(fd, 0666); /* reader may run as another user */
	}

	void *m = mmap(NULL, len, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		goto fail_unlock;
	struct tl_hdr *h = m;
	uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
	if (magic != SIMGPU_MAGIC || h->version != SIMGPU_VERSION || h->ring != SIMGPU_RING) {
		if (!create || !writable) {
			munmap(m, len);
			goto fail_unlock;
		}
		/* Fresh or incompatible file: (re)initialize it. */
		memset(m, 0, HDR_SIZE);
		h->version = SIMGPU_VERSION;
		h->ring = SIMGPU_RING;
		struct tl_entry *r = (struct tl_entry *)((char *)m + HDR_SIZE);
		for (uint32_t i = 0; i < SIMGPU_RING; i++)
			atomic_store_explicit(&r[i].idx, SLOT_BUSY, memory_order_relaxed);
		atomic_store_explicit(&h->magic, SIMGPU_MAGIC, memory_order_release);
	}
	if (writable)
		flock(fd, LOCK_UN);
	close(fd);

	struct simgpu_timeline *t = calloc(1, sizeof(*t));
	if (t == NULL) {
		munmap(m, len);
		return NULL;
	}
	t->hdr = h;
	t->ring = (struct tl_entry *)((char *)m + HDR_SIZE);
	t->map_len = len;
	t->writable = writable;
	return t;

fail_unlock:
	if (writable)
		flock(fd, LOCK_UN);
fail:
	close(fd);
	return NULL;
}

void simgpu_timeline_close(struct simgpu_timeline *t)
{
	if (t == NULL)
		return;
	munmap(t->hdr, t->map_len);
	free(t);
}

void simgpu_timeline_add(struct simgpu_timeline *t, uint64_t start_ns, uint64_t end_ns,
			 uint32_t kind, uint32_t stream)
{
	if (t == NULL || !t->writable || end_ns <= start_ns)
		return;
	struct tl_hdr *h = t->hdr;
	tl_lock(h);
	uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
	if (head > 0) {
		struct tl_entry *p = &t->ring[(head - 1) % SIMGPU_RING];
		uint64_t ps = atomic_load_explicit(&p->start, memory_order_relaxed);
		uint64_t pe = atomic_load_explicit(&p->end, memory_order_relaxed);
		if (p->kind == kind && start_ns <= pe && end_ns >= ps) {
			/* Widen only: see the invariants at the top of the file. */
			if (start_ns < ps)
				atomic_store_explicit(&p->start, start_ns, memory_order_release);
			if (end_ns > pe) {
				atomic_store_explicit(&p->end, end_ns, memory_order_release);
				uint64_t me = atomic_load_explicit(&p->maxend, memory_order_relaxed);
				if (end_ns > me)
					atomic_store_explicit(&p->maxend, end_ns, memory_order_release);
			}
			if (p->stream != stream)
				p->stream = UINT32_MAX; /* merged across streams */
			tl_unlock(h);
			return;
		}
	}
	uint64_t maxend = end_ns;
	if (head > 0) {
		uint64_t pm = atomic_load_explicit(&t->ring[(head - 1) % SIMGPU_RING].maxend,
						   memory_order_relaxed);
		if (pm > maxend)
			maxend = pm;
	}
	struct tl_entry *e = &t->ring[head % SIMGPU_RING];
	atomic_store_explicit(&e->idx, SLOT_BUSY, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&e->start, start_ns, memory_order_relaxed);
	atomic_store_explicit(&e->end, end_ns, memory_order_relaxed);
	atomic_store_explicit(&e->maxend, maxend, memory_order_relaxed);
	e->kind = kind;
	e->stream = stream;
	atomic_store_explicit(&e->idx, head, memory_order_release);
	atomic_store_explicit(&h->head, head + 1, memory_order_release);
	tl_unlock(h);
}

struct span {
	uint64_t s, e;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	return x->s < y->s ? -1 : x->s > y->s;
}

uint64_t simgpu_timeline_busy_ns(struct simgpu_timeline *t, uint64_t a, uint64_t b,
				 uint32_t kind_mask)
{
	if (t == NULL || b <= a)
		return 0;
	size_t cap = 256, n = 0;
	struct span *v = malloc(cap * sizeof(*v));
	if (v == NULL)
		return 0;

	uint64_t head = atomic_load_explicit(&t->hdr->head, memory_order_acquire);
	uint64_t lo = head > SIMGPU_RING ? head - SIMGPU_RING : 0;
	for (uint64_t i = head; i > lo; i--) {
		uint64_t idx = i - 1;
		struct tl_entry *e = &t->ring[idx % SIMGPU_RING];
		if (atomic_load_explicit(&e->idx, memory_order_acquire) != idx)
			break; /* overwritten by wraparound: older history is gone */
		uint64_t s = atomic_load_explicit(&e->start, memory_order_acquire);
		uint64_t en = atomic_load_explicit(&e->end, memory_order_acquire);
		uint64_t me = atomic_load_explicit(&e->maxend, memory_order_acquire);
		uint32_t kind = e->kind;
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&e->idx, memory_order_relaxed) != idx)
			break;
		if (me < a)
			break; /* prefix maximum: no older entry reaches the window */
		if (!(kind & kind_mask) || en <= a || s >= b)
			continue;
		if (n == cap) {
			struct span *nv = realloc(v, 2 * cap * sizeof(*v));
			if (nv == NULL)
				break;
			v = nv;
			cap *= 2;
		}
		v[n].s = s < a ? a : s;
		v[n].e = en > b ? b : en;
		n++;
	}

	qsort(v, n, sizeof(*v), span_cmp);
	uint64_t busy = 0, cs = 0, ce = 0;
	for (size_t i = 0; i < n; i++) {
		if (ce == 0 || v[i].s > ce) {
			busy += ce - cs;
			cs = v[i].s;
			ce = v[i].e;
		} else if (v[i].e > ce) {
			ce = v[i].e;
		}
	}
	busy += ce - cs;
	free(v);
	return busy;
}

void simgpu_timeline_register_pid(struct simgpu_timeline *t, uint32_t pid, uint64_t mem_bytes)
{
	if (t == NULL || !t->writable || pid == 0)
		return;
	struct tl_hdr *h = t->hdr;
	tl_lock(h);
	int free_slot = -1;
	for (int i = 0; i < SIMGPU_MAX_PIDS; i++) {
		uint32_t p = atomic_load_explicit(&h->pids[i].pid, memory_order_relaxed);
		if (p == pid) {
			atomic_store_explicit(&h->pids[i].mem_bytes, mem_bytes, memory_order_relaxed);
			tl_unlock(h);
			return;
		}
		if (free_slot < 0 && (p == 0 || !pid_alive(p)))
			free_slot = i;
	}
	if (free_slot >= 0) {
		atomic_store_explicit(&h->pids[free_slot].mem_bytes, mem_bytes, memory_order_relaxed);
		atomic_store_explicit(&h->pids[free_slot].pid, pid, memory_order_release);
	}
	tl_unlock(h);
}

int simgpu_timeline_pids(struct simgpu_timeline *t, uint32_t *pids, int max)
{
	if (t == NULL)
		return 0;
	struct tl_hdr *h = t->hdr;
	int n = 0;
	for (int i = 0; i < SIMGPU_MAX_PIDS; i++) {
		uint32_t p = atomic_load_explicit(&h->pids[i].pid, memory_order_acquire);
		if (p == 0)
			continue;
		if (!pid_alive(p)) {
			/* Prune so a crashed trainer does not hold a context forever. */
			if (t->writable)
				atomic_compare_exchange_strong(&h->pids[i].pid, &p, 0);
			continue;
		}
		if (n < max && pids != NULL)
			pids[n] = p;
		n++;
	}
	return n < max || pids == NULL ? n : max;
}

uint64_t simgpu_timeline_mem_used(struct simgpu_timeline *t)
{
	if (t == NULL)
		return 0;
	uint64_t sum = 0;
	for (int i = 0; i < SIMGPU_MAX_PIDS; i++) {
		uint32_t p = atomic_load_explicit(&t->hdr->pids[i].pid, memory_order_acquire);
		if (p != 0 && pid_alive(p))
			sum += atomic_load_explicit(&t->hdr->pids[i].mem_bytes, memory_order_relaxed);
	}
	return sum;
}

int simgpu_device_count(void)
{
	const char *s = getenv("SIMGPU_DEVICES");
	if (s == NULL || s[0] == '\0')
		return 1;
	char *end;
	long n = strtol(s, &end, 10);
	if (*end != '\0' || n < 1)
		return 1;
	return n > 64 ? 64 : (int)n;
}
