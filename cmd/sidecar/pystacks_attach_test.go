package main_test

// Python call sites where a user meets a Python trainer other than under
// `gaptrace run`: attached to one that already trains, and in a PID
// namespace of its own (a container) traced from the host.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// pyStallKinds are pytrain's stalls without --peer, each blocking in a
// function of its own.
var pyStallKinds = []string{"read", "sleep"}

// minStallsPerKind is how many stalls of each kind must run after the
// probes settled; minPyNamedShare of their gaps must name the stall's own
// blocking call.
const (
	minStallsPerKind = 15
	minPyNamedShare  = 0.9
)

// pyName names an interpreter in a subtest: "3.12-libpython" when its
// interpreter is in libpython, "3.11-static" when in the executable.
func pyName(t *testing.T, py string) string {
	t.Helper()
	b, err := exec.Command(py, "-c", "import sys; print('%d.%d' % sys.version_info[:2], int('libpython' in open('/proc/self/maps').read()))").Output()
	if err != nil {
		t.Fatalf("%s: %v", py, err)
	}
	v, shared, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if shared == "1" {
		return v + "-libpython"
	}
	return v + "-static"
}

// pytrainJob is pytrain.py on the simulated GPU until interrupted: its
// stalls alternate between an O_DIRECT read and a sleep every third step,
// and no background thread competes for the GIL, so each stall's gap is
// the stall's.
func pytrainJob(t *testing.T, py, dir, truth string) []string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "testdata", "simgpu", "pytrain.py"))
	if err != nil {
		t.Fatal(err)
	}
	return []string{py, script, "--lib", simgpuDir, "--truth", truth, "--steps", strconv.Itoa(untilStopped),
		"--burst-every", strconv.Itoa(untilStopped), "--stall-every", "3", "--stall-ms", "25", "--data-dir", dir}
}

// pyTruth is one record of pytrain's truth file.
type pyTruth struct {
	Type     string `json:"type"`
	Kind     string `json:"kind"`
	PID      int    `json:"pid"`
	Start    int64  `json:"start"`
	End      int64  `json:"end"`
	Function string `json:"function"`
	File     string `json:"file"`
	Line     int    `json:"line"`
}

// pyStalls reads the stalls of a truth file being written that began at or
// after from and ended by until (Unix ns; until 0: any end); a line still
// being written is not a record yet.
func pyStalls(truth string, from, until int64) []pyTruth {
	b, err := os.ReadFile(truth)
	if err != nil {
		return nil
	}
	var out []pyTruth
	for _, line := range strings.Split(string(b), "\n") {
		var r pyTruth
		if json.Unmarshal([]byte(line), &r) == nil && r.Type == "stall" && r.Start >= from && (until == 0 || r.End <= until) {
			out = append(out, r)
		}
	}
	return out
}

