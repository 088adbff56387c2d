/* dlopen fixture: waits for a line on stdin, then loads the CUDA driver
 * given as argv[1] with dlopen (as PyTorch does) and calls
 * cuCtxSynchronize until killed. The tracer must notice the new mapping and
 * attach its probes without being told. */
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

typedef int (*ctx_sync_fn)(void);
typedef int (*init_fn)(unsigned int);

int main(int argc, char **argv)
{
	char line[16];
	if (argc != 2 || fgets(line, sizeof(line), stdin) == NULL)
		return 2;
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	init_fn init = (init_fn)dlsym(h, "cuInit");
	ctx_sync_fn sync = (ctx_sync_fn)dlsym(h, "cuCtxSynchronize");
	if (init == NULL || sync == NULL)
		return 1;
	init(0);
	struct timespec ts = {0, 1000000};
	for (;;) {
		sync();
		nanosleep(&ts, NULL);
	}
}
