package gpusample

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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