// waitForPyStalls waits for gaptrace to attach to libcuda, then for the job
// to run minStallsPerKind stalls of each kind that began a second or more
// later (the first tracing second is not scored: the process scan that
// finds the interpreter runs then), and returns that second's start.
func waitForPyStalls(t *testing.T, gt *gtProc, truth string) int64 {
	t.Helper()
	gt.waitFor(t, attached, time.Minute)
	from := time.Now().Add(time.Second).UnixNano()
	var n map[string]int
	if !testutil.Poll(3*time.Minute, 100*time.Millisecond, func() bool {
		n = map[string]int{}
		for _, s := range pyStalls(truth, from, 0) {
			n[s.Kind]++
		}
		for _, k := range pyStallKinds {
			if n[k] < minStallsPerKind {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the job ran %v stalls past the first traced second, want %d of each kind\n%s", n, minStallsPerKind, gt.stderr)
	}
	return from
}

// checkPyStallSites checks that the gaps of the stalls that ran between
// from and until, while gaptrace traced, are charged to each stall's
// blocking call (function, file and line as the interpreter numbers them),
// in the gaps file and the spans, and returns per kind "named/gaps" and
// the gaps' causes. A gap labelled cpu.contention is not judged: on a
// loaded machine a stall's gap may be the job waiting for a CPU, charged
// to the call it waited after (the sync), which is right for that cause.
func checkPyStallSites(t *testing.T, dir, truth string, from, until int64) string {
	t.Helper()
	gaps := readGaps(t, filepath.Join(dir, "gaps.jsonl"))
	stalls := pyStalls(truth, from, until)
	inside := func(g correlate.Gap, s pyTruth) bool {
		ov := min(g.End, s.End) - max(g.Start, s.Start)
		return ov > 0 && 2*ov >= g.Duration
	}
	type tally struct {
		stalls, gaps, named, contended int
		causes                         map[correlate.Cause]int
	}
	by := map[string]*tally{}
	want := map[string]event.Frame{}
	for _, k := range pyStallKinds {
		by[k] = &tally{causes: map[correlate.Cause]int{}}
	}
	for _, s := range stalls {
		k := by[s.Kind]
		if k == nil {
			t.Fatalf("unexpected stall kind %q in %s", s.Kind, truth)
		}
		k.stalls++
		w := event.Frame{Function: s.Function, File: s.File, Line: s.Line}
		want[s.Kind] = w
		for _, g := range gaps {
			if !inside(g, s) {
				continue
			}
			if g.Cause == correlate.CauseCPUContention {
				k.contended++
				continue
			}
			k.gaps++
			k.causes[g.Cause]++
			if f, ok := correlate.SiteFrame(g.Evidence.Stack); ok && f == w {
				k.named++
			} else if k.gaps-k.named <= 2 {
				t.Logf("%s stall gap (%s, %.1f ms) charged to %q, want %q:%s", s.Kind, g.Cause, float64(g.Duration)/1e6,
					correlate.CallSite(f), correlate.CallSite(w), stackString(g))
			}
		}
	}
	var res []string
	for _, kind := range pyStallKinds {
		k := by[kind]
		res = append(res, fmt.Sprintf("%s %d/%d %v", kind, k.named, k.gaps, k.causes))
		// Most stalls have a gap of their own.
		if k.gaps < (k.stalls+1)/2 || k.gaps == 0 {
			t.Errorf("%s: %d gaps inside %d stalls, %d more of cpu.contention",
				kind, k.gaps, k.stalls, k.contended)
			continue
		}
		if share := float64(k.named) / float64(k.gaps); share < minPyNamedShare {
			t.Errorf("%s: %d of %d gaps name the stall's call %s, want ≥ %.0f%%",
				kind, k.named, k.gaps, correlate.CallSite(want[kind]), 100*minPyNamedShare)
		}
	}
	checkSpansName(t, filepath.Join(dir, "spans.jsonl"), want)
	return strings.Join(res, ", ")
}

// checkSpansName looks for a gap span per stall kind whose code.*
// attributes are the stall's call.
func checkSpansName(t *testing.T, path string, want map[string]event.Frame) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		var sp struct {
			Attributes map[string]any `json:"attributes"`
		}
		if json.Unmarshal([]byte(line), &sp) != nil {
			continue
		}
		a := sp.Attributes
		n, _ := a["code.line.number"].(float64)
		for kind, w := range want {
			if a["code.function.name"] == w.Function && a["code.file.path"] == w.File && int(n) == w.Line {
				found[kind] = true
			}
		}
	}
	for kind, w := range want {
		if !found[kind] {
			t.Errorf("no span of a %s stall gap with code.function.name %s, code.file.path %s, code.line.number %d", kind, w.Function, w.File, w.Line)
		}
	}
}

func pyOutFlags(dir string) []string {
	return []string{"--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--gaps-out", filepath.Join(dir, "gaps.jsonl"), "--spans-out", filepath.Join(dir, "spans.jsonl")}
}

// waitForCUDA waits until pid has mapped libcuda and its truth file names
// the trainer: it trains.
func waitForCUDA(t *testing.T, p *gtProc, pid int, truth string) {
	t.Helper()
	if !testutil.Poll(time.Minute, 20*time.Millisecond, func() bool {
		libs, err := proc.Libraries(pid, "libcuda.so")
		b, _ := os.ReadFile(truth)
		return err == nil && len(libs["libcuda.so"]) > 0 && strings.Contains(string(b), `"type": "step"`)
	}) {
		t.Fatalf("pid %d never trained on libcuda\n%s", pid, p.stderr)
	}
}

// pythonStacksLog is the tracer's word that it walks a process's Python
// frames: pid's, or any process's for pid 0.
func pythonStacksLog(pid int) *regexp.Regexp {
	if pid == 0 {
		return regexp.MustCompile(`"python stacks".* pid=\d+ `)
	}
	return regexp.MustCompile(fmt.Sprintf(`"python stacks".* pid=%d `, pid))
}

// TestPythonStacksAttach attaches to a Python trainer that already runs
// with CUDA loaded, under each interpreter: its stall gaps name the
// stall's blocking call.
func TestPythonStacksAttach(t *testing.T) {
	need(t)
	for _, py := range testutil.Pythons(t) {
		t.Run(pyName(t, py), func(t *testing.T) {
			dir := t.TempDir()
			truth := filepath.Join(dir, "truth.jsonl")
			environ := env(t)
			job := startArgv(t, environ, pytrainJob(t, py, dir, truth)...)
			pid := job.cmd.Process.Pid
			waitForCUDA(t, job, pid, truth)
			gt := start(t, environ, append([]string{"attach", "--pid", strconv.Itoa(pid)}, pyOutFlags(dir)...)...)
			from := waitForPyStalls(t, gt, truth)
			until := time.Now().UnixNano()
			if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
				t.Fatalf("interrupt the job: %v", err)
			}
			if code := gt.wait(t, 2*time.Minute); code != 0 {
				t.Fatalf("exit %d\n%s", code, gt.stderr)
			}
			if !pythonStacksLog(pid).MatchString(gt.stderr.String()) {
				t.Errorf("no python stacks for pid %d:\n%s", pid, gt.stderr)
			}
			res := checkPyStallSites(t, dir, truth, from, until)
			t.Logf("%s: gaps naming their stall's call: %s", py, res)
		})
	}
}

