//go:build ignore

/*
 * simtrain_stall.c - the host stalls simtrain injects on its main thread,
 * each recorded in the ground truth with the cause gaptrace should name.
 */
#include "simtrain.h"

/* Room for a stall record's cause-specific fields. */
#define EXTRA_LEN 4608

void reader_open(struct reader *r)
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

uint64_t read_cold_until(struct reader *r, uint64_t deadline)
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
uint64_t pending_comm_delay_ns;
const char *pending_comm_name;

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
/* cpu.contention: move to the hog's CPU (the old mask saved in oldset),
 * before the stall's time starts. */
static void pin_beside_hog(cpu_set_t *oldset)
{
	sched_getaffinity(0, sizeof(*oldset), oldset);
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(hog_cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		die("pin to CPU %d: %s", hog_cpu, strerror(errno));
	atomic_store(&hog->done, 0);
	/* Migrate before measuring. */
	sched_yield();
}

/* lock: wait until the holder has the mutex for ms_ns: handing it the
 * request and its wake-up are not the lock's time. */
static void await_lock_holder(uint64_t ms_ns)
{
	atomic_store(&lock_acquired, 0);
	if (write(lock_req_w, &ms_ns, sizeof(ms_ns)) != (ssize_t)sizeof(ms_ns))
		die("wake lock holder: %s", strerror(errno));
	while (atomic_load(&lock_acquired) == 0)
		sched_yield();
}

/* io.write: chunks written and synced to the checkpoint file until deadline. */
static void stall_io_write(uint64_t deadline, char *extra)
{
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
	snprintf(extra, EXTRA_LEN, ",\"path\":\"%s\",\"bytes\":%llu", ckpt_path,
		 (unsigned long long)b);
}

/* loader.wait: a request to the next worker, and the wait for its reply. */
static void stall_loader(const struct stall *st, uint64_t deadline, char *extra)
{
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
	snprintf(extra, EXTRA_LEN,
		 ",\"worker\":%d,\"worker_did\":\"%s\",\"bytes\":%llu,"
		 "\"worker_run_delay_ns\":%llu",
		 (int)w->pid, q.kind == 1 ? "io" : "cpu", (unsigned long long)got.bytes,
		 (unsigned long long)got.run_delay_ns);
}

/* cuda.alloc: an allocation the driver makes ms_ns slow, and its free. */
static void stall_alloc(uint64_t ms_ns, long step, uint64_t *start, uint64_t *fixed_end, char *extra)
{
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
	*start = s;
	*fixed_end = e;
	snprintf(extra, EXTRA_LEN, ",\"bytes\":%zu", bytes);
}

/* pageable: an async copy from pageable memory, which the host stages. */
static void stall_pageable(uint64_t ms_ns, long step, uint64_t *start, uint64_t *fixed_end, char *extra)
{
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
	*start = s;
	*fixed_end = e;
	snprintf(extra, EXTRA_LEN, ",\"kind\":\"pageable\",\"bytes\":%zu,\"direction\":\"htod\"",
		 bytes);
}

/* checkpoint: torch.save of a CUDA state_dict, tensor by tensor. */
static void stall_checkpoint(uint64_t ms_ns, uint64_t start, char *extra)
{
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
	snprintf(extra, EXTRA_LEN,
		 ",\"kind\":\"checkpoint\",\"path\":\"%s\",\"tensors\":%d,\"bytes\":%llu",
		 state_path, CKPT_TENSORS, (unsigned long long)CKPT_TENSORS * CKPT_TENSOR_BYTES);
}

void run_stall(const struct stall *st, long step)
{
	uint64_t ms_ns = (uint64_t)st->ms * 1000000ull;
	char extra[EXTRA_LEN] = "";
	cpu_set_t oldset;

	/* Preparation that must not count as stall time. */
	if (st->c == C_CPU_CONTENTION)
		pin_beside_hog(&oldset);
	if (st->c == C_COMM) {
		/* Applied to the step's last collective; the stall is the wait in the final sync. */
		pending_comm_delay_ns = ms_ns;
		pending_comm_name = st->name;
		return;
	}

	if (st->c == C_LOCK)
		await_lock_holder(ms_ns);

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
	case C_IO_WRITE:
		stall_io_write(deadline, extra);
		break;
	case C_NET:
		net_request(st->ms, st->poll);
		snprintf(extra, sizeof(extra), ",\"peer\":\"%s\",\"server_pid\":%d,\"via\":\"%s\"",
			 opt.server ? opt.server : server_addr, opt.server ? 0 : (int)logsrv_pid,
			 st->poll ? "poll" : "recv");
		break;
	case C_LOADER_IO:
	case C_LOADER_CPU:
		stall_loader(st, deadline, extra);
		break;
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
	case C_CUDA_ALLOC:
		stall_alloc(ms_ns, step, &start, &fixed_end, extra);
		break;
	case C_PAGEABLE:
		stall_pageable(ms_ns, step, &start, &fixed_end, extra);
		break;
	case C_CHECKPOINT:
		stall_checkpoint(ms_ns, start, extra);
		break;
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

