package main_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// heldShell starts `sh -c 'sleep 600'` with extra arguments after the
// script ($0, $1, ...): they stay on the shell's command line while it waits,
// as a trainer's secrets stay on its own.
func heldShell(t *testing.T, args ...string) int {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", "sleep 600; :"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reap(t, cmd) })
	want := strings.Join(cmd.Args, "\x00")
	testutil.WaitFor(t, 30*time.Second, "the shell's command line", func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
		return err == nil && strings.TrimSuffix(string(b), "\x00") == want
	})
	return cmd.Process.Pid
}

// check --pid quotes the target's command line; it goes through the same
// --command-line and --redact as spans, metrics and logs.
func TestCheckRedactsTheTargetCommandLine(t *testing.T) {
	bin := testutil.Gaptrace(t)
	pid := heldShell(t, "trainer", "--api-key=sk-check-secret", "--token", "tok-check-secret", "--lr", "0.1",
		"--db", "postgres://bob:pw-check-secret@db/x", "-H", "Authorization: Bearer bb-check-secret",
		"--password", "-dash-check-secret", "--tokenizer", "gpt2", "--run-name", "visible-name")
	secrets := []string{"sk-check-secret", "tok-check-secret", "pw-check-secret", "bb-check-secret", "dash-check-secret"}
	for _, tc := range []struct {
		flags      []string
		want, hide []string
	}{
		{nil, []string{"sh -c", "--api-key=*** --token *** --lr 0.1", "postgres://***@db/x",
			"-H Authorization: Bearer *** --password *** --tokenizer gpt2", "visible-name"}, secrets},
		{[]string{"--redact", "visible-\\w+"}, []string{"--api-key=***", "--run-name ***"}, append(secrets, "visible-name")},
		{[]string{"--command-line", "name"}, []string{fmt.Sprintf("pid %d sh\n", pid)}, append(secrets, "--lr", "trainer")},
		{[]string{"--command-line", "none"}, []string{fmt.Sprintf("pid %d\n", pid)}, append(secrets, "sh -c", "trainer")},
		{[]string{"--command-line", "full"}, []string{"--api-key=sk-check-secret --token tok-check-secret"}, nil},
	} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"check", "--pid", strconv.Itoa(pid)}, tc.flags...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); !exitStatusOnly(err) {
			t.Fatalf("check %v: %v\n%s", tc.flags, err, &stderr)
		}
		var target string
		for _, l := range strings.SplitAfter(stdout.String(), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[1] == "target" {
				target = l
			}
		}
		if target == "" {
			t.Errorf("check %v: no target line\n%s%s", tc.flags, &stdout, &stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(target, w) {
				t.Errorf("check %v: target line %q lacks %q", tc.flags, target, w)
			}
		}
		for _, h := range tc.hide {
			if strings.Contains(stdout.String()+stderr.String(), h) {
				t.Errorf("check %v prints %q:\n%s%s", tc.flags, h, &stdout, &stderr)
			}
		}
	}
}

