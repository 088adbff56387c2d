package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/hang"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// hangAfter is the threshold the hang tests run with; detection must
// follow within hangSlack of it (one tick of the watch, plus a loaded
// machine's delay).
const (
	hangAfter = 2 * time.Second
	hangSlack = 3 * time.Second
)

// hangRecords reads the hang records of a gaps file (the gaps between
// them are skipped).
func hangRecords(t *testing.T, path string) []hang.Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []hang.Report
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), `"kind":"hang"`) {
			continue
		}
		var r hang.Report
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("hang record does not parse: %v\n%s", err, sc.Text())
		}
		out = append(out, r)
	}
	return out
}

// awaitHang waits for a hang record that match accepts.
func awaitHang(t *testing.T, p *gtProc, gaps string, d time.Duration, what string, match func(*hang.Report) bool) hang.Report {
	t.Helper()
	var got hang.Report
	ok := testutil.Poll(d, 100*time.Millisecond, func() bool {
		for _, r := range hangRecords(t, gaps) {
			if match(&r) {
				got = r
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no hang record (%s) within %v; records: %+v\nstderr:\n%s", what, d, hangRecords(t, gaps), p.stderr)
	}
	return got
}

// checkPrompt holds a report to the threshold: detected no sooner than
// --hang-after after its call began, and within a tick and slack of it.
func checkPrompt(t *testing.T, r *hang.Report) time.Duration {
	t.Helper()
	lat := time.Duration(r.Detected - r.Since)
	if lat < hangAfter || lat > hangAfter+hangSlack {
		t.Errorf("hang detected %v after its call began, want %v..%v", lat, hangAfter, hangAfter+hangSlack)
	}
	if len(r.Stacks) == 0 {
		t.Error("hang record carries no stacks")
	}
	return lat
}

// truthPID waits for a simtrain/pytrain truth file's meta record and
// n step records, and returns the pid.
func truthPID(t *testing.T, path string, steps int, d time.Duration) int {
	t.Helper()
	pid := 0
	if !testutil.Poll(d, 50*time.Millisecond, func() bool {
		b, _ := os.ReadFile(path)
		pid = 0
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			var rec struct {
				Type string `json:"type"`
				PID  int    `json:"pid"`
			}
			if json.Unmarshal([]byte(l), &rec) != nil {
				continue
			}
			switch rec.Type {
			case "meta":
				pid = rec.PID
			case "step":
				n++
			}
		}
		return pid > 0 && n >= steps
	}) {
		b, _ := os.ReadFile(path)
		t.Fatalf("%s: no meta and %d steps within %v:\n%s", path, steps, d, b)
	}
	return pid
}

// ranksJob starts two simtrain ranks that rendezvous on every all-reduce
// under gaptrace run --hang-after 2s, and returns gaptrace, the ranks' pids
// and the paths of the gaps and spans files.
func ranksJob(t *testing.T, rank1Extra string, extraFlags ...string) (p *gtProc, pids [2]int, gaps, spans string) {
	t.Helper()
	dir := t.TempDir()
	tl := t.TempDir()
	id := fmt.Sprintf("hang%d", time.Now().UnixNano())
	rank := func(r int, extra string) string {
		return fmt.Sprintf("RANK=%d WORLD_SIZE=2 %s --truth %s --rank %d --nranks 2 --device %d --steps 1000000 "+
			"--collectives 1 --kernels-per-step 9 --kernel-us 1500 --comm-id %s --workers 0 --quiet --await-probes 60 %s",
			r, filepath.Join(simgpuDir, "simtrain"), filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), r, r, id, extra)
	}
	gaps, spans = filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "spans.jsonl")
	args := append([]string{"run", "--live", "off", "--hang-after", hangAfter.String(), "--gaps-out", gaps,
		"--spans-out", spans, "--summary-json", filepath.Join(dir, "summary.json"), "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1")}, extraFlags...)
	args = append(args, "--", "sh", "-c", rank(0, "")+" & "+rank(1, rank1Extra)+"; wait")
	environ := append(os.Environ(), "SIMGPU_DIR="+tl, "SIMGPU_DEVICES=2", "GAPTRACE_RUN_DIR="+filepath.Join(dir, "run"))
	p = start(t, environ, args...)
	for r := range 2 {
		pids[r] = truthPID(t, filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), 20, 90*time.Second)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return p, pids, gaps, spans
}

