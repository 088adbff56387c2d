package main_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/perfetto"
)

type traceGap struct {
	cause string
	ns    int64
}

// readTraceGaps decodes a trace-event file strictly and returns its gap
// slices, sorted.
func readTraceGaps(t *testing.T, path string) ([]traceGap, perfetto.File) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f perfetto.File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s is not trace-event JSON: %v", path, err)
	}
	var out []traceGap
	for _, e := range f.TraceEvents {
		if e.Cat == perfetto.CatIdle || e.Cat == perfetto.CatStall {
			ns, _ := e.Args["duration_ns"].(float64)
			out = append(out, traceGap{e.Name, int64(ns)})
		}
	}
	slices.SortFunc(out, func(a, b traceGap) int { return strings.Compare(a.cause, b.cause)*2 + int(min(max(a.ns-b.ns, -1), 1)) })
	return out, f
}

func readGapsFile(t *testing.T, path string) []traceGap {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	var out []traceGap
	var last int64
	for sc.Scan() {
		var g correlate.Gap
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatal(err)
		}
		if g.Start < last {
			t.Errorf("%s: gap %d starts %v before the previous one: the file is not in start order", path, len(out)+1,
				time.Duration(last-g.Start))
		}
		last = g.Start
		out = append(out, traceGap{string(g.Cause), g.Duration})
	}
	slices.SortFunc(out, func(a, b traceGap) int { return strings.Compare(a.cause, b.cause)*2 + int(min(max(a.ns-b.ns, -1), 1)) })
	return out
}

// TestPerfettoTraceAndConvert traces simtrain with --perfetto-out next to
// --gaps-out and --spans-out, checks that the trace holds exactly the gaps
// file's gaps, then converts the saved gaps and spans files with
// 'gaptrace convert' and checks the same of those traces.
func TestPerfettoTraceAndConvert(t *testing.T) {
	need(t)
	dir := t.TempDir()
	gapsPath, spansPath, tracePath := filepath.Join(dir, "gaps.jsonl"), filepath.Join(dir, "spans.jsonl"), filepath.Join(dir, "trace.json")
	args := append([]string{"run", "--live", "off", "--nvml-lib", filepath.Join(simgpuDir, "libnvidia-ml.so.1"),
		"--gaps-out", gapsPath, "--spans-out", spansPath, "--perfetto-out", tracePath, "--"},
		simtrain("--steps", "40", "--kernel-us", "1000", "--stall", "io.read:every=4:ms=20", "--stall", "net:every=5:ms=15", "--quiet")...)
	code, stdout, stderr := runGaptrace(t, env(t), args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, tracePath) {
		t.Errorf("summary does not name the trace file:\n%s", stdout)
	}
	want := readGapsFile(t, gapsPath)
	if len(want) == 0 {
		t.Fatal("no gaps written")
	}
	got, f := readTraceGaps(t, tracePath)
	if !slices.Equal(got, want) {
		t.Errorf("trace gaps differ from the gaps file:\n got %v\nwant %v", got, want)
	}
	var steps, procs int
	for _, e := range f.TraceEvents {
		if e.Cat == perfetto.CatStep {
			steps++
		}
		if e.Ph == "M" && e.Name == "process_name" {
			procs++
			if !strings.Contains(e.Args["name"].(string), "simtrain") {
				t.Errorf("process named %q, want its comm (simtrain)", e.Args["name"])
			}
		}
	}
	if steps < 30 || procs == 0 {
		t.Errorf("trace has %d steps (want ~40) and %d named processes", steps, procs)
	}

	for _, from := range []string{gapsPath, spansPath} {
		out := filepath.Join(dir, filepath.Base(from)+".trace.json")
		code, stdout, stderr := runGaptrace(t, nil, "convert", "--from", from, "--perfetto-out", out)
		if code != 0 {
			t.Fatalf("convert %s: exit %d\n%s\n%s", from, code, stdout, stderr)
		}
		got, _ := readTraceGaps(t, out)
		if from == spansPath {
			// Spans carry durations in float milliseconds; compare to
			// the microsecond.
			for i := range got {
				got[i].ns = (got[i].ns + 500) / 1000
			}
			w := slices.Clone(want)
			for i := range w {
				w[i].ns = (w[i].ns + 500) / 1000
			}
			if !slices.Equal(got, w) {
				t.Errorf("convert %s: gaps differ from the gaps file:\n got %v\nwant %v", from, got, w)
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("convert %s: gaps differ from the gaps file:\n got %v\nwant %v", from, got, want)
		}
	}
}

// TestConvertErrors needs no privileges: bad input gives a clear error and
// a non-zero exit, and leaves no output file.
func TestConvertErrors(t *testing.T) {
	if gaptraceBin == "" {
		need(t)
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.jsonl")
	if err := os.WriteFile(junk, []byte(`{"hello":"world"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"convert"}, 2, "--from FILE is required"},
		{[]string{"convert", "--from", junk}, 2, "--perfetto-out FILE is required"},
		{[]string{"convert", "--from", filepath.Join(dir, "nope"), "--perfetto-out", out}, 1, "no such file"},
		{[]string{"convert", "--from", junk, "--perfetto-out", out}, 1, "neither a gap"},
	} {
		code, _, stderr := runGaptrace(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.msg)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed convert left an output file")
	}
}
