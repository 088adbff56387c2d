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
 * nvml.h> to check every definition below against the official prototypes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "timeline.h"

#define EXPORT __attribute__((visibility("default")))

#ifdef SIMGPU_CHECK_NVML_H
#include "nvml.h"
#else
/* ---- the subset of nvml.h this library implements (same layouts) ---- */
typedef enum nvmlReturn_enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NO_PERMISSION = 4,
	NVML_ERROR_ALREADY_INITIALIZED = 5,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_INSUFFICIENT_POWER = 8,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_IRQ_ISSUE = 11,
	NVML_ERROR_LIBRARY_NOT_FOUND = 12,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
	NVML_ERROR_CORRUPTED_INFOROM = 14,
	NVML_ERROR_GPU_IS_LOST = 15,
	NVML_ERROR_RESET_REQUIRED = 16,
	NVML_ERROR_OPERATING_SYSTEM = 17,
	NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
	NVML_ERROR_IN_USE = 19,
	NVML_ERROR_MEMORY = 20,
	NVML_ERROR_NO_DATA = 21,
	NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
	NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
	NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_DEPRECATED = 26,
	NVML_ERROR_NOT_READY = 27,
	NVML_ERROR_GPU_NOT_FOUND = 28,
	NVML_ERROR_INVALID_STATE = 29,
	NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct {
	struct nvmlDevice_st *handle;
} nvmlDevice_t;
typedef struct {
	struct nvmlEventSet_st *handle;
} nvmlEventSet_t;
typedef struct {
	struct nvmlGpmSample_st *handle;
} nvmlGpmSample_t;

typedef enum nvmlEnableState_enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;
typedef enum nvmlClockType_enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 } nvmlClockType_t;
typedef enum nvmlTemperatureSensors_enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
typedef enum nvmlTemperatureThresholds_enum {
	NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0,
	NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1,
	NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2,
	NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3,
} nvmlTemperatureThresholds_t;
typedef enum nvmlMemoryErrorType_enum {
	NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
	NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1,
} nvmlMemoryErrorType_t;
typedef enum nvmlEccCounterType_enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 } nvmlEccCounterType_t;
typedef enum nvmlSamplingType_enum {
	NVML_TOTAL_POWER_SAMPLES = 0,
	NVML_GPU_UTILIZATION_SAMPLES = 1,
} nvmlSamplingType_t;
typedef enum nvmlValueType_enum {
	NVML_VALUE_TYPE_DOUBLE = 0,
	NVML_VALUE_TYPE_UNSIGNED_INT = 1,
} nvmlValueType_t;

typedef union nvmlValue_st {
	double dVal;
	int siVal;
	unsigned int uiVal;
	unsigned long ulVal;
	unsigned long long ullVal;
	signed long long sllVal;
	unsigned short usVal;
} nvmlValue_t;

