package gpusample

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

func TestSimWindowsMatchTimeline(t *testing.T) {
	w := startWriter(t)
	off := realMinusMono()
	// The pattern starts now (GPM alignment needs a busy GPU) and runs 5 s.
	p := testPattern(monoNow(), 72)
	p.write(w)
	s := openSim(t, Config{SampleInterval: 30 * time.Millisecond})
	if d := s.Devices(); len(d) != 1 || d[0].Name != "Simulated H200" || !d[0].GPMSupported ||
		d[0].PCIeMaxGen != 5 || d[0].PCIeMaxWidth != 16 {
		t.Fatalf("devices: %+v", d)
	}
	stopAt := p.end() + off - int64(300*time.Millisecond)
	ws := collect(t, s, 10*time.Second, func(ws []event.GPUWindow) bool {
		nv, gp := bySource(ws, event.SourceNVML), bySource(ws, event.SourceGPM)
		return len(nv) > 0 && len(gp) > 0 && nv[len(nv)-1].End > stopAt && gp[len(gp)-1].End > stopAt
	})

	nv := bySource(ws, event.SourceNVML)
	gp := bySource(ws, event.SourceGPM)
	if len(nv) < 40 || len(gp) < 25 {
		t.Fatalf("too few windows: %d nvml, %d gpm", len(nv), len(gp))
	}
	checkContiguous(t, nv)
	checkContiguous(t, gp)

	// NVML: each window is one simulated sample period, its idle fraction
	// that of kernels+collectives in it (integer percent: ±0.5%).
	for i, win := range nv {
		a, b := win.Start-off, win.End-off
		if d := time.Duration(b - a); d < simSamplePeriod-time.Millisecond || d > simSamplePeriod+time.Millisecond {
			t.Errorf("nvml window %d lasts %v, want the sample period %v", i, d, simSamplePeriod)
		}
		if a < p.start || b > p.end() {
			continue
		}
		k, c := p.busy(a, b)
		want := 1 - float64(k+c)/float64(b-a)
		if math.Abs(win.IdleFraction-want) > 0.011 {
			t.Errorf("nvml window %d [%d,%d): idle %.3f, timeline says %.3f", i, a, b, win.IdleFraction, want)
		}
		if win.SMActivity != -1 {
			t.Errorf("nvml window %d has SM activity %v, want -1 (unknown)", i, win.SMActivity)
		}
	}

	// GPM: windows sit on the simulated refresh boundaries (aligned), and
	// SM activity counts kernels fully and collectives at 5%.
	st := s.Stats()
	if !st.GPMAligned || st.GPMRefresh < simGPMRefresh-3*time.Millisecond || st.GPMRefresh > simGPMRefresh+3*time.Millisecond {
		t.Errorf("gpm aligned=%v refresh=%v, want aligned at %v", st.GPMAligned, st.GPMRefresh, simGPMRefresh)
	}
	phase := int64(simGPMPhase)
	R := int64(simGPMRefresh)
	aligned := 0
	for i, win := range gp {
		a, b := win.Start-off, win.End-off
		// The nearest refresh boundaries: what the counters really cover.
		ra := (a-phase+R/2)/R*R + phase
		rb := (b-phase+R/2)/R*R + phase
		if i == 0 {
			continue // the first window may start at a pre-alignment sample
		}
		// Labels within the read margin (less 2 ms of timer slack) of the true
		// refresh mean every read still came after its refresh, so each
		// window's counters cover exactly the refresh interval the metrics
		// are checked against below.
		if abs(a-ra) > int64(gpmMargin-2*time.Millisecond) || abs(b-rb) > int64(gpmMargin-2*time.Millisecond) {
			t.Errorf("gpm window %d [%d,%d) off the refresh grid by %v / %v", i, a, b,
				time.Duration(a-ra), time.Duration(b-rb))
			continue
		}
		aligned++
		if ra < p.start || rb > p.end() {
			continue
		}
		k, c := p.busy(ra, rb)
		want := (float64(k) + 0.05*float64(c)) / float64(rb-ra)
		if math.Abs(win.SMActivity-want) > 0.005 || math.Abs(win.IdleFraction-(1-want)) > 0.005 {
			t.Errorf("gpm window %d: SM activity %.3f idle %.3f, timeline says %.3f", i, win.SMActivity, win.IdleFraction, want)
		}
	}
	if aligned < 25 {
		t.Errorf("only %d gpm windows aligned to the refresh", aligned)
	}
	if st.SamplesLost != 0 || st.Errors != 0 {
		t.Errorf("stats: %+v", st)
	}
	t.Logf("stats: %+v", st)

	// The step-level context over the pattern.
	hc := s.HWContext(0, p.start+off, p.end()+off-int64(time.Second))
	if hc == nil || hc.SMActivity <= 0 || hc.SMActivity >= 1 || hc.TensorActivity <= 0 || hc.NVLinkTxBytesPerSec <= 0 {
		t.Errorf("hw context: %+v", hc)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// A collective spinning on a late peer keeps utilization high while SM
// activity stays low: the two sources must disagree the way the H200 does.
func TestSimBusyIsNotUseful(t *testing.T) {
	w := startWriter(t)
	start := monoNow()
	// 200 ms of compute first (alignment), then 2 s of collective only.
	w.add(start, start+int64(200*time.Millisecond), kindKernel)
	w.add(start+int64(200*time.Millisecond), start+int64(2200*time.Millisecond), kindCollective)
	off := realMinusMono()
	s := openSim(t, Config{SampleInterval: 30 * time.Millisecond})
	from := start + int64(500*time.Millisecond) + off
	to := start + int64(2100*time.Millisecond) + off
	ws := collect(t, s, 6*time.Second, func(ws []event.GPUWindow) bool {
		return len(ws) > 0 && ws[len(ws)-1].End > to+int64(200*time.Millisecond)
	})
	var nvN, gpN int
	for _, win := range ws {
		if win.Start < from || win.End > to {
			continue
		}
		switch win.Source {
		case event.SourceNVML:
			nvN++
			if win.IdleFraction > 0.01 {
				t.Errorf("nvml window during the collective: idle %.2f, want ~0 (utilization counts NCCL kernels)", win.IdleFraction)
			}
		case event.SourceGPM:
			gpN++
			if math.Abs(win.SMActivity-0.05) > 0.01 {
				t.Errorf("gpm window during the collective: SM activity %.3f, want 0.05", win.SMActivity)
			}
		}
	}
	if nvN < 10 || gpN < 8 {
		t.Fatalf("windows during the collective: %d nvml, %d gpm", nvN, gpN)
	}
}

func TestSimNoGPM(t *testing.T) {
	w := startWriter(t)
	t.Setenv("SIMGPU_GPM", "0")
	start := monoNow()
	w.add(start, start+int64(time.Second), kindKernel)
	s := openSim(t, Config{SampleInterval: 30 * time.Millisecond})
	if s.Devices()[0].GPMSupported {
		t.Fatal("GPM reported supported with SIMGPU_GPM=0")
	}
	ws := collect(t, s, 3*time.Second, func(ws []event.GPUWindow) bool { return len(ws) >= 5 })
	if len(ws) < 5 || len(bySource(ws, event.SourceGPM)) != 0 {
		t.Fatalf("windows without GPM: %d total, %d gpm", len(ws), len(bySource(ws, event.SourceGPM)))
	}
	if f, _ := findCheck(s.Health(), CheckGPM); f.Level != OK || !strings.Contains(f.Detail, "not supported") {
		t.Errorf("gpm finding: %+v", f)
	}
}

// A GPU whose counters refresh at another period than configured: the
// measured period wins and windows follow it.
func TestSimGPMOtherRefreshPeriod(t *testing.T) {
	w := startWriter(t)
	t.Setenv("SIMGPU_GPM_REFRESH_MS", "120")
	start := monoNow()
	w.add(start, start+int64(4*time.Second), kindKernel)
	off := realMinusMono()
	s := openSim(t, Config{GPMInterval: 100 * time.Millisecond})
	ws := collect(t, s, 8*time.Second, func(ws []event.GPUWindow) bool { return len(bySource(ws, event.SourceGPM)) >= 25 })
	st := s.Stats()
	if !st.GPMAligned || st.GPMRefresh < 117*time.Millisecond || st.GPMRefresh > 123*time.Millisecond {
		t.Fatalf("refresh %v aligned %v, want 120 ms", st.GPMRefresh, st.GPMAligned)
	}
	R, phase := int64(120*time.Millisecond), int64(simGPMPhase)
	// The first calibration measures the period over ~4 refreshes, within a
	// few % on a busy host (recalAfter): its windows may drift by that much
	// times a few periods until the second one, 1 s later, measures it
	// against the first refresh. Windows are judged from then on.
	judged := 0
	for i, win := range bySource(ws, event.SourceGPM)[1:] {
		e := win.End - off
		if e < start+int64(1500*time.Millisecond) {
			continue
		}
		judged++
		if d := abs(e - ((e-phase+R/2)/R*R + phase)); d > int64(gpmMargin-2*time.Millisecond) {
			t.Errorf("gpm window %d ends %v off the 120 ms refresh grid", i+1, time.Duration(d))
		}
	}
	if judged < 5 {
		t.Errorf("only %d gpm windows after the second calibration", judged)
	}
}

// A sidecar started before its job sees an idle GPU, whose GPM counters do
// not move, and cannot align to their refresh: its windows until the job
// computes carry the refresh period as Skew (their counters may be that
// much older than they say). The first window that shows the GPU busy
// calibrates at once, not recalUnaligned later, and windows from then on
// sit on the refresh grid with no skew.
func TestSimGPMAlignsWhenTheJobStarts(t *testing.T) {
	w := startWriter(t)
	off := realMinusMono()
	s := openSim(t, Config{SampleInterval: 30 * time.Millisecond})
	// Busy from 600 ms after the sampler started, for 3 s.
	busyFrom := monoNow() + int64(600*time.Millisecond)
	p := pattern{start: busyFrom, slotLen: int64(50 * time.Millisecond)}
	for range 60 {
		p.kernel = append(p.kernel, 0.8)
		p.coll = append(p.coll, 0)
	}
	p.write(w)
	busyAt := busyFrom + off
	gp := bySource(collect(t, s, 8*time.Second, func(ws []event.GPUWindow) bool {
		g := bySource(ws, event.SourceGPM)
		return len(g) > 0 && g[len(g)-1].End > busyAt+int64(2500*time.Millisecond)
	}), event.SourceGPM)
	checkContiguous(t, gp)
	R := int64(simGPMRefresh)
	alignedAt := int64(0)
	for i, win := range gp {
		switch {
		case win.Skew == 0 && alignedAt == 0:
			alignedAt = win.Start
		case win.Skew != 0 && alignedAt != 0:
			t.Errorf("gpm window %d [%d,%d) has skew %v after the sampler aligned", i, win.Start, win.End, time.Duration(win.Skew))
		case win.Skew != 0 && win.Skew != R:
			t.Errorf("gpm window %d before alignment has skew %v, want the refresh period %v", i, time.Duration(win.Skew), simGPMRefresh)
		}
		if win.Skew == 0 && win.End <= busyAt {
			t.Errorf("gpm window %d [%d,%d) claims alignment before the GPU was ever busy", i, win.Start, win.End)
		}
	}
	if alignedAt == 0 {
		t.Fatalf("the sampler never aligned in %d windows", len(gp))
	}
	// The calibration needs a busy window to start and four refreshes to
	// finish (its budget is 400 ms); recalUnaligned would wait 5 s.
	if d := time.Duration(alignedAt - busyAt); d > 1500*time.Millisecond {
		t.Errorf("aligned %v after the GPU became busy, want within 1.5 s", d)
	}
	t.Logf("aligned %v after the GPU became busy; %d windows", time.Duration(alignedAt-busyAt), len(gp))
}

// A sidecar attached to a job that already computes: GPM windows cover the
// GPU from the sampler's first refresh on, not from the end of its
// calibration (four refreshes, ~400 ms): the refresh intervals calibration
// read become windows on the refresh grid once the phase is known, with
// the SM activity the timeline says, and the steady windows chain on from
// the last of them.
//
// On a loaded host the first calibration sometimes ends with its pairs
// off the chain (0 windows before alignment in 2 of 10 runs at load
// 5-23, and once in CI): the scenario runs up to three times, and fails
// only when none of them kept the calibration's refreshes. The windows'
// grid, skew and SM activity are held in every run.
func TestSimGPMWindowsFromCalibration(t *testing.T) {
	var missed []string
	for attempt := 1; attempt <= 3; attempt++ {
		var before int
		var lead int64
		// A subtest each: the writer and the sampler of one run are
		// closed before the next starts.
		var skipped bool
		t.Run(fmt.Sprint("run", attempt), func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			before, lead = simWindowsFromCalibration(t)
		})
		if skipped {
			t.Skip("the scenario's run was skipped (see the subtest)")
		}
		if before >= 3 && lead >= 2*int64(simGPMRefresh) {
			t.Logf("%d windows before alignment; the first ends %v before it (attempt %d)", before, time.Duration(lead), attempt)
			return
		}
		missed = append(missed, fmt.Sprintf("%d windows before alignment, the first ending %v before it", before, time.Duration(lead)))
	}
	t.Errorf("in 3 runs the calibration's refreshes were not kept (want ≥ 3 windows before the sampler aligned, the first ending ≥ %v before): %s",
		time.Duration(2*simGPMRefresh), strings.Join(missed, "; "))
}

// simWindowsFromCalibration runs the scenario once: the GPM windows ending
// before the sampler logged its alignment, and how long before it the
// first ends.
func simWindowsFromCalibration(t *testing.T) (before int, lead int64) {
	t.Helper()
	w := startWriter(t)
	off := realMinusMono()
	// Computing from before the sampler starts, for 3 s.
	p := testPattern(monoNow()-int64(200*time.Millisecond), 45)
	p.write(w)
	logs := &alignLog{}
	s := openSim(t, Config{SampleInterval: 30 * time.Millisecond, Logger: slog.New(logs)})
	gp := bySource(collect(t, s, 8*time.Second, func(ws []event.GPUWindow) bool {
		g := bySource(ws, event.SourceGPM)
		return len(g) >= 12
	}), event.SourceGPM)
	checkContiguous(t, gp)
	aligned := logs.at()
	if aligned == 0 {
		t.Fatal("the sampler never logged its alignment")
	}
	R, phase := int64(simGPMRefresh), int64(simGPMPhase)
	for i, win := range gp {
		a, b := win.Start-off, win.End-off
		if win.Skew != 0 {
			t.Errorf("gpm window %d [%d,%d) has skew %v: the sampler aligned before any window", i, a, b, time.Duration(win.Skew))
		}
		ra := (a-phase+R/2)/R*R + phase
		rb := (b-phase+R/2)/R*R + phase
		if abs(a-ra) > int64(gpmMargin) || abs(b-rb) > int64(gpmMargin) {
			t.Errorf("gpm window %d [%d,%d) off the refresh grid by %v / %v", i, a, b, time.Duration(a-ra), time.Duration(b-rb))
			continue
		}
		if win.End < aligned {
			before++
			k, c := p.busy(ra, rb)
			want := (float64(k) + 0.05*float64(c)) / float64(rb-ra)
			if math.Abs(win.SMActivity-want) > 0.005 {
				t.Errorf("calibration window %d: SM activity %.3f, timeline says %.3f", i, win.SMActivity, want)
			}
		}
	}
	return before, aligned - gp[0].End
}

// alignLog is a slog handler that keeps when the sampler logged its
// alignment to the counter refresh (Unix ns).
type alignLog struct {
	mu sync.Mutex
	t  int64
}

func (l *alignLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *alignLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "aligned to the counter refresh") {
		l.mu.Lock()
		if l.t == 0 {
			l.t = r.Time.UnixNano()
		}
		l.mu.Unlock()
	}
	return nil
}
func (l *alignLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *alignLog) WithGroup(string) slog.Handler      { return l }

func (l *alignLog) at() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t
}
