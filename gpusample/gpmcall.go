package gpusample

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

// nvmlGpmMetricsGet_t of nvml.h, version 1. The library reads version,
// numMetrics, the samples and metrics[i].metricId for i < numMetrics, and
// writes those entries' nvmlReturn, value and metricInfo; the array is as
// long as the newest header's (the length go-nvml declares), so a library
// that checks it finds room.
#define GT_GPM_METRIC_MAX 477

typedef struct {
	unsigned int metricId;
	unsigned int nvmlReturn;
	double value;
	char *shortName, *longName, *unit;
} gt_gpm_metric;

typedef struct {
	unsigned int version;
	unsigned int numMetrics;
	void *sample1, *sample2;
	gt_gpm_metric metrics[GT_GPM_METRIC_MAX];
} gt_gpm_metrics_get;

typedef int (*gt_gpm_metrics_get_fn)(gt_gpm_metrics_get *);

static void *gt_gpm_lookup(void) { return dlsym(RTLD_DEFAULT, "nvmlGpmMetricsGet"); }

static int gt_gpm_call(void *fn, gt_gpm_metrics_get *m) { return ((gt_gpm_metrics_get_fn)fn)(m); }
*/
import "C"

import (
	"reflect"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// directGPM calls NVML's nvmlGpmMetricsGet with a request kept in C memory.
// go-nvml's GpmMetricsGet copies its 19 KB request (every metric NVML
// knows) into a new C-layout struct and back on each call, and cgo checks
// the pointers in it: on 8 simulated devices that was 9% of the sidecar's
// CPU and most of its memmove. Only used with the library Open loaded
// (a test's fake NVML goes through nvml.Interface); all calls hold gpmMu.
type directGPM struct {
	fn  unsafe.Pointer
	req *C.gt_gpm_metrics_get
}

// newDirectGPM finds nvmlGpmMetricsGet in the process (Open loaded NVML
// with RTLD_GLOBAL); nil when it is not there.
func newDirectGPM() *directGPM {
	fn := C.gt_gpm_lookup()
	if fn == nil {
		return nil
	}
	req := (*C.gt_gpm_metrics_get)(C.calloc(1, C.sizeof_gt_gpm_metrics_get))
	if req == nil {
		return nil
	}
	return &directGPM{fn: fn, req: req}
}

// sampleHandle is the C handle inside go-nvml's sample; false for any
// other implementation of nvml.GpmSample.
func sampleHandle(s nvml.GpmSample) (unsafe.Pointer, bool) {
	v := reflect.ValueOf(s)
	if !v.IsValid() || v.Kind() != reflect.Struct || v.Type().PkgPath() != nvmlPkg ||
		v.Type().Name() != "nvmlGpmSample" || v.NumField() != 1 || v.Field(0).Kind() != reflect.Pointer {
		return nil, false
	}
	p := v.Field(0).UnsafePointer()
	return p, p != nil
}

const nvmlPkg = "github.com/NVIDIA/go-nvml/pkg/nvml"

// metrics fills vals (len(ids)) with ids between a and b (gpmValue). done is false when a sample is not go-nvml's
// (the caller then asks nvml.Interface); ret is NVML's return otherwise.
func (d *directGPM) metrics(a, b nvml.GpmSample, ids []nvml.GpmMetricId, vals []float64) (ret nvml.Return, done bool) {
	pa, okA := sampleHandle(a)
	pb, okB := sampleHandle(b)
	if !okA || !okB || len(ids) > C.GT_GPM_METRIC_MAX || len(vals) < len(ids) {
		return 0, false
	}
	m := d.req
	m.version = C.uint(nvml.GPM_METRICS_GET_VERSION)
	m.numMetrics = C.uint(len(ids))
	m.sample1, m.sample2 = pa, pb
	for i, id := range ids {
		m.metrics[i] = C.gt_gpm_metric{metricId: C.uint(id)}
	}
	ret = nvml.Return(C.gt_gpm_call(d.fn, m))
	if ret != nvml.SUCCESS {
		return ret, true
	}
	for i := range ids {
		vals[i] = gpmValue(nvml.Return(m.metrics[i].nvmlReturn), float64(m.metrics[i].value))
	}
	return ret, true
}
