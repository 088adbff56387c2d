//go:build ignore

/*
 * simtrain_truth.c - simtrain's ground truth: JSON Lines records of steps,
 * stalls, driver calls and the device's busy intervals, written by a
 * background thread.
 */
#include "simtrain.h"

/* ------------------------------------------------------------------ */
/* Ground truth                                                        */

struct sbuf truth_buf;
FILE *truth_f;

void bprintf(struct sbuf *b, const char *fmt, ...)
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
uint64_t comm_capture_start; /* GPU start of the delayed collective */
int comm_capture;

void on_busy(void *arg, int dev, uint64_t s, uint64_t e, uint32_t kind, uint32_t stream)
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

void truth_flush(void)
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

void truth_close(void)
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

void truth_call(const char *what, const char *api, long step, uint64_t s, uint64_t e,
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

/* The truth's first record: the run's configuration. */
void write_meta(void)
{
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
