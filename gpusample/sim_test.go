package gpusample

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// The simulated NVML is built once per test binary. go-nvml binds NVML
// symbols process-wide, so every test here uses this one library; a test
// against a real driver runs in a child process (see hardware_test.go).
var (
	simLib    string // path of the built libnvidia-ml.so.1, "" if the build failed
	simWriter string
	simErr    error
	simDir    string // SIMGPU_DIR shared by the writer and the library
	simTmp    string // where the first needSim builds them
	simOnce   sync.Once
)

const (
	simSamplePeriod = 50 * time.Millisecond  // SIMGPU_SAMPLE_MS
	simGPMRefresh   = 100 * time.Millisecond // SIMGPU_GPM_REFRESH_MS
	simGPMPhase     = 37 * time.Millisecond  // SIMGPU_GPM_PHASE_MS: refreshes off the 100 ms grid
)

func TestMain(m *testing.M) {
	if os.Getenv(hwChildEnv) == "" {
		tmp, err := os.MkdirTemp("", "gaptrace-gpu-test")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		simTmp = tmp
		simDir = filepath.Join(tmp, "shm")
		_ = os.Mkdir(simDir, 0o755)
		// The library reads these at each call; set before any Open.
		os.Setenv("SIMGPU_DIR", simDir)
		os.Setenv("SIMGPU_SAMPLE_MS", fmt.Sprint(simSamplePeriod.Milliseconds()))
		os.Setenv("SIMGPU_GPM_REFRESH_MS", fmt.Sprint(simGPMRefresh.Milliseconds()))
		os.Setenv("SIMGPU_GPM_PHASE_MS", fmt.Sprint(simGPMPhase.Milliseconds()))
		code := m.Run()
		os.RemoveAll(tmp)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func buildSim(dir string) error {
	src, err := filepath.Abs("../testdata/simgpu")
	if err != nil {
		return err
	}
	out := filepath.Join(dir, "lib")
	lib := filepath.Join(out, "libnvidia-ml.so.1")
	// The project's Makefile is the build of record; build only our target.
	cmd := exec.Command("make", "-s", "-C", src, "OUT="+out, lib)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make %s: %w\n%s", lib, err, b)
	}
	writer := filepath.Join(dir, "writer")
	cmd = exec.Command("gcc", "-O2", "-Wall", "-pthread", "-I"+src, "-o", writer, "testdata/writer.c",
		filepath.Join(src, "timeline.c"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build writer: %w\n%s", err, b)
	}
	simLib, simWriter = lib, writer
	return nil
}

// needSim builds the simulated NVML on first use, so that the quick tier
// (-short), which skips here, builds nothing.
func needSim(t testing.TB) {
	t.Helper()
	testutil.SkipShort(t, "the simulated GPU build")
	simOnce.Do(func() { simErr = buildSim(simTmp) })
	if simErr != nil {
		t.Fatalf("simulated NVML unavailable: %v", simErr)
	}
}

// writer drives the simulated timeline of device 0.
type writer struct {
	t   testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
	mu  sync.Mutex
}

func startWriter(t testing.TB) *writer {
	t.Helper()
	needSim(t)
	// Each test starts from an empty timeline.
	os.Remove(filepath.Join(simDir, "gaptrace-simgpu-0"))
	cmd := exec.Command(simWriter, "0")
	cmd.Env = append(os.Environ(), "SIMGPU_DIR="+simDir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &writer{t: t, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		in.Close()
		_ = cmd.Wait()
	})
	return w
}

func (w *writer) do(format string, args ...any) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := fmt.Fprintf(w.in, format+"\n", args...); err != nil {
		w.t.Fatalf("writer: %v", err)
	}
	line, err := w.out.ReadString('\n')
	if err != nil {
		w.t.Fatalf("writer: %v", err)
	}
	return strings.TrimSpace(line)
}

func (w *writer) add(start, end int64, kind uint32) {
	if r := w.do("add %d %d %d 0", start, end, kind); r != "ok" {
		w.t.Fatalf("writer add: %q", r)
	}
}

func (w *writer) pid(pid int) {
	if r := w.do("pid %d 0", pid); r != "ok" {
		w.t.Fatalf("writer pid: %q", r)
	}
}

const (
	kindKernel     = 1
	kindCollective = 2
)

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// realMinusMono converts monotonic to Unix time: Unix = mono + offset.
func realMinusMono() int64 {
	a := time.Now().UnixNano()
	m := monoNow()
	b := time.Now().UnixNano()
	return (a+b)/2 - m
}

// pattern is a known busy timeline: slots of slotLen, each with a kernel
// busy fraction and a collective busy fraction after it.
type pattern struct {
	start   int64 // mono ns
	slotLen int64
	kernel  []float64
	coll    []float64
}

func (p pattern) end() int64 { return p.start + int64(len(p.kernel))*p.slotLen }

func (p pattern) write(w *writer) {
	for i := range p.kernel {
		s := p.start + int64(i)*p.slotLen
		k := int64(p.kernel[i] * float64(p.slotLen))
		c := int64(p.coll[i] * float64(p.slotLen))
		if k > 0 {
			w.add(s, s+k, kindKernel)
		}
		if c > 0 {
			w.add(s+k, s+k+c, kindCollective)
		}
	}
}

// busy returns the kernel and collective busy ns in [a,b) (mono).
func (p pattern) busy(a, b int64) (kernel, coll int64) {
	for i := range p.kernel {
		s := p.start + int64(i)*p.slotLen
		k := int64(p.kernel[i] * float64(p.slotLen))
		c := int64(p.coll[i] * float64(p.slotLen))
		kernel += overlap(a, b, s, s+k)
		coll += overlap(a, b, s+k, s+k+c)
	}
	return
}

func overlap(a, b, c, d int64) int64 { return max(0, min(b, d)-max(a, c)) }

// testPattern mixes compute, NCCL-style collectives and idle in 70 ms
// slots (not a divisor of either sampling period, so windows see mixes).
func testPattern(start int64, n int) pattern {
	p := pattern{start: start, slotLen: int64(70 * time.Millisecond)}
	ks := []float64{1, 0, 0.5, 0.2, 0, 0.9, 0.3, 0}
	cs := []float64{0, 0, 0.5, 0, 0.8, 0, 0, 0}
	for i := range n {
		p.kernel = append(p.kernel, ks[i%len(ks)])
		p.coll = append(p.coll, cs[i%len(cs)])
	}
	return p
}

func openSim(t testing.TB, cfg Config) *Source {
	t.Helper()
	needSim(t)
	cfg.LibPath = simLib
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("open simulated NVML: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// collect runs s until cond holds on the windows seen (or the deadline).
func collect(t *testing.T, s *Source, deadline time.Duration, cond func([]event.GPUWindow) bool) []event.GPUWindow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	ch := make(chan event.GPUWindow, 64)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ch) }()
	var got []event.GPUWindow
	for ctx.Err() == nil {
		select {
		case w := <-ch:
			got = append(got, w)
			if cond(got) {
				cancel()
			}
		case <-ctx.Done():
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	return got
}

func bySource(ws []event.GPUWindow, src event.WindowSource) []event.GPUWindow {
	var out []event.GPUWindow
	for _, w := range ws {
		if w.Source == src {
			out = append(out, w)
		}
	}
	return out
}

// checkContiguous: each (device, source) sequence is contiguous, strictly
// increasing, without duplicates.
func checkContiguous(t *testing.T, ws []event.GPUWindow) {
	t.Helper()
	for i := 1; i < len(ws); i++ {
		if ws[i].Start != ws[i-1].End {
			t.Errorf("%s window %d starts at %d, previous ended at %d (gap or overlap)",
				ws[i].Source, i, ws[i].Start, ws[i-1].End)
		}
		if ws[i].End <= ws[i].Start {
			t.Errorf("%s window %d empty or reversed: [%d,%d)", ws[i].Source, i, ws[i].Start, ws[i].End)
		}
	}
}

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

func writeHW(t *testing.T, content string) {
	t.Helper()
	path := filepath.Join(simDir, "gaptrace-simgpu-0.hw")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
}

func findCheck(fs []Finding, check string) (Finding, bool) {
	for _, f := range fs {
		if f.Check == check {
			return f, true
		}
	}
	return Finding{}, false
}

func TestSimHealthFindings(t *testing.T) {
	startWriter(t)
	s := openSim(t, Config{})
	fs := s.Health()
	for _, c := range []string{CheckPCIe, CheckThrottle, CheckTemperature, CheckECC, CheckPersistence, CheckProcesses, CheckXid, CheckGPM} {
		f, ok := findCheck(fs, c)
		if !ok || f.Level != OK {
			t.Errorf("healthy simulated GPU: %s = %+v (found %v)", c, f, ok)
		}
	}

	// A degraded card: x8 link, power capped and HW thermal slowdown, ECC
	// errors, persistence off, hot.
	writeHW(t, "pcie_width=8\nthrottle=0x44\necc_uncorrected=2\necc_corrected=5\npersistence=0\ntemp_c=85\n")
	s2 := openSim(t, Config{})
	fs = s2.Health()
	want := map[string]Level{CheckPCIe: WARN, CheckThrottle: FAIL, CheckECC: FAIL, CheckPersistence: WARN, CheckTemperature: WARN}
	for c, lvl := range want {
		f, ok := findCheck(fs, c)
		if !ok || f.Level != lvl || f.Fix == "" {
			t.Errorf("%s: got %+v, want level %v with a fix", c, f, lvl)
		}
	}
	if f, _ := findCheck(fs, CheckPCIe); !strings.Contains(f.Detail, "Gen5 x8") || !strings.Contains(f.Detail, "Gen5 x16") {
		t.Errorf("pcie detail: %q", f.Detail)
	}
	if f, _ := findCheck(fs, CheckThrottle); !strings.Contains(f.Detail, "sw_power_cap") || !strings.Contains(f.Detail, "hw_thermal_slowdown") {
		t.Errorf("throttle detail: %q", f.Detail)
	}

	// A low PCIe generation while idle is power saving, not a fault.
	writeHW(t, "pcie_gen=1\n")
	if f, _ := findCheck(s2.Health(), CheckPCIe); f.Level != OK || !strings.Contains(f.Detail, "idle") {
		t.Errorf("idle Gen1 link: %+v", f)
	}
}

func TestSimChangesDuringRun(t *testing.T) {
	w := startWriter(t)
	self := os.Getpid()
	w.pid(self)
	s := openSim(t, Config{HWInterval: 40 * time.Millisecond})
	if got := s.DevicesForPID(self); !slices.Equal(got, []int{0}) {
		t.Fatalf("DevicesForPID(self) = %v, want [0]", got)
	}
	if got := s.DevicesForPID(1); len(got) != 0 {
		t.Fatalf("DevicesForPID(1) = %v, want none", got)
	}
	s.SetTraced([]int{self})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan event.GPUWindow, 1024)
	done := make(chan error, 1)
	runStart := time.Now().UnixNano()
	go func() { done <- s.Run(ctx, ch) }()
	go func() {
		for range ch {
		}
	}()

	waitChange := func(check string, lvl Level, contains string) Finding {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case f := <-s.Changes():
				if f.Check == check && f.Level == lvl && strings.Contains(f.Detail, contains) {
					return f
				}
			case <-deadline:
				t.Fatalf("no %s change to %v containing %q", check, lvl, contains)
			}
		}
	}
	// Let the baseline be read before changing anything.
	deadline := time.Now().Add(5 * time.Second)
	for len(s.devs[0].snapshotsCopy()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no hardware snapshot")
		}
		time.Sleep(5 * time.Millisecond)
	}

	writeHW(t, "pcie_width=8\n")
	waitChange(CheckPCIe, WARN, "x8")
	writeHW(t, "pcie_width=8\nthrottle=0x4\n")
	waitChange(CheckThrottle, WARN, "sw_power_cap")

	if err := os.WriteFile(filepath.Join(simDir, "gaptrace-simgpu-0.xid"), []byte("79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(CheckXid, FAIL, "Xid 79")

	// Another process takes a context on the GPU: the writer itself.
	w.pid(w.cmd.Process.Pid)
	waitChange(CheckProcesses, WARN, fmt.Sprint(w.cmd.Process.Pid))

	hc := s.HWContext(0, runStart, time.Now().UnixNano()+1)
	if !slices.Contains(hc.XidErrors, 79) || !slices.Contains(hc.ThrottleReasons, "sw_power_cap") ||
		hc.PCIeWidth != 8 || !slices.Contains(hc.OtherProcesses, uint32(w.cmd.Process.Pid)) ||
		slices.Contains(hc.OtherProcesses, uint32(self)) || hc.SMClockMHz >= hc.MaxSMClockMHz {
		t.Errorf("hw context: %+v", hc)
	}
	if st := s.Stats(); st.Xids != 1 {
		t.Errorf("xids counted: %d", st.Xids)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func (d *device) snapshotsCopy() []hwSnapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.snaps)
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

func TestSimInitPermission(t *testing.T) {
	needSim(t)
	t.Setenv("SIMGPU_NVML_INIT_RETURN", "4") // NVML_ERROR_NO_PERMISSION
	_, err := Open(Config{LibPath: simLib})
	if !errors.Is(err, ErrPermission) {
		t.Fatalf("Open = %v, want ErrPermission", err)
	}
	if f := Unavailable(err); f.Level != WARN || f.Check != CheckNVML || !strings.Contains(f.Fix, "/dev/nvidia") {
		t.Errorf("unavailable finding: %+v", f)
	}
}

func TestOpenNoLibrary(t *testing.T) {
	_, err := Open(Config{LibPath: filepath.Join(t.TempDir(), "libnvidia-ml.so.1")})
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("Open = %v, want ErrNoNVML", err)
	}
	if !strings.Contains(err.Error(), "libnvidia-ml.so.1") {
		t.Errorf("error does not name the library: %v", err)
	}
	if f := Unavailable(err); !strings.Contains(f.Fix, "--nvml-lib") {
		t.Errorf("unavailable finding: %+v", f)
	}
}

func TestLibPathFromEnv(t *testing.T) {
	t.Setenv("GAPTRACE_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
	_, err := Open(Config{})
	if !errors.Is(err, ErrNoNVML) || !strings.Contains(err.Error(), "/nonexistent/") {
		t.Fatalf("Open = %v, want ErrNoNVML naming the GAPTRACE_NVML_LIB path", err)
	}
}

// BenchmarkSample measures one incremental utilization read and one GPM
// snapshot against the simulated NVML (the go-nvml call path included).
func BenchmarkSample(b *testing.B) {
	needSim(b)
	s := openSim(b, Config{})
	d := s.devs[0]
	b.Run("GetSamples", func(b *testing.B) {
		r := &utilReader{}
		for b.Loop() {
			s.readSamples(d, r)
		}
	})
	b.Run("GpmSampleGet", func(b *testing.B) {
		g := &gpmSampler{s: s, d: d}
		smp, ret := s.lib.GpmSampleAlloc()
		if ret != 0 {
			b.Fatal(ret)
		}
		defer func() { _ = smp.Free() }()
		for b.Loop() {
			g.get(smp)
		}
	})
}

// The simulated NVML must export every entry point the source may call
// (go-nvml binds lazily: a missing one kills the process on first call).
func TestSimExportsEverything(t *testing.T) {
	s := openSim(t, Config{})
	v := reflect.ValueOf(s.have)
	for i := range v.NumField() {
		if !v.Field(i).Bool() {
			t.Errorf("simulated NVML lacks the entry points of feature %q", v.Type().Field(i).Name)
		}
	}
}

// The simulated NVML's files (nvml*.c) are checked against the official
// prototypes and layouts: built with go-nvml's nvml.h instead of their own
// declarations, any signature that differs fails to compile.
func TestSimNVMLMatchesHeader(t *testing.T) {
	needSim(t)
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("locate go-nvml: %v", err)
	}
	inc := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	src, _ := filepath.Abs("../testdata/simgpu")
	files, err := filepath.Glob(filepath.Join(src, "nvml*.c"))
	if err != nil || len(files) < 2 {
		t.Fatalf("simulated NVML sources in %s: %v %v", src, files, err)
	}
	args := append([]string{"-std=gnu11", "-Wall", "-Werror", "-Wno-deprecated-declarations", "-fsyntax-only",
		"-DSIMGPU_CHECK_NVML_H", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-I" + inc, "-I" + src}, files...)
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("%v against %s/nvml.h: %v\n%s", files, inc, err, b)
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
