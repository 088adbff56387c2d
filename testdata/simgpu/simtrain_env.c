//go:build ignore

/*
 * simtrain_env.c - what simtrain's stalls need around the trainer: the data
 * files of the I/O stalls and the child processes (data-loader workers, the
 * log server, the CPU hog) and the lock holder thread.
 */
#include "simtrain.h"

/* ------------------------------------------------------------------ */
/* Files for the I/O stalls                                            */

char data_dir[4096];
static int data_dir_is_temp;
char data_path[4200];
char ckpt_path[4200];
char state_path[4200]; /* the checkpoint stall's file */

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

void create_data_file(void)
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

/* Opens (or creates) the data directory and names the stalls' files in it. */
void open_data_dir(void)
{
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
}

/* ------------------------------------------------------------------ */
/* Child processes: data-loader workers, log server, contention helper */

struct worker workers[MAX_WORKERS];
int nworkers, next_worker;

static void child_setup(const char *name)
{
	prctl(PR_SET_NAME, name, 0, 0, 0);
	/* Never outlive the trainer, even if it is killed. */
	prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_DFL);
}

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

void start_workers(void)
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

pid_t logsrv_pid;
char server_addr[128];

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

void start_logsrv(void)
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
struct hog_shared *hog;
pid_t hog_pid;
int hog_req_w;
int hog_cpu;

void start_hog(void)
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
pthread_mutex_t lock_mu = PTHREAD_MUTEX_INITIALIZER;
int lock_req_w = -1;
_Atomic uint64_t lock_acquired; /* CLOCK_MONOTONIC when the holder took the mutex */
_Atomic int lock_holder_tid;

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

void start_lock_holder(void)
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
int schedstat_fd = -1;

uint64_t thread_run_delay_ns(void)
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

void stop_children(void)
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