typedef struct nvmlSample_st {
	unsigned long long timeStamp;
	nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct nvmlMemory_st {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlProcessInfo_st {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct nvmlEventData_st {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlEventData_t;

#define nvmlEventTypeXidCriticalError 0x0000000000000008LL

#define NVML_GPM_METRIC_SM_UTIL 2
#define NVML_GPM_METRIC_SM_OCCUPANCY 3
#define NVML_GPM_METRIC_ANY_TENSOR_UTIL 5
#define NVML_GPM_METRIC_DRAM_BW_UTIL 10
#define NVML_GPM_METRIC_PCIE_TX_PER_SEC 20
#define NVML_GPM_METRIC_PCIE_RX_PER_SEC 21
#define NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC 60
#define NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC 61
#define NVML_GPM_METRIC_MAX 477

typedef struct {
	char *shortName;
	char *longName;
	char *unit;
} nvmlGpmMetricMetricInfo_t;

typedef struct {
	unsigned int metricId;
	nvmlReturn_t nvmlReturn;
	double value;
	nvmlGpmMetricMetricInfo_t metricInfo;
} nvmlGpmMetric_t;

typedef struct {
	unsigned int version;
	unsigned int numMetrics;
	nvmlGpmSample_t sample1;
	nvmlGpmSample_t sample2;
	nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
#define NVML_GPM_METRICS_GET_VERSION 1

typedef struct {
	unsigned int version;
	unsigned int isSupportedDevice;
} nvmlGpmSupport_t;
#define NVML_GPM_SUPPORT_VERSION 1
#endif /* SIMGPU_CHECK_NVML_H */

/* Hardware-event bits of nvml.h, spelled out so both build modes agree. */
#define SIM_THROTTLE_SUPPORTED 0x00000000000000FFULL
#define SIM_EVENT_XID 0x0000000000000008ULL

#define SIM_MAX_DEVICES 16
#define SIM_GPM_SAMPLE_MAGIC 0x67706d73u
#define SIM_MEM_TOTAL (143771ULL << 20) /* H200: 143771 MiB */
#define SIM_SAMPLE_BUFFER 120            /* samples kept, like the driver's ring */

struct nvmlDevice_st {
	int index;
	struct simgpu_timeline *tl;
	int xid_env_delivered;
};

struct nvmlEventSet_st {
	unsigned long long types[SIM_MAX_DEVICES];
};

struct nvmlGpmSample_st {
	uint32_t magic;
	int dev;
	uint64_t refresh_ns; /* CLOCK_MONOTONIC time of the counters' last refresh */
};

struct hwstate {
	unsigned pcie_gen, pcie_width, temp_c;
	unsigned long long throttle;
	int ecc_mode, persistence;
	unsigned long long ecc_corrected, ecc_uncorrected;
};

static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
static int sim_refs;
static int sim_ndev;
static int64_t sim_real_minus_mono_ns; /* fixed at the first init */
static uint64_t sim_init_mono_ns;
static struct nvmlDevice_st sim_devs[SIM_MAX_DEVICES];

static uint64_t now_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long env_long(const char *name, long def)
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

static double env_double(const char *name, double def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	double x = strtod(v, &end);
	return end == v ? def : x;
}

static const char *sim_dir(void)
{
	const char *d = getenv("SIMGPU_DIR");
	return d && *d ? d : "/dev/shm";
}

static uint64_t sample_period_ns(void)
{
	long ms = env_long("SIMGPU_SAMPLE_MS", 200);
	return (uint64_t)(ms > 0 ? ms : 200) * 1000000ull;
}

static uint64_t gpm_refresh_ns(void)
{
	long ms = env_long("SIMGPU_GPM_REFRESH_MS", 100);
	return (uint64_t)(ms > 0 ? ms : 100) * 1000000ull;
}

static struct nvmlDevice_st *dev_of(nvmlDevice_t d)
{
	struct nvmlDevice_st *p = d.handle;
	if (!p || p < &sim_devs[0] || p >= &sim_devs[SIM_MAX_DEVICES] || p->index >= sim_ndev)
		return NULL;
	return p;
}

/* The timeline file appears when the trainer starts: open it lazily, never
 * create it (an idle GPU simply has no busy intervals). */
static struct simgpu_timeline *timeline_of(struct nvmlDevice_st *d)
{
	pthread_mutex_lock(&sim_mu);
	if (!d->tl)
		d->tl = simgpu_timeline_open(d->index, 0);
	struct simgpu_timeline *t = d->tl;
	pthread_mutex_unlock(&sim_mu);
	return t;
}

static uint64_t busy(struct nvmlDevice_st *d, uint64_t a, uint64_t b, uint32_t mask)
{
	struct simgpu_timeline *t = timeline_of(d);
	if (!t || b <= a)
		return 0;
	return simgpu_timeline_busy_ns(t, a, b, mask);
}

static void read_hwstate(int dev, struct hwstate *hw)
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

#define CHECK_INIT()                      \
	do {                                  \
		if (__atomic_load_n(&sim_refs, __ATOMIC_ACQUIRE) <= 0) \
			return NVML_ERROR_UNINITIALIZED; \
	} while (0)

#define GET_DEV(d, dev)                                \
	CHECK_INIT();                                      \
	struct nvmlDevice_st *d = dev_of(dev);             \
	if (!d)                                            \
		return NVML_ERROR_INVALID_ARGUMENT

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

/* ---- clocks, throttling, temperature ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
	GET_DEV(d, device);
	if (!clock)
		return NVML_ERROR_INVALID_ARGUMENT;
	switch (type) {
	case NVML_CLOCK_GRAPHICS:
	case NVML_CLOCK_SM: *clock = 1980; break;
	case NVML_CLOCK_MEM: *clock = 3201; break;
	default: return NVML_ERROR_NOT_SUPPORTED;
	}
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
	GET_DEV(d, device);
	if (!clock)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	nvmlReturn_t r = nvmlDeviceGetMaxClockInfo(device, type, clock);
	/* Any slowdown reason (power cap, thermal, HW slowdown) lowers the SM clock. */
	if (r == NVML_SUCCESS && type != NVML_CLOCK_MEM && (hw.throttle & 0xECull))
		*clock = *clock * 7 / 10;
	return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
	GET_DEV(d, device);
	if (!reasons)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	*reasons = hw.throttle & SIM_THROTTLE_SUPPORTED;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
	return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
	GET_DEV(d, device);
	if (!temp || sensorType != NVML_TEMPERATURE_GPU)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	*temp = hw.temp_c;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType, unsigned int *temp)
{
	GET_DEV(d, device);
	if (!temp)
		return NVML_ERROR_INVALID_ARGUMENT;
	switch (thresholdType) {
	case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: *temp = 92; break;
	case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: *temp = 87; break;
	case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: *temp = 85; break;
	case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: *temp = 95; break;
	default: return NVML_ERROR_NOT_SUPPORTED;
	}
	return NVML_SUCCESS;
}

/* ---- PCIe ---- */

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
	GET_DEV(d, device);
	if (!currLinkGen)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	*currLinkGen = hw.pcie_gen;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
	GET_DEV(d, device);
	if (!currLinkWidth)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	*currLinkWidth = hw.pcie_width;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
	GET_DEV(d, device);
	if (!maxLinkGen)
		return NVML_ERROR_INVALID_ARGUMENT;
	*maxLinkGen = 5;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
	GET_DEV(d, device);
	if (!maxLinkWidth)
		return NVML_ERROR_INVALID_ARGUMENT;
	*maxLinkWidth = 16;
	return NVML_SUCCESS;
}

/* ---- ECC, persistence, memory ---- */

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
	GET_DEV(d, device);
	if (!current || !pending)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	*current = *pending = hw.ecc_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
						nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
	GET_DEV(d, device);
	if (!eccCounts)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	if (!hw.ecc_mode)
		return NVML_ERROR_NOT_SUPPORTED;
	(void)counterType; /* volatile == aggregate: the simulated driver never reloads */
	*eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? hw.ecc_uncorrected : hw.ecc_corrected;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
	GET_DEV(d, device);
	if (!mode)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct hwstate hw;
	read_hwstate(d->index, &hw);
	*mode = hw.persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	GET_DEV(d, device);
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct simgpu_timeline *t = timeline_of(d);
	uint64_t used = t ? simgpu_timeline_mem_used(t) : 0;
	if (used > SIM_MEM_TOTAL)
		used = SIM_MEM_TOTAL;
	memory->total = SIM_MEM_TOTAL;
	memory->used = used;
	memory->free = SIM_MEM_TOTAL - used;
	return NVML_SUCCESS;
}

/* ---- processes ---- */

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
							    nvmlProcessInfo_t *infos)
{
	GET_DEV(d, device);
	if (!infoCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint32_t pids[256];
	struct simgpu_timeline *t = timeline_of(d);
	int n = t ? simgpu_timeline_pids(t, pids, 256) : 0;
	if (n < 0)
		n = 0;
	if ((unsigned)n > *infoCount || (n > 0 && !infos)) {
		*infoCount = (unsigned)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int i = 0; i < n; i++) {
		infos[i].pid = pids[i];
		/* The timeline tracks memory per device, not per process. */
		infos[i].usedGpuMemory = (unsigned long long)-1; /* NVML_VALUE_NOT_AVAILABLE */
		infos[i].gpuInstanceId = 0xFFFFFFFFu;
		infos[i].computeInstanceId = 0xFFFFFFFFu;
	}
	*infoCount = (unsigned)n;
	return NVML_SUCCESS;
}

/* ---- events (Xid) ---- */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	CHECK_INIT();
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	set->handle = calloc(1, sizeof(struct nvmlEventSet_st));
	return set->handle ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	CHECK_INIT();
	free(set.handle);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
	GET_DEV(d, device);
	if (!eventTypes)
		return NVML_ERROR_INVALID_ARGUMENT;
	*eventTypes = SIM_EVENT_XID;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
	GET_DEV(d, device);
	if (!set.handle)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (eventTypes & ~SIM_EVENT_XID)
		return NVML_ERROR_NOT_SUPPORTED;
	set.handle->types[d->index] |= eventTypes;
	return NVML_SUCCESS;
}

/* Takes one Xid code for dev from the trigger file (rename makes the take
 * atomic against a writer re-creating the file), or the SIMGPU_XID one. */
static int take_xid(struct nvmlDevice_st *d, unsigned long long *code)
{
	const char *spec = getenv("SIMGPU_XID");
	if (spec && *spec && !__atomic_load_n(&d->xid_env_delivered, __ATOMIC_ACQUIRE)) {
		char *at = strchr(spec, '@');
		uint64_t delay = at ? strtoull(at + 1, NULL, 0) * 1000000ull : 0;
		if (now_ns(CLOCK_MONOTONIC) >= sim_init_mono_ns + delay &&
		    !__atomic_exchange_n(&d->xid_env_delivered, 1, __ATOMIC_ACQ_REL)) {
			*code = strtoull(spec, NULL, 0);
			return 1;
		}
	}
	char path[4096], taken[4200];
	snprintf(path, sizeof(path), "%s/gaptrace-simgpu-%d.xid", sim_dir(), d->index);
	snprintf(taken, sizeof(taken), "%s.%d.taken", path, (int)getpid());
	if (rename(path, taken) != 0)
		return 0;
	FILE *f = fopen(taken, "re");
	int got = 0;
	if (f) {
		/* First code is delivered now; the rest go back for the next waits. */
		char line[64];
		char rest[4096];
		size_t restlen = 0;
		while (fgets(line, sizeof(line), f)) {
			if (!got && strtoull(line, NULL, 0)) {
				*code = strtoull(line, NULL, 0);
				got = 1;
			} else if (restlen + strlen(line) < sizeof(rest)) {
				memcpy(rest + restlen, line, strlen(line));
				restlen += strlen(line);
			}
		}
		fclose(f);
		if (restlen) {
			FILE *w = fopen(path, "ae");
			if (w) {
				fwrite(rest, 1, restlen, w);
				fclose(w);
			}
		}
	}
	unlink(taken);
	return got;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	CHECK_INIT();
	if (!set.handle || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)timeoutms * 1000000ull;
	for (;;) {
		for (int i = 0; i < sim_ndev; i++) {
			unsigned long long code;
			if (!(set.handle->types[i] & SIM_EVENT_XID) || !take_xid(&sim_devs[i], &code))
				continue;
			memset(data, 0, sizeof(*data));
			data->device.handle = &sim_devs[i];
			data->eventType = SIM_EVENT_XID;
			data->eventData = code;
			data->gpuInstanceId = 0xFFFFFFFFu;
			data->computeInstanceId = 0xFFFFFFFFu;
			return NVML_SUCCESS;
		}
		if (now_ns(CLOCK_MONOTONIC) >= deadline)
			return NVML_ERROR_TIMEOUT;
		struct timespec ts = {0, 10 * 1000000L};
		nanosleep(&ts, NULL);
	}
}

/* ---- GPM ---- */

static int gpm_supported(void)
{
	return env_long("SIMGPU_GPM", 1) != 0;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
	GET_DEV(d, device);
	if (!gpmSupport)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	gpmSupport->isSupportedDevice = (unsigned)gpm_supported();
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
	CHECK_INIT();
	if (!gpmSample)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct nvmlGpmSample_st *s = calloc(1, sizeof(*s));
	if (!s)
		return NVML_ERROR_MEMORY;
	s->magic = SIM_GPM_SAMPLE_MAGIC;
	s->dev = -1;
	gpmSample->handle = s;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
	CHECK_INIT();
	if (!gpmSample.handle || gpmSample.handle->magic != SIM_GPM_SAMPLE_MAGIC)
		return NVML_ERROR_INVALID_ARGUMENT;
	gpmSample.handle->magic = 0;
	free(gpmSample.handle);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
	GET_DEV(d, device);
	struct nvmlGpmSample_st *s = gpmSample.handle;
	if (!s || s->magic != SIM_GPM_SAMPLE_MAGIC)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!gpm_supported())
		return NVML_ERROR_NOT_SUPPORTED;
	uint64_t r = gpm_refresh_ns();
	uint64_t phase = (uint64_t)env_long("SIMGPU_GPM_PHASE_MS", 0) * 1000000ull % r;
	uint64_t now = now_ns(CLOCK_MONOTONIC);
	s->dev = d->index;
	s->refresh_ns = now < phase ? 0 : (now - phase) / r * r + phase;
	return NVML_SUCCESS;
}