// TestPythonStacksChildPidNamespace traces a Python trainer that is pid 1
// of a PID namespace of its own, with /proc mounted for it, as a container
// runs it: from the host by its host pid (a DaemonSet with hostPID) and by
// --match, which finds the container's unshare and follows its child; and
// by a gaptrace that itself runs in a PID namespace with the job in one
// below it, so that the programs translate every thread id into
// gaptrace's namespace, where the interpreter's entry is keyed.
func TestPythonStacksChildPidNamespace(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	pys := testutil.Pythons(t)
	// The static build and the newest libpython build: the interpreter
	// is found in the executable and in a library, through the job's
	// /proc/PID/root.
	if len(pys) > 2 {
		pys = []string{pys[0], pys[len(pys)-1]}
	}
	unshare := []string{"unshare", "--pid", "--fork", "--mount-proc"}
	type way struct {
		name string
		// start starts the job and gaptrace, and returns gaptrace, the
		// job's pid as this test sees it, the pid to interrupt to end
		// the trace, and the job's pid as gaptrace numbers it.
		start func(t *testing.T, environ []string, job []string, dir, truth string) (gt *gtProc, pid, stop, gtPID int)
	}
	ways := []way{
		{"attach-pid", func(t *testing.T, environ, job []string, dir, truth string) (*gtProc, int, int, int) {
			u, pid := startTrainerInChildNS(t, environ, job)
			waitForCUDA(t, u, pid, truth)
			gt := start(t, environ, append([]string{"attach", "--pid", strconv.Itoa(pid)}, pyOutFlags(dir)...)...)
			return gt, pid, pid, pid // attach --pid ends with the job
		}},
		{"match", func(t *testing.T, environ, job []string, dir, truth string) (*gtProc, int, int, int) {
			u, pid := startTrainerInChildNS(t, environ, job)
			waitForCUDA(t, u, pid, truth)
			// The truth path is this job's alone.
			gt := start(t, environ, append([]string{"attach", "--match", regexp.QuoteMeta(truth)}, pyOutFlags(dir)...)...)
			// --match waits for the next matching process once the job
			// exits: gaptrace is interrupted.
			return gt, pid, gt.cmd.Process.Pid, pid
		}},
		{"nested-run", func(t *testing.T, environ, job []string, dir, truth string) (*gtProc, int, int, int) {
			argv := append(append(append([]string{}, unshare...), gaptraceBin, "run"), pyOutFlags(dir)...)
			argv = append(append(append(argv, "--"), unshare...), job...)
			gt := startArgv(t, environ, argv...)
			pid := findJob(t, gt)
			return gt, pid, pid, 0 // its pid in gaptrace's namespace: whichever it got
		}},
	}
	for _, py := range pys {
		v := pyName(t, py)
		for _, w := range ways {
			t.Run(v+"/"+w.name, func(t *testing.T) {
				dir := t.TempDir()
				truth := filepath.Join(dir, "truth.jsonl")
				gt, pid, stop, gtPID := w.start(t, env(t), pytrainJob(t, py, dir, truth), dir, truth)
				from := waitForPyStalls(t, gt, truth)
				until := time.Now().UnixNano()
				if err := syscall.Kill(stop, syscall.SIGINT); err != nil {
					t.Fatalf("interrupt %d: %v", stop, err)
				}
				if code := gt.wait(t, 2*time.Minute); code != 0 {
					t.Fatalf("exit %d\n%s", code, gt.stderr)
				}
				if !pythonStacksLog(gtPID).MatchString(gt.stderr.String()) {
					t.Errorf("no python stacks for pid %d (host pid %d):\n%s", gtPID, pid, gt.stderr)
				}
				var meta pyTruth
				for _, line := range strings.Split(readFile(t, truth), "\n") {
					if json.Unmarshal([]byte(line), &meta) == nil && meta.Type == "meta" {
						break
					}
				}
				if meta.PID != 1 || pid == 1 {
					t.Errorf("the job is pid %d of its namespace and %d here, want 1 and another: not the layout under test", meta.PID, pid)
				}
				res := checkPyStallSites(t, dir, truth, from, until)
				t.Logf("%s %s: gaps naming their stall's call: %s", py, w.name, res)
			})
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