// waitingOn matches rank 0's report of a wait in its all-reduce sync for
// rank 1 in state.
func waitingOn(rank0, rank1 int, state string) func(*hang.Report) bool {
	return func(r *hang.Report) bool {
		return r.PID == uint32(rank0) && r.Status == hang.Ongoing && len(r.Missing) == 1 &&
			r.Missing[0].PID == uint32(rank1) && r.Missing[0].Rank == 1 && r.Missing[0].State == state
	}
}

func checkCollectiveWait(t *testing.T, r *hang.Report) {
	t.Helper()
	c := r.Call.Collective
	if r.Call.Name != "cuStreamSynchronize" || c == nil || c.Op != "AllReduce" || c.Ranks != 2 || c.Rank != 0 || c.Bytes == 0 {
		t.Errorf("waiting call %+v collective %+v, want rank 0's all-reduce sync", r.Call, c)
	}
	if r.Rank != 0 || len(r.Arrived) != 1 || r.Arrived[0].Rank != 0 {
		t.Errorf("rank %d arrived %+v", r.Rank, r.Arrived)
	}
	checkWaiterStack(t, r, "rdv_settle") // the simulated NCCL kernel's spin
}

// checkWaiterStack: the waiting thread's native stack, taken at detection
// while it spins in its sync (as NCCL's does), holds fn.
func checkWaiterStack(t *testing.T, r *hang.Report, fn string) {
	t.Helper()
	for _, st := range r.Stacks {
		for _, th := range st.Threads {
			if st.PID != r.PID || th.TID != r.TID {
				continue
			}
			for _, f := range th.Native {
				if f.Function == fn {
					return
				}
			}
			t.Errorf("the waiting thread's native stack (state %s, %s) lacks %s: %v", th.State, th.Err, fn, th.Native)
			return
		}
	}
	t.Errorf("the waiting thread %d is not in the report's stacks", r.TID)
}

