package gpusample

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/wake"
)

// utilReader turns utilization samples into contiguous windows. A sample
// (ts, v) is the busy percentage of the driver's sample period ending at ts,
// so the window it describes is (previous ts, ts]. The reader keeps the last
// timestamp it emitted, asks NVML only for newer samples, and ignores any
// sample not newer than it: no window twice, none overlapping.
type utilReader struct {
	dev    int
	uuid   string
	lastTS uint64   // µs CLOCK_REALTIME; 0 until the first sample is seen
	diffs  []uint64 // recent sample spacings, to recognise a lost sample
}

// period is the driver's sample period as seen so far: the smallest recent
// spacing (a spacing that spans lost samples is a multiple of it).
func (r *utilReader) period() uint64 {
	if len(r.diffs) == 0 {
		return 0
	}
	return slices.Min(r.diffs)
}

// feed consumes samples returned for lastSeen == r.lastTS and returns the
// windows they close and how many samples the driver had dropped.
func (r *utilReader) feed(vt nvml.ValueType, samples []nvml.Sample) (wins []event.GPUWindow, lost uint64) {
	slices.SortFunc(samples, func(a, b nvml.Sample) int {
		switch {
		case a.TimeStamp < b.TimeStamp:
			return -1
		case a.TimeStamp > b.TimeStamp:
			return 1
		}
		return 0
	})
	for _, smp := range samples {
		ts := smp.TimeStamp
		if ts <= r.lastTS {
			continue
		}
		if r.lastTS == 0 {
			// The first sample only anchors the sequence: its period's start
			// is unknown, and it predates Run anyway.
			r.lastTS = ts
			continue
		}
		start := r.lastTS
		diff := ts - r.lastTS
		if p := r.period(); p > 0 && diff > p+p/2 {
			// Samples between lastTS and ts were lost (ring overflow while we
			// could not read): describe only the sample's own period.
			lost += (diff+p/2)/p - 1
			start = ts - p
		} else {
			r.diffs = append(r.diffs, diff)
			if len(r.diffs) > 8 {
				r.diffs = r.diffs[1:]
			}
		}
		busy := sampleValue(vt, smp.SampleValue) / 100
		busy = math.Max(0, math.Min(1, busy))
		wins = append(wins, event.GPUWindow{
			Device: r.dev, UUID: r.uuid,
			Start: int64(start) * 1000, End: int64(ts) * 1000,
			IdleFraction: 1 - busy, Source: event.SourceNVML,
			SMActivity: -1, TensorActivity: -1,
		})
		r.lastTS = ts
	}
	return wins, lost
}

// sampleValue decodes an nvmlValue_t union of the given type.
func sampleValue(vt nvml.ValueType, b [8]byte) float64 {
	ne := binary.NativeEndian
	switch vt {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(ne.Uint64(b[:]))
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(ne.Uint32(b[:4]))
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(ne.Uint64(b[:]))
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(ne.Uint64(b[:])))
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(ne.Uint32(b[:4])))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(ne.Uint16(b[:2]))
	}
	return float64(ne.Uint32(b[:4]))
}

// readSamples makes one incremental GetSamples call; a failed call is
// counted and yields no window.
func (s *Source) readSamples(d *device, r *utilReader) []event.GPUWindow {
	t0 := time.Now()
	vt, samples, ret := d.h.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, r.lastTS)
	cost := time.Since(t0).Nanoseconds()
	s.st.sampleCalls.Add(1)
	s.st.sampleCostNS.Add(cost)
	storeMax(&s.st.sampleCostMaxNS, cost)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND:
		return nil // no sample newer than lastTS yet
	default:
		s.countErr(d, "nvmlDeviceGetSamples", ret)
		return nil
	}
	n0 := r.lastTS
	wins, lost := r.feed(vt, samples)
	for _, smp := range samples {
		if smp.TimeStamp > n0 {
			s.st.samples.Add(1)
		}
	}
	s.st.samplesLost.Add(lost)
	return wins
}

func (s *Source) utilLoop(ctx context.Context, d *device, emit func(event.GPUWindow) bool) {
	r := &utilReader{dev: d.info.Index, uuid: d.info.UUID}
	// Anchor at the newest sample so history from before Run is skipped.
	s.readSamples(d, r)
	tick := wake.NewTicker(s.cfg.SampleInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			tick.Next()
		}
		wins := s.readSamples(d, r)
		for _, w := range wins {
			d.mu.Lock()
			d.lastBusy = 1 - w.IdleFraction
			d.mu.Unlock()
			if !emit(w) {
				return
			}
		}
	}
}
