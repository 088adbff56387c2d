//go:build ignore

#include "nvml_internal.h"

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

/* The device's busy fractions over [a,b): kernels, collectives, copies and
 * memsets. Measured once per nvmlGpmMetricsGet call, not once per metric:
 * each is a scan of the timeline (tens of thousands of launches a second on
 * a launch-bound job), and the real library's call costs 0.1-0.5 ms on an
 * H200 whatever the load. */
struct gpm_busy {
	double k, c, cp;
};

static struct gpm_busy gpm_busy_of(struct nvmlDevice_st *d, uint64_t a, uint64_t b)
{
	struct gpm_busy f = {0, 0, 0};
	if (b <= a)
		return f;
	double span = (double)(b - a);
	f.k = (double)busy(d, a, b, SIMGPU_KIND_KERNEL) / span;
	f.c = (double)busy(d, a, b, SIMGPU_KIND_COLLECTIVE) / span;
	f.cp = (double)busy(d, a, b, SIMGPU_KIND_COPY | SIMGPU_KIND_MEMSET) / span;
	return f;
}

/* Per-metric value over [a,b) from its busy fractions f; the constants
 * describe a plausible transformer step on an H200, they only need to be
 * monotonic in the busy time so tests can check direction and scale. */
static nvmlReturn_t gpm_metric(struct gpm_busy f, unsigned id, uint64_t a, uint64_t b, double *v)
{
	if (b <= a) {
		*v = 0; /* no refresh between the samples: every counter delta is zero */
		return NVML_SUCCESS;
	}
	double k = f.k, c = f.c, cp = f.cp;
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
	struct gpm_busy f = gpm_busy_of(d, s1->refresh_ns, s2->refresh_ns);
	for (unsigned i = 0; i < m->numMetrics; i++) {
		m->metrics[i].metricInfo.shortName = NULL;
		m->metrics[i].metricInfo.longName = NULL;
		m->metrics[i].metricInfo.unit = NULL;
		m->metrics[i].nvmlReturn =
			gpm_metric(f, m->metrics[i].metricId, s1->refresh_ns, s2->refresh_ns, &m->metrics[i].value);
	}
	return NVML_SUCCESS;
}
