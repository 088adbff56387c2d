//go:build ignore

/*
 * nvml.c - the simulated NVML (libnvidia-ml.so.1).
 *
 * Exports exactly the entry points gaptrace's GPU source (gpusample) and
 * go-nvml's load path may call, with the signatures and struct layouts of
 * nvml.h, so that the sidecar runs its real dlopen + lazy-binding path in CI.
 * go-nvml binds lazily: a symbol missing here kills the calling process, so
 * the Go source looks up every optional entry point before its first call
 * and this file must export all of them.
 *
 * What the GPU reports is computed from the shared virtual timeline
 * (timeline.h) that the simulated libcuda in the trainer writes:
 *   - utilization samples (nvmlDeviceGetSamples, GPU_UTILIZATION_SAMPLES):
 *     one sample per SIMGPU_SAMPLE_MS (default 200 ms, as measured on the
 *     H200), at period boundaries of CLOCK_MONOTONIC, value = the
 *     percentage of the period during which a KERNEL or COLLECTIVE ran,
 *     timestamp = the boundary in CLOCK_REALTIME microseconds (the offset
 *     between the clocks is taken once at the first init so a sample's
 *     timestamp never changes between calls);
 *   - GPM (nvmlGpmSampleGet/nvmlGpmMetricsGet): counters refresh every
 *     SIMGPU_GPM_REFRESH_MS (default 100 ms, like the H200), shifted by
 *     SIMGPU_GPM_PHASE_MS; a sample snapshots the last refresh, so sampling
 *     faster than the refresh sees no change (all deltas zero). SM activity
 *     counts KERNEL time plus COLLECTIVE time x SIMGPU_NCCL_SM_FRACTION
 *     (default 0.05: a spinning NCCL kernel keeps few SMs busy);
 *   - memory used and the processes holding a context, from the timeline.
 *
 * Hardware state (defaults: an H200 on a Gen5 x16 link, no throttling, ECC
 * on, persistence on) can be changed by environment variables read at each
 * call (SIMGPU_PCIE_GEN, SIMGPU_PCIE_WIDTH, SIMGPU_THROTTLE (bit mask, hex
 * or decimal), SIMGPU_TEMP_C, SIMGPU_GPM=0 (no GPM), SIMGPU_NVML_INIT_RETURN
 * (nvmlReturn_t of init)) or, while a run is in progress, by a control file
 * $SIMGPU_DIR/gaptrace-simgpu-<dev>.hw of key=value lines (pcie_gen,
 * pcie_width, throttle, temp_c, ecc_mode, ecc_corrected, ecc_uncorrected,
 * persistence). An Xid is delivered to event sets by writing its code(s),
 * one per line, to $SIMGPU_DIR/gaptrace-simgpu-<dev>.xid (consumed on
 * delivery), or once by SIMGPU_XID=<code>[@<delay ms after init>].
 *
 * Build with -DSIMGPU_CHECK_NVML_H -DNVML_NO_UNVERSIONED_FUNC_DEFS -I<dir of
 * nvml.h> to check every definition against the official prototypes.
 *
 * This file holds the state, the helpers and the init, identity and
 * utilization-sample entry points; nvml_device.c the device queries (clocks,
 * PCIe, ECC, memory, processes, Xid events); nvml_gpm.c GPM.
 * nvml_internal.h declares what they share.
 */
#include "nvml_internal.h"

static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
int sim_refs;
int sim_ndev;
static int64_t sim_real_minus_mono_ns; /* fixed at the first init */
uint64_t sim_init_mono_ns;
struct nvmlDevice_st sim_devs[SIM_MAX_DEVICES];

uint64_t now_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

long env_long(const char *name, long def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	errno = 0;
	long x = strtol(v, &end, 0);
	if (errno || end == v)
		return def;
	return x;
}

double env_double(const char *name, double def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	double x = strtod(v, &end);
	return end == v ? def : x;
}

const char *sim_dir(void)
{
	const char *d = getenv("SIMGPU_DIR");
	return d && *d ? d : "/dev/shm";
}

static uint64_t sample_period_ns(void)
{
	long ms = env_long("SIMGPU_SAMPLE_MS", 200);
	return (uint64_t)(ms > 0 ? ms : 200) * 1000000ull;
}