// TestHangRankStopped: rank 1 is stopped (SIGSTOP) mid-run; rank 0 waits
// in its all-reduce. gaptrace must say so within the threshold and a tick
// (gaps file, spans, metrics, log), and say it ended once rank 1 goes on.
func TestHangRankStopped(t *testing.T) {
	need(t)
	p, pids, gaps, spans := ranksJob(t, "", "--prometheus", "127.0.0.1:0")
	stopAt := time.Now().UnixNano()
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := awaitHang(t, p, gaps, hangAfter+30*time.Second, "rank 0 waits on stopped rank 1", waitingOn(pids[0], pids[1], hang.StateStopped))
	lat := checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	if r.Missing[0].Seq >= r.Call.Collective.Seq {
		t.Errorf("missing rank's last collective #%d, want before #%d", r.Missing[0].Seq, r.Call.Collective.Seq)
	}
	t.Logf("detected %v after the sync began (--hang-after %v): %s", lat, hangAfter, r.Reason)
	for _, rr := range hangRecords(t, gaps) {
		if rr.PID == uint32(pids[1]) {
			t.Errorf("the stopped rank itself reported as hung: %s", rr.Reason)
		}
	}
	if !regexp.MustCompile(`level=WARN msg="hang: pid ` + strconv.Itoa(pids[0])).MatchString(p.stderr.String()) {
		t.Errorf("no WARN log line for the hang:\n%s", p.stderr)
	}
	if !testutil.Poll(10*time.Second, 100*time.Millisecond, func() bool {
		b, _ := os.ReadFile(spans)
		return strings.Contains(string(b), `"gpu.hang"`)
	}) {
		t.Error("no gpu.hang span in the spans file while the hang lasts")
	}
	if m := regexp.MustCompile(`url=(http://\S+/metrics)`).FindStringSubmatch(p.stderr.String()); m == nil {
		t.Error("no prometheus url in the log")
	} else if body := get(t, m[1]); !regexp.MustCompile(`(?m)^gaptrace_hangs_total\{.*\} 1$`).MatchString(body) ||
		!regexp.MustCompile(`(?m)^gaptrace_hang_duration_seconds\{.*\} [1-9]`).MatchString(body) {
		t.Errorf("metrics lack the hang:\n%s", grepLines(body, "hang"))
	}
	if err := syscall.Kill(pids[1], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	contAt := time.Now().UnixNano()
	awaitHang(t, p, gaps, 30*time.Second, "the hang ended", func(e *hang.Report) bool {
		return e.ID == r.ID && e.Status == hang.Ended && e.End > 0 && e.Seconds >= r.Seconds
	})
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.wait(t, 2*time.Minute)
	if !strings.Contains(p.stdout.String(), "hangs: ") {
		t.Errorf("the summary has no hang line:\n%s", p.stdout)
	}
	// The wait is lost time, comm, naming rank 1, though the GPU spun.
	var comm int64
	for _, g := range gapsOnly(t, gaps) {
		c := g.Evidence.Collective
		if g.PID == uint32(pids[0]) && g.Cause == "comm" && c != nil && c.LatePID == uint32(pids[1]) {
			comm += max(0, min(g.Start+g.Duration, contAt)-max(g.Start, stopAt))
		}
	}
	if stopped := contAt - stopAt; float64(comm) < 0.8*float64(stopped) {
		t.Errorf("rank 0's comm time naming rank 1 while it was stopped: %v of %v", time.Duration(comm), time.Duration(stopped))
	} else {
		t.Logf("rank 0's comm time naming rank 1: %v of the %v rank 1 was stopped", time.Duration(comm), time.Duration(stopped))
	}
	var sum struct {
		Hangs *struct {
			Count   int     `json:"count"`
			Seconds float64 `json:"seconds"`
		} `json:"hangs"`
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(gaps), "summary.json"))
	if err := json.Unmarshal(b, &sum); err != nil || sum.Hangs == nil || sum.Hangs.Count < 1 || sum.Hangs.Seconds < r.Seconds {
		t.Errorf("summary file's hangs %+v (%v), want at least this hang's %.1f s:\n%s", sum.Hangs, err, r.Seconds, b)
	}
}

// gapsOnly reads the gaps (not the hang records) of a gaps file.
func gapsOnly(t *testing.T, path string) []correlate.Gap {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []correlate.Gap
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || strings.Contains(l, `"kind":"hang"`) {
			continue
		}
		var g correlate.Gap
		if err := json.Unmarshal([]byte(l), &g); err != nil {
			t.Fatalf("gap does not parse: %v\n%s", err, l)
		}
		out = append(out, g)
	}
	return out
}