// check mounts tracefs where none is mounted, to look inside, and unmounts
// it again: in a mount namespace of its own whose tracefs (and debugfs,
// whose tracing directory mounts tracefs when looked at) is unmounted,
// check reports the tracepoints it found inside, says it left tracefs
// unmounted, and afterwards no tracefs is mounted there. The host's mounts
// are never touched (the namespace's propagation is private).
func TestCheckLeavesTracefsUnmounted(t *testing.T) {
	testutil.NeedRoot(t, "mounts tracefs in a mount namespace")
	bin := testutil.Gaptrace(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	hostBefore := tracefsMounts(t, "/proc/self/mountinfo")
	// Deepest first: debugfs's tracing automount before debugfs itself.
	const script = `fs() { awk '{ split($0, a, " - "); split(a[2], b, " "); if (b[1] == "tracefs" || b[1] == "debugfs") print $5 }' /proc/self/mountinfo; }
for m in $(fs | sort -r); do umount "$m" || exit 99; done
echo "before: $(fs | tr '\n' ' ')"
"$0" check
echo "check exit $?"
echo "after: $(fs | tr '\n' ' ')"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("unshare: %v\n%s%s", err, out, &stderr)
	}
	report := string(out)
	line := func(prefix string) string {
		for _, l := range strings.Split(report, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no %q line:\n%s%s", prefix, report, &stderr)
		return ""
	}
	if l := line("before:"); strings.TrimSpace(strings.TrimPrefix(l, "before:")) != "" {
		t.Fatalf("tracefs or debugfs still mounted in the namespace before check (%s): the test proves nothing\n%s", l, report)
	}
	if l := line("OK    tracefs "); !strings.Contains(l, "not mounted; it can be") || !strings.Contains(l, "check left it unmounted") {
		t.Errorf("check's tracefs line does not say it mounted tracefs to look and left it unmounted: %q", l)
	}
	// Found inside the tracefs check mounted: it did look.
	if l := line("OK    tracepoints "); !strings.Contains(l, "present") {
		t.Errorf("check did not look inside the tracefs it mounted: %q", l)
	}
	if l := line("check exit "); l != "check exit 0" && l != "check exit 1" {
		t.Errorf("check: %s\n%s%s", l, report, &stderr)
	}
	if l := line("after:"); strings.TrimSpace(strings.TrimPrefix(l, "after:")) != "" {
		t.Errorf("check left a mount behind in its namespace (%s)\n%s", l, report)
	}
	if hostAfter := tracefsMounts(t, "/proc/self/mountinfo"); !slices.Equal(hostAfter, hostBefore) {
		t.Errorf("the host's tracefs mounts changed: %v, were %v", hostAfter, hostBefore)
	}
}

// tracefsMounts lists the mount points of tracefs and debugfs in a
// mountinfo file.
func tracefsMounts(t *testing.T, mountinfo string) []string {
	t.Helper()
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); ok && len(f) > 4 && len(g) > 0 && (g[0] == "tracefs" || g[0] == "debugfs") {
			points = append(points, f[4])
		}
	}
	return points
}

// The debug log line of the command run starts: its arguments as given
// (one of them a whole header), redacted like every other output.
func TestRunDebugLogRedactsTheCommand(t *testing.T) {
	need(t)
	dir := t.TempDir()
	code, stdout, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--log-level", "debug",
		"--spans-out", filepath.Join(dir, "spans.jsonl"), "--", "sh", "-c", "exit 0", "sh",
		"-H", "Authorization: Bearer bb-debug-secret", "--password", "-dash-debug-secret", "--passphrase", "pp-debug-secret",
		"--tokenizer", "gpt2")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	var line string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "command started under tracing") {
			line = l
		}
	}
	if !strings.Contains(line, "Authorization: Bearer ***") || !strings.Contains(line, "--tokenizer gpt2") {
		t.Errorf("no redacted argv in the debug log:\n%s", stderr)
	}
	for _, secret := range []string{"bb-debug-secret", "dash-debug-secret", "pp-debug-secret"} {
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("the output carries %q:\n%s", secret, stderr)
		}
	}
}

// attach --match beside other attach --match with the same pattern, each
// under a wrapper whose command line holds the pattern only because the
// gaptrace it starts does: two under timeout (their command lines name the
// gaptrace binary), one under a shell that names it only through a
// variable (a gaptrace runs under it). Each traces the real target and
// none of the wrappers, which would trace another gaptrace through them.
func TestAttachMatchSkipsOtherGaptracesWrappers(t *testing.T) {
	need(t)
	pattern := "zzdecoy77-" + strconv.Itoa(os.Getpid())
	attach := func(out string) []string {
		return []string{"attach", "--live", "off", "--match", pattern, "--spans-out", filepath.Join(t.TempDir(), out)}
	}
	// The shell first, and its gaptrace waiting, so that no scan of the
	// others can see the shell before its gaptrace exists.
	environ := append(env(t), "GT="+gaptraceBin)
	c := startArgv(t, environ, append([]string{"sh", "-c", `"$GT" "$@"; :`, pattern}, attach("c.jsonl")...)...)
	waiting := regexp.MustCompile(`msg="waiting for processes"`)
	c.waitFor(t, waiting, 2*time.Minute)
	a := startArgv(t, env(t), append([]string{"timeout", "300", gaptraceBin}, attach("a.jsonl")...)...)
	b := startArgv(t, env(t), append([]string{"timeout", "300", gaptraceBin}, attach("b.jsonl")...)...)
	a.waitFor(t, waiting, 2*time.Minute)
	b.waitFor(t, waiting, 2*time.Minute)

	target := exec.Command("sleep", "600")
	target.Args[0] = pattern
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer reap(t, target)
	tpid := target.Process.Pid
	traced := regexp.MustCompile(`msg="tracing matching process" component=cli pid=(\d+)`)
	skipped := regexp.MustCompile(`msg="not tracing a matching process: gaptrace runs it, or under it" component=cli pid=(\d+)`)
	pids := func(p *gtProc, re *regexp.Regexp) []int {
		var out []int
		for _, m := range re.FindAllStringSubmatch(p.stderr.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
		return out
	}
	wrappers := map[*gtProc]int{a: a.cmd.Process.Pid, b: b.cmd.Process.Pid, c: c.cmd.Process.Pid}
	names := map[*gtProc]string{a: "a (timeout)", b: "b (timeout)", c: "c (sh)"}
	for p, w := range wrappers {
		t.Logf("%s: wrapper pid %d", names[p], w)
	}
	for p, own := range wrappers {
		// Done once it traced the target and passed over both other
		// wrappers, or as soon as it traced anything else.
		ok := testutil.Poll(2*time.Minute, 100*time.Millisecond, func() bool {
			tr := pids(p, traced)
			if slices.ContainsFunc(tr, func(n int) bool { return n != tpid }) {
				return true
			}
			sk := pids(p, skipped)
			for q, w := range wrappers {
				if w != own && q != p && !slices.Contains(sk, w) {
					return false
				}
			}
			return slices.Contains(tr, tpid)
		})
		if !ok {
			t.Errorf("%s: did not trace the target (pid %d) and pass over the other wrappers\n%s", names[p], tpid, p.stderr)
		}
	}
	for _, p := range []*gtProc{a, b, c} {
		// The group: sh does not pass a signal on to its command.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, p := range []*gtProc{a, b, c} {
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop", names[p])
		}
		if tr := pids(p, traced); !slices.Equal(tr, []int{tpid}) {
			t.Errorf("%s traced %v, want only the target %d\n%s", names[p], tr, tpid, p.stderr)
		}
	}
}

// A data file whose path is longer than the 255 bytes the openat probe
// copies: every gap that names it names it whole (restored from
// /proc/PID/fd while the file is open), never the probe's cut prefix
// passed off as a path.
func TestLongFilePathKeptWhole(t *testing.T) {
	need(t)
	dataDir := t.TempDir()
	for len(dataDir) <= 300 {
		dataDir = filepath.Join(dataDir, strings.Repeat("d", 60))
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dataDir, "simtrain-data.bin")
	dir := t.TempDir()
	gapsPath := filepath.Join(dir, "gaps.jsonl")
	code, _, stderr := runIn(t, dir, env(t), "run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--gaps-out", gapsPath, "--spans-out", filepath.Join(dir, "spans.jsonl"), "--",
		filepath.Join(simgpuDir, "simtrain"), "--steps", "100", "--kernel-us", "1000", "--stall", "io.read:every=5:ms=20",
		"--data-dir", dataDir, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	reads, named := 0, 0
	for _, g := range readGaps(t, gapsPath) {
		var paths []string
		for _, f := range g.Evidence.Files {
			paths = append(paths, f.Path)
		}
		for _, w := range g.Evidence.Workers {
			paths = append(paths, w.Files...)
		}
		for _, p := range paths {
			if p != want && (strings.HasPrefix(want, strings.TrimSuffix(p, "…[truncated]")) || strings.HasSuffix(p, "…[truncated]")) {
				t.Errorf("gap at step %d (%s) names the data file cut: %q (%d bytes), want %q (%d bytes)", g.Step, g.Cause, p, len(p), want, len(want))
			}
		}
		if g.Cause != correlate.CauseIORead {
			continue
		}
		reads++
		if slices.Contains(paths, want) {
			named++
		}
	}
	// 100 steps, a stall every 5th: 20 io.read stalls. How many the engine
	// reports, and with what evidence, is its business; a cut path in any
	// of them is this test's.
	t.Logf("%d io.read gaps, %d naming %d bytes of path whole", reads, named, len(want))
	if named == 0 {
		t.Errorf("%d io.read gaps, none naming the %d-byte data file path whole\n%s", reads, len(want), stderr)
	}
}