uint64_t gpm_refresh_ns(void)
{
	long ms = env_long("SIMGPU_GPM_REFRESH_MS", 100);
	return (uint64_t)(ms > 0 ? ms : 100) * 1000000ull;
}

struct nvmlDevice_st *dev_of(nvmlDevice_t d)
{
	struct nvmlDevice_st *p = d.handle;
	if (!p || p < &sim_devs[0] || p >= &sim_devs[SIM_MAX_DEVICES] || p->index >= sim_ndev)
		return NULL;
	return p;
}

/* The timeline file appears when the trainer starts: open it lazily, never
 * create it (an idle GPU simply has no busy intervals). */
struct simgpu_timeline *timeline_of(struct nvmlDevice_st *d)
{
	pthread_mutex_lock(&sim_mu);
	if (!d->tl)
		d->tl = simgpu_timeline_open(d->index, 0);
	struct simgpu_timeline *t = d->tl;
	pthread_mutex_unlock(&sim_mu);
	return t;
}

uint64_t busy(struct nvmlDevice_st *d, uint64_t a, uint64_t b, uint32_t mask)
{
	struct simgpu_timeline *t = timeline_of(d);
	if (!t || b <= a)
		return 0;
	return simgpu_timeline_busy_ns(t, a, b, mask);
}

void read_hwstate(int dev, struct hwstate *hw)
{
	hw->pcie_gen = (unsigned)env_long("SIMGPU_PCIE_GEN", 5);
	hw->pcie_width = (unsigned)env_long("SIMGPU_PCIE_WIDTH", 16);
	hw->temp_c = (unsigned)env_long("SIMGPU_TEMP_C", 41);
	hw->throttle = (unsigned long long)env_long("SIMGPU_THROTTLE", 0);
	hw->ecc_mode = 1;
	hw->persistence = 1;
	hw->ecc_corrected = 0;
	hw->ecc_uncorrected = 0;

	char path[4096];
	snprintf(path, sizeof(path), "%s/gaptrace-simgpu-%d.hw", sim_dir(), dev);
	FILE *f = fopen(path, "re");
	if (!f)
		return;
	char line[256];
	while (fgets(line, sizeof(line), f)) {
		char key[64];
		char val[64];
		if (sscanf(line, " %63[a-z_] = %63s", key, val) != 2)
			continue;
		unsigned long long x = strtoull(val, NULL, 0);
		if (!strcmp(key, "pcie_gen"))
			hw->pcie_gen = (unsigned)x;
		else if (!strcmp(key, "pcie_width"))
			hw->pcie_width = (unsigned)x;
		else if (!strcmp(key, "temp_c"))
			hw->temp_c = (unsigned)x;
		else if (!strcmp(key, "throttle"))
			hw->throttle = x;
		else if (!strcmp(key, "ecc_mode"))
			hw->ecc_mode = (int)x;
		else if (!strcmp(key, "persistence"))
			hw->persistence = (int)x;
		else if (!strcmp(key, "ecc_corrected"))
			hw->ecc_corrected = x;
		else if (!strcmp(key, "ecc_uncorrected"))
			hw->ecc_uncorrected = x;
	}
	fclose(f);
}

static void copy_str(char *dst, unsigned int len, const char *src)
{
	snprintf(dst, len, "%s", src);
}

