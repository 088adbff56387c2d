/*
 * nvml_internal.h - what the files of the simulated NVML share: the subset
 * of nvml.h it implements (or nvml.h itself with -DSIMGPU_CHECK_NVML_H), its
 * handle types and state, and the helpers that read the timeline and the
 * hardware state. Internal to libnvidia-ml.so.1: nothing here is exported.
 */
#ifndef SIMGPU_NVML_INTERNAL_H
#define SIMGPU_NVML_INTERNAL_H

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

/* nvml.c: state, helpers, init */
extern int sim_refs;
extern int sim_ndev;
extern uint64_t sim_init_mono_ns;
extern struct nvmlDevice_st sim_devs[SIM_MAX_DEVICES];
uint64_t now_ns(clockid_t c);
long env_long(const char *name, long def);
double env_double(const char *name, double def);
const char *sim_dir(void);
uint64_t gpm_refresh_ns(void);
struct nvmlDevice_st *dev_of(nvmlDevice_t d);
struct simgpu_timeline *timeline_of(struct nvmlDevice_st *d);
uint64_t busy(struct nvmlDevice_st *d, uint64_t a, uint64_t b, uint32_t mask);
void read_hwstate(int dev, struct hwstate *hw);

#endif /* SIMGPU_NVML_INTERNAL_H */
