package main_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// readGaps reads a --gaps-out file.
func readGaps(t *testing.T, path string) []correlate.Gap {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read-only
	var gaps []correlate.Gap
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		var g correlate.Gap
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("gap line %d: %v", len(gaps)+1, err)
		}
		gaps = append(gaps, g)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return gaps
}

// stackString is a stack as a failure message shows it.
func stackString(g correlate.Gap) string {
	var b strings.Builder
	for _, f := range g.Evidence.Stack {
		b.WriteString("\n  " + f.Function + " " + f.File)
	}
	return b.String()
}

// A C trainer's gaps name the native function behind them: the function
// of simtrain that issued the reads of an io.read stall (the pread wrapper
// keeps no frame pointer, so this is the caller the frame walk alone
// skips), and for a stall that blocks nowhere (cpu), the caller of the
// sync that opened the gap.
func TestNativeStacksNameTheTrainerFunction(t *testing.T) {
	need(t)
	dir := t.TempDir()
	gapsPath := filepath.Join(dir, "gaps.jsonl")
	sumPath := filepath.Join(dir, "summary.json")
	spansPath := filepath.Join(dir, "spans.jsonl")
	args := append([]string{"run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--gaps-out", gapsPath, "--summary-json", sumPath, "--spans-out", spansPath, "--"},
		simtrain("--steps", "30", "--kernel-us", "1000", "--stall", "io.read:every=4:ms=20",
			"--stall", "cpu:every=5:ms=20", "--quiet")...)
	code, stdout, stderr := runGaptrace(t, env(t), args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	simtrainPath := filepath.Join(simgpuDir, "simtrain")
	var reads, cpus int
	var srcPath string
	for _, g := range readGaps(t, gapsPath) {
		switch g.Cause {
		case correlate.CauseIORead:
			reads++
			i := frameIndex(g, "read_cold_until", simtrainPath)
			if i < 0 {
				t.Errorf("io.read gap at step %d: stack does not name read_cold_until in %s:%s", g.Step, simtrainPath, stackString(g))
				continue
			}
			if g.Evidence.Stack[0].Function != "pread64" && g.Evidence.Stack[0].Function != "__libc_pread" {
				t.Errorf("io.read gap at step %d: innermost frame %q, want the pread64 wrapper:%s", g.Step, g.Evidence.Stack[0].Function, stackString(g))
			}
			if frameIndex(g, "main", simtrainPath) <= i {
				t.Errorf("io.read gap at step %d: main is not an outer caller of read_cold_until:%s", g.Step, stackString(g))
			}
			// simtrain is built with -g: the frame has its source line,
			// the one that calls pread.
			if f := g.Evidence.Stack[i]; !strings.Contains(sourceLine(t, f.Source, f.Line), "pread") {
				t.Errorf("io.read gap at step %d: read_cold_until at %s:%d (%q), want the line of its pread call",
					g.Step, f.Source, f.Line, sourceLine(t, f.Source, f.Line))
			} else {
				srcPath = f.Source
			}
		case correlate.CauseCPU, correlate.CauseCPUContention:
			// On a loaded machine the busy loop spends much of its time
			// preempted and its gap is cpu.contention: the stack is the
			// same.
			if g.Duration < 15e6 {
				continue // a short scheduling gap, not the injected stall
			}
			cpus++
			if len(g.Evidence.Stack) == 0 || g.Evidence.Stack[0].Function != "main" || g.Evidence.Stack[0].File != simtrainPath {
				t.Errorf("cpu gap at step %d: stack does not start at the sync's caller main in %s:%s", g.Step, simtrainPath, stackString(g))
			}
		}
	}
	if reads == 0 || cpus == 0 {
		t.Fatalf("%d io.read and %d cpu gaps, want both\n%s", reads, cpus, stderr)
	}

	// The summary charges the reads to their call site, the terminal
	// summary says so, and the gap spans carry the code.* attributes.
	b, err := os.ReadFile(sumPath)
	if err != nil {
		t.Fatal(err)
	}
	var sum correlate.Summary
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	var site *correlate.CallSiteSummary
	for i, cs := range sum.CallSites {
		if cs.Function == "read_cold_until" && cs.File == srcPath {
			site = &sum.CallSites[i]
		}
	}
	if site == nil || site.Gaps < int64(reads) || site.ByCause[correlate.CauseIORead] <= 0 ||
		!strings.HasPrefix(site.Site, "simtrain_stall.c:") || !strings.HasSuffix(site.Site, " read_cold_until") {
		t.Errorf("summary call sites do not charge %d io.read gaps to simtrain_stall.c:LINE read_cold_until: %+v", reads, sum.CallSites)
	}
	if !strings.Contains(stdout, "top call sites") || !strings.Contains(stdout, " read_cold_until — ") {
		t.Errorf("terminal summary names no call site:\n%s", stdout)
	}
	spans, err := os.ReadFile(spansPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(spans), `"code.function.name":"read_cold_until"`) ||
		!strings.Contains(string(spans), `"code.file.path":"`+srcPath+`"`) ||
		!strings.Contains(string(spans), `"code.stacktrace":"pread64 (`) {
		t.Errorf("gap spans carry no code.* attributes for the reads")
	}
}

// sourceLine is line n of file, "" when unreadable.
func sourceLine(t *testing.T, file string, n int) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil || n <= 0 {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if n > len(lines) {
		return ""
	}
	return lines[n-1]
}

func frameIndex(g correlate.Gap, fn, file string) int {
	for i, f := range g.Evidence.Stack {
		if f.Function == fn && f.File == file {
			return i
		}
	}
	return -1
}
