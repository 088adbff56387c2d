//go:build ignore

#include "nvml_internal.h"

#include <poll.h>
#include <sys/inotify.h>

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

/* Ms until the SIMGPU_XID code is due on a device of set that has not had
 * it, or -1 when none waits. */
static int64_t env_xid_due_ms(nvmlEventSet_t set)
{
	const char *spec = getenv("SIMGPU_XID");
	if (!spec || !*spec)
		return -1;
	int pending = 0;
	for (int i = 0; i < sim_ndev; i++)
		if ((set.handle->types[i] & SIM_EVENT_XID) && !__atomic_load_n(&sim_devs[i].xid_env_delivered, __ATOMIC_ACQUIRE))
			pending = 1;
	if (!pending)
		return -1;
	const char *at = strchr(spec, '@');
	uint64_t due = sim_init_mono_ns + (at ? strtoull(at + 1, NULL, 0) * 1000000ull : 0);
	uint64_t now = now_ns(CLOCK_MONOTONIC);
	return due > now ? (int64_t)((due - now + 999999) / 1000000) : 0;
}

/* Reads what the inotify fd holds: whether an Xid file was among it. */
static int xid_written(int ifd)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	int any = 0;
	ssize_t n;
	while ((n = read(ifd, buf, sizeof(buf))) > 0) {
		for (char *p = buf; p < buf + n;) {
			struct inotify_event *e = (struct inotify_event *)p;
			size_t l = e->len ? strlen(e->name) : 0;
			if (l > 4 && strcmp(e->name + l - 4, ".xid") == 0)
				any = 1;
			p += sizeof(*e) + e->len;
		}
	}
	return any;
}

/* Like the driver's, the wait sleeps until an event may be there: an Xid
 * file written (closed) or moved into the directory, or the SIMGPU_XID code
 * due, rather than polling the files. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	CHECK_INIT();
	if (!set.handle || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)timeoutms * 1000000ull;
	/* Watched before the first look, so a file written in between wakes it. */
	int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (ifd >= 0 && inotify_add_watch(ifd, sim_dir(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
		close(ifd);
		ifd = -1;
	}
	nvmlReturn_t ret = NVML_ERROR_TIMEOUT;
	for (int look = 1;;) {
		for (int i = 0; look && i < sim_ndev; i++) {
			unsigned long long code = 0;
			if (!(set.handle->types[i] & SIM_EVENT_XID) || !take_xid(&sim_devs[i], &code))
				continue;
			memset(data, 0, sizeof(*data));
			data->device.handle = &sim_devs[i];
			data->eventType = SIM_EVENT_XID;
			data->eventData = code;
			data->gpuInstanceId = 0xFFFFFFFFu;
			data->computeInstanceId = 0xFFFFFFFFu;
			ret = NVML_SUCCESS;
			goto out;
		}
		uint64_t now = now_ns(CLOCK_MONOTONIC);
		if (now >= deadline)
			goto out;
		int64_t wait = (int64_t)((deadline - now + 999999) / 1000000);
		int64_t env = env_xid_due_ms(set);
		if (env >= 0 && env < wait)
			wait = env;
		if (ifd < 0) {
			/* No inotify: look every 10 ms. */
			struct timespec ts = {0, 10 * 1000000L};
			nanosleep(&ts, NULL);
			continue;
		}
		struct pollfd pfd = {.fd = ifd, .events = POLLIN};
		poll(&pfd, 1, (int)wait);
		look = xid_written(ifd) || env_xid_due_ms(set) == 0;
	}
out:
	if (ifd >= 0)
		close(ifd);
	return ret;
}