/* ---- init / system ---- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	long forced = env_long("SIMGPU_NVML_INIT_RETURN", 0);
	if (forced != 0)
		return (nvmlReturn_t)forced;
	pthread_mutex_lock(&sim_mu);
	if (sim_refs == 0) {
		int n = simgpu_device_count();
		sim_ndev = n < 0 ? 0 : (n > SIM_MAX_DEVICES ? SIM_MAX_DEVICES : n);
		if (sim_real_minus_mono_ns == 0) {
			sim_init_mono_ns = now_ns(CLOCK_MONOTONIC);
			sim_real_minus_mono_ns = (int64_t)(now_ns(CLOCK_REALTIME) - sim_init_mono_ns);
		}
		for (int i = 0; i < SIM_MAX_DEVICES; i++)
			sim_devs[i].index = i;
	}
	sim_refs++;
	pthread_mutex_unlock(&sim_mu);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
	pthread_mutex_lock(&sim_mu);
	if (sim_refs <= 0) {
		pthread_mutex_unlock(&sim_mu);
		return NVML_ERROR_UNINITIALIZED;
	}
	if (--sim_refs == 0) {
		for (int i = 0; i < SIM_MAX_DEVICES; i++) {
			if (sim_devs[i].tl)
				simgpu_timeline_close(sim_devs[i].tl);
			sim_devs[i].tl = NULL;
		}
	}
	pthread_mutex_unlock(&sim_mu);
	return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
	case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_NO_DATA: return "No data";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
	case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
	default: return "Unknown Error";
	}
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	CHECK_INIT();
	if (!version)
		return NVML_ERROR_INVALID_ARGUMENT;
	copy_str(version, length, "simgpu-1.0");
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
	CHECK_INIT();
	if (!deviceCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	*deviceCount = (unsigned)sim_ndev;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	CHECK_INIT();
	if (!device || index >= (unsigned)sim_ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	device->handle = &sim_devs[index];
	return NVML_SUCCESS;
}

/* ---- identity ---- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	GET_DEV(d, device);
	if (!name)
		return NVML_ERROR_INVALID_ARGUMENT;
	copy_str(name, length, "Simulated H200");
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	GET_DEV(d, device);
	if (!uuid)
		return NVML_ERROR_INVALID_ARGUMENT;
	char buf[96];
	snprintf(buf, sizeof(buf), "GPU-5133a7e0-0000-4000-8000-%012x", (unsigned)d->index);
	copy_str(uuid, length, buf);
	return NVML_SUCCESS;
}

/* ---- utilization samples ---- */

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
					 unsigned long long lastSeenTimeStamp,
					 nvmlValueType_t *sampleValType, unsigned int *sampleCount,
					 nvmlSample_t *samples)
{
	GET_DEV(d, device);
	if (!sampleValType || !sampleCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (type != NVML_GPU_UTILIZATION_SAMPLES)
		return NVML_ERROR_NOT_SUPPORTED;
	*sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
	if (!samples) {
		/* Size query: the driver answers with its buffer size. */
		*sampleCount = SIM_SAMPLE_BUFFER;
		return NVML_SUCCESS;
	}

	uint64_t p = sample_period_ns();
	uint64_t now = now_ns(CLOCK_MONOTONIC);
	/* Boundaries k*p (monotonic); a sample exists once its period ended and
	 * only after the library was first initialised (the driver keeps no
	 * history from before its own start). */
	uint64_t last_k = now / p;
	uint64_t first_k = sim_init_mono_ns / p + 1;
	if (last_k + 1 > SIM_SAMPLE_BUFFER && last_k + 1 - SIM_SAMPLE_BUFFER > first_k)
		first_k = last_k + 1 - SIM_SAMPLE_BUFFER;
	if (lastSeenTimeStamp) {
		/* first boundary whose realtime-µs stamp is > lastSeenTimeStamp */
		int64_t seen_mono = (int64_t)lastSeenTimeStamp * 1000 - sim_real_minus_mono_ns;
		uint64_t k = seen_mono < 0 ? 0 : (uint64_t)seen_mono / p;
		while (((int64_t)(k * p) + sim_real_minus_mono_ns) / 1000 <= (int64_t)lastSeenTimeStamp)
			k++;
		if (k > first_k)
			first_k = k;
	}
	if (first_k > last_k) {
		*sampleCount = 0;
		return NVML_ERROR_NOT_FOUND; /* like the driver: no sample newer than lastSeen */
	}
	uint64_t n = last_k - first_k + 1;
	if (n > *sampleCount)
		first_k = last_k + 1 - *sampleCount, n = *sampleCount;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t k = first_k + i;
		uint64_t end = k * p, start = end - p;
		uint64_t b = busy(d, start, end, SIMGPU_KIND_KERNEL | SIMGPU_KIND_COLLECTIVE);
		samples[i].timeStamp = (unsigned long long)(((int64_t)end + sim_real_minus_mono_ns) / 1000);
		samples[i].sampleValue.uiVal = (unsigned)((b * 100 + p / 2) / p);
	}
	*sampleCount = (unsigned)n;
	return NVML_SUCCESS;
}

