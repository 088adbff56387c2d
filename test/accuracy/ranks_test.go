package accuracy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// TestRanksOneGaptrace traces both ranks of a 2-rank job with one gaptrace
// (`gaptrace run -- sh -c 'rank 0 & rank 1; wait'`): the simulated NCCL
// makes the two simtrain processes rendezvous on every all-reduce, and
// rank 1 computes 30 ms on the host before every step, from the first. No
// baseline of rank 0's own waits can tell that lateness from compute; the
// ranks' timelines can. Rank 0's comm stalls must cover ≥ 0.9 of the time
// its GPU spun on rank 1 (truth: from its stream reaching the all-reduce
// to rank 1's stream reaching it) and name rank 1; both ranks must count
// the steps they ran.
//
// GAPTRACE_RANKS_STEPS sets how many steps each rank runs (default 160).
func TestRanksOneGaptrace(t *testing.T) {
	runRanks(t, ranksCase{dir: "late-rank-30ms", await: true})
}

// TestRanksCreatedUnseen: the same job, but gaptrace never sees the
// communicators created, so their collectives alone link them. attach:
// the ranks (RANK and WORLD_SIZE in their environment, as torchrun sets
// them) run for a while before `gaptrace attach --pid` joins them, as in
// production; run: simtrain creates its communicator at once, before the
// libnccl probes are in (as a trainer does right after loading libnccl),
// and nothing says the ranks, so a stall names the late process only
// (the probes may still see one rank's creation, which names both). The
// same coverage is required, from the first scored steps, and every gap
// must be in the spans too.
func TestRanksCreatedUnseen(t *testing.T) {
	t.Run("attach", func(t *testing.T) {
		runRanks(t, ranksCase{dir: "late-rank-30ms-attach", attach: true, env: true})
	})
	t.Run("run", func(t *testing.T) {
		runRanks(t, ranksCase{dir: "late-rank-30ms-unseen"})
	})
}

// TestRanksSidecarPerRank: the same job with one gaptrace per rank (a
// sidecar per pod), the two exchanging their ranks' collectives through
// --peers. Neither sees the other rank's process, yet rank 0's stalls must
// cover ≥ 0.9 of its wait on rank 1 from the first scored steps and name
// rank 1 and its sidecar, as one gaptrace for both does.
//
// attach: each sidecar attaches to its rank after the communicators were
// created (RANK and WORLD_SIZE in the environment), so they are linked by
// their collectives across the two sidecars.
func TestRanksSidecarPerRank(t *testing.T) {
	t.Run("run", func(t *testing.T) {
		runRanks(t, ranksCase{dir: "late-rank-30ms-sidecars", await: true, sidecars: true})
	})
	t.Run("attach", func(t *testing.T) {
		runRanks(t, ranksCase{dir: "late-rank-30ms-sidecars-attach", attach: true, env: true, sidecars: true})
	})
	// Each rank and its sidecar in a PID namespace of their own, as two
	// pods: both trainers are the same low pid, each sidecar sees only its
	// own.
	t.Run("pid namespaces", func(t *testing.T) {
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("unshare (util-linux) not installed")
		}
		runRanks(t, ranksCase{dir: "late-rank-30ms-sidecars-pidns", await: true, sidecars: true, pidns: true})
	})
}

// ranksCase is one way of tracing the 2-rank job.
type ranksCase struct {
	// sidecars: one gaptrace per rank, exchanging through --peers; pidns:
	// each gaptrace and its rank in a PID namespace of their own.
	sidecars, pidns bool
	dir             string
	// await: simtrain waits for gaptrace's libnccl probe before creating
	// its communicator, so the creation is seen.
	await bool
	// attach: the job starts on its own and gaptrace attaches to it after
	// its communicators were created.
	attach bool
	// env: RANK and WORLD_SIZE are set in the ranks' environment.
	env bool
}