/* Per-metric value over [a,b) of device d from the timeline; the constants
 * describe a plausible transformer step on an H200, they only need to be
 * monotonic in the busy time so tests can check direction and scale. */
static nvmlReturn_t gpm_metric(struct nvmlDevice_st *d, unsigned id, uint64_t a, uint64_t b, double *v)
{
	if (b <= a) {
		*v = 0; /* no refresh between the samples: every counter delta is zero */
		return NVML_SUCCESS;
	}
	double span = (double)(b - a);
	double k = (double)busy(d, a, b, SIMGPU_KIND_KERNEL) / span;
	double c = (double)busy(d, a, b, SIMGPU_KIND_COLLECTIVE) / span;
	double cp = (double)busy(d, a, b, SIMGPU_KIND_COPY | SIMGPU_KIND_MEMSET) / span;
	double sm = k + c * env_double("SIMGPU_NCCL_SM_FRACTION", 0.05);
	if (sm > 1)
		sm = 1;
	switch (id) {
	case NVML_GPM_METRIC_SM_UTIL: *v = 100.0 * sm; break;
	case NVML_GPM_METRIC_SM_OCCUPANCY: *v = 100.0 * sm * 0.6; break;
	case NVML_GPM_METRIC_ANY_TENSOR_UTIL: *v = 100.0 * k * 0.45; break;
	case NVML_GPM_METRIC_DRAM_BW_UTIL: *v = 100.0 * (k * 0.35 + cp * 0.2 + c * 0.1); if (*v > 100.0) *v = 100.0; break;
	case NVML_GPM_METRIC_PCIE_TX_PER_SEC: *v = cp * 0.5 * 55000.0; break; /* MiB/s */
	case NVML_GPM_METRIC_PCIE_RX_PER_SEC: *v = cp * 55000.0; break;
	case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC:
	case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: *v = c * 380000.0; break;
	default: return NVML_ERROR_NOT_SUPPORTED;
	}
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m)
{
	CHECK_INIT();
	if (!m)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (m->version != NVML_GPM_METRICS_GET_VERSION)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	struct nvmlGpmSample_st *s1 = m->sample1.handle, *s2 = m->sample2.handle;
	if (!s1 || !s2 || s1->magic != SIM_GPM_SAMPLE_MAGIC || s2->magic != SIM_GPM_SAMPLE_MAGIC ||
	    s1->dev < 0 || s1->dev != s2->dev || s1->dev >= sim_ndev || m->numMetrics > NVML_GPM_METRIC_MAX)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (s2->refresh_ns < s1->refresh_ns)
		return NVML_ERROR_INVALID_ARGUMENT; /* sample2 must be the later one */
	struct nvmlDevice_st *d = &sim_devs[s1->dev];
	for (unsigned i = 0; i < m->numMetrics; i++) {
		m->metrics[i].metricInfo.shortName = NULL;
		m->metrics[i].metricInfo.longName = NULL;
		m->metrics[i].metricInfo.unit = NULL;
		m->metrics[i].nvmlReturn =
			gpm_metric(d, m->metrics[i].metricId, s1->refresh_ns, s2->refresh_ns, &m->metrics[i].value);
	}
	return NVML_SUCCESS;
}