// TestHangRankKilled: rank 1 is killed; rank 0 waits for good. The report
// names rank 1 as exited, killed by SIGKILL.
func TestHangRankKilled(t *testing.T) {
	need(t)
	p, pids, gaps, _ := ranksJob(t, "")
	if err := syscall.Kill(pids[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := awaitHang(t, p, gaps, hangAfter+30*time.Second, "rank 0 waits on killed rank 1", waitingOn(pids[0], pids[1], hang.StateExited))
	checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	if r.Missing[0].Exit != "killed by SIGKILL" {
		t.Errorf("missing rank's exit %q, want killed by SIGKILL", r.Missing[0].Exit)
	}
	_ = syscall.Kill(pids[0], syscall.SIGKILL)
	p.wait(t, 2*time.Minute)
}

// TestHangRankSlowRead: rank 1 blocks 8 s in a read of its loader
// worker's pipe (loader.wait) at step 40; rank 0 waits in its all-reduce
// meanwhile. Both are reported: rank 1 in its read, rank 0 waiting on rank
// 1 asleep in that read; both end when the read returns.
func TestHangRankSlowRead(t *testing.T) {
	need(t)
	p, pids, gaps, _ := ranksJob(t, "--workers 1 --stall loader.wait:every=40:ms=8000")
	r := awaitHang(t, p, gaps, 60*time.Second, "rank 0 waits on rank 1 in a read", waitingOn(pids[0], pids[1], hang.StateSleeping))
	checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	if !strings.HasPrefix(r.Missing[0].File, "read pipe:[") {
		t.Errorf("missing rank's file %q, want the read of its worker's pipe", r.Missing[0].File)
	}
	own := awaitHang(t, p, gaps, 10*time.Second, "rank 1 in its read", func(o *hang.Report) bool {
		return o.PID == uint32(pids[1]) && o.Call.Kind == hang.Syscall
	})
	if own.Call.Name != "read" || !strings.HasPrefix(own.Call.File, "pipe:[") {
		t.Errorf("rank 1's call %+v, want read of a pipe", own.Call)
	}
	awaitHang(t, p, gaps, 30*time.Second, "rank 0's hang ended", func(e *hang.Report) bool {
		return e.ID == r.ID && e.Status == hang.Ended
	})
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.wait(t, 2*time.Minute)
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's local endpoint
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestHangStreamNeverDrains: a sync on a stream whose kernel never ends.
func TestHangStreamNeverDrains(t *testing.T) {
	need(t)
	p, truth, gaps, _, pid := pyHangJob(t, "stream")
	r := awaitHang(t, p, gaps, 90*time.Second, "the sync", func(r *hang.Report) bool { return r.PID == uint32(pid) })
	h := readPyHang(t, truth)
	checkPrompt(t, &r)
	if r.TID != h.TID || r.Call.Name != "cuStreamSynchronize" || r.Call.Kind != hang.Sync || r.Call.Collective != nil {
		t.Errorf("call %+v on tid %d, want tid %d's stream sync", r.Call, r.TID, h.TID)
	}
	if !pyFrameAt(&r, uint32(pid), h.TID, h.Function, h.Line) {
		t.Errorf("no Python frame %s line %d in the main thread's stack: %+v", h.Function, h.Line, r.Stacks)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	p.wait(t, 2*time.Minute)
}

// TestHangRankStoppedPeers: one gaptrace per rank, sharing their ranks'
// collectives through --peers. Rank 1 stops; rank 0's sidecar, which does
// not see rank 1's process, names it from the other sidecar's records:
// its rank, pid, host, state (stopped), sidecar and last collective.
func TestHangRankStoppedPeers(t *testing.T) {
	need(t)
	dir, tl := t.TempDir(), t.TempDir()
	id := fmt.Sprintf("hangp%d", time.Now().UnixNano())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	environ := append(os.Environ(), "SIMGPU_DIR="+tl, "SIMGPU_DEVICES=2")
	secret := writeSecret(t, "aGFuZy1zZWNyZXQtaGFuZy1zZWNyZXQtaGFuZy1zZWNyZXQK\n", 0o600)
	var ps [2]*gtProc
	var pids [2]int
	for r := range 2 {
		truth := filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r))
		ps[r] = start(t, append(environ, "RANK="+strconv.Itoa(r), "WORLD_SIZE=2", "GAPTRACE_RUN_DIR="+filepath.Join(dir, "run"+strconv.Itoa(r))),
			"run", "--live", "off", "--hang-after", hangAfter.String(), "--gaps-out", filepath.Join(dir, fmt.Sprintf("gaps%d.jsonl", r)),
			"--spans-out", filepath.Join(dir, fmt.Sprintf("spans%d.jsonl", r)), "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
			"--job-id", id, "--rank", strconv.Itoa(r), "--peers", addr, "--peers-secret-file", secret, "--",
			filepath.Join(simgpuDir, "simtrain"), "--truth", truth, "--rank", strconv.Itoa(r), "--nranks", "2", "--device", strconv.Itoa(r),
			"--steps", "1000000", "--collectives", "1", "--kernels-per-step", "9", "--kernel-us", "1500", "--comm-id", id,
			"--workers", "0", "--quiet", "--await-probes", "60")
	}
	for r := range 2 {
		pids[r] = truthPID(t, filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), 20, 90*time.Second)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := awaitHang(t, ps[0], filepath.Join(dir, "gaps0.jsonl"), hangAfter+30*time.Second, "rank 0 waits on rank 1 of the other sidecar",
		func(r *hang.Report) bool {
			return r.PID == uint32(pids[0]) && len(r.Missing) == 1 && r.Missing[0].Rank == 1 && r.Missing[0].Sidecar != "" &&
				r.Missing[0].State == hang.StateStopped
		})
	checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	host, _ := os.Hostname()
	if m := r.Missing[0]; m.PID != uint32(pids[1]) || m.Seq >= r.Call.Collective.Seq || !strings.Contains(m.Sidecar, "/rank1/") ||
		m.Host != host {
		t.Errorf("missing %+v, want rank 1 (pid %d on %s) of the rank-1 sidecar, last collective before #%d", m, pids[1], host,
			r.Call.Collective.Seq)
	}
	if !strings.Contains(r.Reason, fmt.Sprintf("rank 1 (pid %d on %s, stopped", pids[1], host)) {
		t.Errorf("reason %q does not name rank 1's pid, host and state", r.Reason)
	}
	t.Logf("%s", r.Reason)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, p := range ps {
		p.wait(t, 2*time.Minute)
	}
}

// TestHangRankDiskSleep: rank 1 reads its data from a filesystem whose
// server stops answering (a FUSE one, as a stuck network filesystem): its
// read waits for the page in uninterruptible sleep. Rank 0's report names
// rank 1 in D on that file; rank 1's own names its read, and its thread's
// state D in the stacks. Both end once the server answers.
func TestHangRankDiskSleep(t *testing.T) {
	need(t)
	fs := mountStallFS(t, "simtrain-data.bin", 64<<20)
	p, pids, gaps, _ := ranksJob(t, "--data-dir "+fs.dir+" --stall io.read:every=25:ms=100")
	fs.setStalled(true)
	r := awaitHang(t, p, gaps, hangAfter+60*time.Second, "rank 0 waits on rank 1 in D",
		waitingOn(pids[0], pids[1], hang.StateDisk))
	checkPrompt(t, &r)
	checkCollectiveWait(t, &r)
	file := filepath.Join(fs.dir, "simtrain-data.bin")
	if m := r.Missing[0]; !strings.Contains(m.File, file) {
		t.Errorf("missing rank %+v, want it in D on %s", m, file)
	}
	if !strings.Contains(r.Reason, "disk-sleep on ") || !strings.Contains(r.Reason, file) {
		t.Errorf("reason %q does not name D and the file", r.Reason)
	}
	t.Logf("detected %v after the sync began (--hang-after %v): %s", time.Duration(r.Detected-r.Since), hangAfter, r.Reason)
	own := awaitHang(t, p, gaps, 10*time.Second, "rank 1 in its read", func(o *hang.Report) bool {
		return o.PID == uint32(pids[1]) && o.Call.Kind == hang.Syscall && o.Status == hang.Ongoing
	})
	if !strings.HasPrefix(own.Call.Name, "pread") || own.Call.File != file {
		t.Errorf("rank 1's call %+v, want a pread of %s", own.Call, file)
	}
	inD := false
	for _, st := range own.Stacks {
		for _, th := range st.Threads {
			inD = inD || st.PID == uint32(pids[1]) && th.TID == own.TID && th.State == hang.StateDisk
		}
	}
	if !inD {
		t.Errorf("rank 1's reading thread is not in D in the report's stacks: %+v", own.Stacks)
	}
	fs.setStalled(false)
	awaitHang(t, p, gaps, 30*time.Second, "rank 0's hang ended", func(e *hang.Report) bool {
		return e.ID == r.ID && e.Status == hang.Ended
	})
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.wait(t, 2*time.Minute)
}