func runRanks(t *testing.T, rc ranksCase) {
	rr := newRanksRun(t, rc)
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	log := rr.trace(ctx, t)
	tr := rr.readTruths(t, strings.Split(log, "\n"))
	gaps, err := ReadGaps(filepath.Join(rr.dir, "gaps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// Each rank's gaps: with a sidecar per rank, from that sidecar's file
	// (in PID namespaces of their own both trainers may have one pid).
	gapsOf := func(r int) []correlate.Gap {
		from := gaps
		if rc.sidecars {
			var err error
			if from, err = ReadGaps(filepath.Join(rr.dir, fmt.Sprintf("gaps%d.jsonl", r))); err != nil {
				t.Fatal(err)
			}
		}
		var out []correlate.Gap
		for _, g := range from {
			if int(g.PID) == tr[r].PID {
				out = append(out, g)
			}
		}
		return out
	}
	rr.checkRank0(t, tr, gapsOf(0))
	rr.checkRank1(t, tr, gapsOf(1))
	rr.checkSpans(t, tr, len(gaps), log)
}

// ranksRun is one two-rank job of a ranksCase: its directory, its own
// copies of the simulated GPU, and the ranks' command lines.
type ranksRun struct {
	s        setup
	rc       ranksCase
	dir, sim string
	id       string // the communicator's rendezvous id
	steps    int    // steps to score
	ranks    [2]string
	env      []string
}

func newRanksRun(t *testing.T, rc ranksCase) *ranksRun {
	t.Helper()
	s := need(t)
	steps := 160
	if v := os.Getenv("GAPTRACE_RANKS_STEPS"); v != "" {
		if _, err := fmt.Sscan(v, &steps); err != nil || steps < 20 {
			t.Fatalf("GAPTRACE_RANKS_STEPS=%q: want a number ≥ 20", v)
		}
	}
	dir := filepath.Join(s.root, accuracyOutRoot, "ranks", rc.dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	sim, tl := filepath.Join(dir, "simgpu"), filepath.Join(dir, "timeline")
	for _, d := range []string{sim, tl} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Uprobes are per file: this run's copies are probed by this run only.
	for _, f := range []string{"simtrain", "libcuda.so.1", "libnccl.so.2", "libnvidia-ml.so.1"} {
		if err := copyFile(filepath.Join(s.sim, f), filepath.Join(sim, f)); err != nil {
			t.Fatal(err)
		}
	}
	// The rendezvous file lives in the timeline directory; a fresh id keeps
	// it from meeting an earlier run's. simtrain creates its communicator
	// at once, where a trainer does so seconds in: --await-probes makes it
	// wait for gaptrace's probe, so that both ranks' communicators are seen.
	id := fmt.Sprintf("%s-%d", rc.dir, time.Now().UnixNano())
	simSteps := steps
	if rc.attach {
		// The steps before the attach are not scored, and gaptrace may
		// take seconds to load beside other tests. A job stopped by a
		// signal cannot be used: a rank that stops one step before the
		// other leaves its peer waiting in the all-reduce.
		simSteps = 2 * steps
	}
	rr := &ranksRun{s: s, rc: rc, dir: dir, sim: sim, id: id, steps: steps}
	rank := func(r int, extra string) string {
		cmd := fmt.Sprintf("%s --truth %s --rank %d --nranks 2 --device %d --steps %d --collectives 1 "+
			"--kernels-per-step 9 --kernel-us 1500 --launch-gap-us 20 --comm-id %s --workers 0 --quiet %s",
			filepath.Join(sim, "simtrain"), filepath.Join(dir, fmt.Sprintf("truth%d.jsonl", r)), r, r, simSteps, id, extra)
		if rc.await {
			cmd += " --await-probes 60"
		}
		if rc.env {
			cmd = fmt.Sprintf("RANK=%d WORLD_SIZE=2 %s", r, cmd)
		}
		return cmd
	}
	rr.ranks = [2]string{rank(0, ""), rank(1, "--stall cpu:every=1:ms=30")}
	rr.env = append(cleanEnv(), "SIMGPU_DIR="+tl, "SIMGPU_DEVICES=2")
	return rr
}

// outsOf is gaptrace's output flags, the files named with suffix sfx.
func (rr *ranksRun) outsOf(sfx string) []string {
	return []string{"--live", "off", "--log-level", "debug",
		"--gaps-out", filepath.Join(rr.dir, "gaps"+sfx+".jsonl"),
		"--spans-out", filepath.Join(rr.dir, "spans"+sfx+".jsonl"),
		"--summary-json", filepath.Join(rr.dir, "summary"+sfx+".json"),
		"--nvml-lib", filepath.Join(rr.sim, "libnvidia-ml.so.1")}
}

// trace runs the job under one gaptrace (run, or attach once both ranks
// step) or under a sidecar per rank, and returns gaptrace's log.
func (rr *ranksRun) trace(ctx context.Context, t *testing.T) string {
	t.Helper()
	if rr.rc.sidecars {
		return runSidecars(ctx, t, rr.s.bin, rr.dir, rr.env, rr.id, rr.ranks, rr.outsOf, rr.rc.attach, rr.rc.pidns)
	}
	script := rr.ranks[0] + " & " + rr.ranks[1] + "; wait"
	var job *exec.Cmd
	args := append(append([]string{"run"}, rr.outsOf("")...), "--", "sh", "-c", script)
	if rr.rc.attach {
		job = exec.CommandContext(ctx, "sh", "-c", script)
		job.Dir, job.Env = rr.dir, rr.env
		job.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := job.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = syscall.Kill(-job.Process.Pid, syscall.SIGKILL)
			_ = job.Wait()
		}()
		if err := raisePriority(job.Process.Pid); err != nil {
			t.Fatal(err)
		}
		// Both ranks have met on their communicator and step.
		time.Sleep(time.Second)
		args = append([]string{"attach", "--pid", fmt.Sprint(job.Process.Pid)}, rr.outsOf("")...)
	}
	if err := os.WriteFile(filepath.Join(rr.dir, "command"), []byte(rr.s.bin+" "+strings.Join(args, " ")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, rr.s.bin, args...)
	cmd.Dir = rr.dir
	cmd.Env = rr.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	var out testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := raisePriority(cmd.Process.Pid); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal(err)
	}
	err := cmd.Wait()
	_ = os.WriteFile(filepath.Join(rr.dir, "gaptrace.log"), []byte(out.String()), 0o644)
	if err != nil {
		t.Fatalf("gaptrace %s: %v (log in %s)", args[0], err, rr.dir)
	}
	if rr.rc.attach {
		if err := job.Wait(); err != nil {
			t.Fatalf("the job: %v (%s)", err, rr.dir)
		}
	}
	return out.String()
}

// readTruths reads both ranks' truth, scored from when every probe was
// attached to both.
func (rr *ranksRun) readTruths(t *testing.T, lines []string) [2]*Truth {
	t.Helper()
	var tr [2]*Truth
	var from int64
	for r := range tr {
		var err error
		if tr[r], err = ReadTruth(filepath.Join(rr.dir, fmt.Sprintf("truth%d.jsonl", r))); err != nil {
			t.Fatal(err)
		}
		at, _ := attachTime(lines, tr[r].PID)
		if at == 0 {
			t.Fatalf("no uprobes attached to rank %d (pid %d); log in %s", r, tr[r].PID, rr.dir)
		}
		from = max(from, at)
	}
	// Scored: the steps both ranks ran with every probe attached.
	for r := range tr {
		tr[r].TracedFrom(from)
		tr[r].Until(tr[r].Range().End)
	}
	if len(tr[0].Steps) < rr.steps/2 {
		t.Fatalf("only %d of %d steps ran after the probes attached (%s)", len(tr[0].Steps), rr.steps, rr.dir)
	}
	return tr
}

// checkRank0 checks that rank 0's stalls on the late rank 1 are found
// from the first steps and name rank 1.
func (rr *ranksRun) checkRank0(t *testing.T, tr [2]*Truth, mine []correlate.Gap) {
	t.Helper()
	res := Evaluate(tr[0], mine, int64(time.Millisecond))
	cm := res.Causes["comm"]
	if cm == nil || cm.Stalls == 0 {
		t.Fatalf("rank 0's truth has no comm stall in the scored steps (%s)", rr.dir)
	}
	t.Logf("rank 0: %d scored steps, %d truth comm stalls (%.1f ms): coverage %s, accuracy %s; stall recall %s, precision %s",
		len(tr[0].Steps), cm.Stalls, ms(cm.TruthNS), cm.Coverage, cm.Accuracy, res.StallRecall, res.StallPrecision)
	if !cm.Coverage.Defined() || cm.Coverage.Value() < 0.9 {
		t.Errorf("rank 0's comm stalls cover %s of the time it waited on rank 1, want ≥ 0.90", cm.Coverage)
	}
	// From the first scored steps: no history is needed.
	rng := tr[0].Range()
	var first []Interval
	for _, st := range tr[0].Stalls {
		if st.Cause == "comm" && len(first) < 3 {
			first = append(first, st.Interval)
		}
	}
	var reported []Interval
	seen := 0
	for _, g := range mine {
		if g.Kind != correlate.GapStall || g.End <= rng.Start || g.Start >= rng.End {
			continue
		}
		reported = append(reported, Interval{g.Start, g.End})
		c := g.Evidence.Collective
		if g.Cause != correlate.CauseComm || c == nil || !rr.named(c, 1) || int(c.LatePID) != tr[1].PID || c.LateByNS < g.Duration {
			t.Errorf("rank 0 stall does not name rank 1 (pid %d) late by at least its length: %+v %+v", tr[1].PID, g, c)
			continue
		}
		if c.Ranks > 0 {
			seen++
		}
		if rr.rc.sidecars && !strings.Contains(c.LateSidecar, "/rank1/") {
			t.Errorf("rank 0 stall does not name rank 1's sidecar: %q", c.LateSidecar)
		}
	}
	t.Logf("rank 0: %d of %d stalls on a communicator seen created", seen, len(reported))
	if rr.rc.attach && seen > 0 {
		t.Errorf("attached after the communicators were created, yet %d stalls know the communicator's size", seen)
	}
	for i, iv := range first {
		if got := Intersect(NewSet(iv), NewSet(reported...)).Total(); float64(got) < 0.8*float64(iv.Len()) {
			t.Errorf("scored comm stall %d [%d,+%.1f ms] covered %.1f ms: not found from the first steps", i+1, iv.Start, ms(iv.Len()), ms(got))
		}
	}
}

// named reports whether a stall's evidence names rank as the late one.
// It does where the ranks are known: from the communicators' creation or
// from the environment. Under run without either, the probes may still
// have seen one rank's creation (the other rank is then the one left), or
// none: the pid alone.
func (rr *ranksRun) named(c *correlate.CollectiveEvidence, rank int32) bool {
	if c.LateRank == nil {
		return !rr.rc.await && !rr.rc.env
	}
	return *c.LateRank == rank
}

// checkRank1 checks that the late rank's own stalls name rank 0.
func (rr *ranksRun) checkRank1(t *testing.T, tr [2]*Truth, theirsAll []correlate.Gap) {
	t.Helper()
	// The late rank waits only where the loaded host made rank 0 later
	// still (its truth records those waits too), and then names rank 0.
	var theirs []correlate.Gap
	for _, g := range theirsAll {
		if g.Kind != correlate.GapStall {
			continue
		}
		theirs = append(theirs, g)
		if c := g.Evidence.Collective; c == nil || !rr.named(c, 0) || int(c.LatePID) != tr[0].PID {
			t.Errorf("rank 1 stall does not name rank 0 (pid %d): %+v %+v", tr[0].PID, g, c)
		}
	}
	res1 := Evaluate(tr[1], theirs, int64(time.Millisecond))
	t.Logf("rank 1: stall recall %s, precision %s (rank 0 late by the host's load)", res1.StallRecall, res1.StallPrecision)
}

// checkSpans checks that every gap is in the spans and that each rank's
// steps are counted.
func (rr *ranksRun) checkSpans(t *testing.T, tr [2]*Truth, ngaps int, log string) {
	t.Helper()
	spans, err := ReadStepSpans(filepath.Join(rr.dir, "spans.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	spansOf := [2][]StepSpan{spans, spans}
	if rr.rc.sidecars {
		// Rank 1's sidecar hangs its steps under rank 0's roots; each
		// rank's steps come from its own sidecar's file.
		if spansOf[0], err = ReadStepSpans(filepath.Join(rr.dir, "spans0.jsonl")); err != nil {
			t.Fatal(err)
		}
		if spansOf[1], err = ReadRankSpans(filepath.Join(rr.dir, "spans1.jsonl")); err != nil {
			t.Fatal(err)
		}
	}
	// Every gap is in the spans too, whichever rank's verdict came after
	// its step was emitted, and whenever a rank's device became known.
	raw, err := os.ReadFile(filepath.Join(rr.dir, "spans.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(raw, []byte(`"name":"gpu.idle"`)); n != ngaps || strings.Contains(log, "spans were lost") {
		t.Errorf("%d gpu.idle spans for %d gaps (gaptrace.log in %s)", n, ngaps, rr.dir)
	}
	var counted [2]*StepCountResult
	for r := range tr {
		counted[r] = CountSteps(tr[r], spansOf[r], tr[r].PID)
		t.Logf("rank %d (pid %d): gaptrace counted %d steps (%d fixed windows), the trainer ran %d",
			r, tr[r].PID, counted[r].Counted, counted[r].Windows, counted[r].True)
		if counted[r].RelErr() > 0.1 {
			t.Errorf("rank %d: counted %d steps, the trainer ran %d", r, counted[r].Counted, counted[r].True)
		}
	}
}
