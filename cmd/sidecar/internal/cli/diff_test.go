package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// gaptraceDiff runs bin/gaptrace diff and returns stdout, stderr and the
// exit code.
func gaptraceDiff(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(testutil.Gaptrace(t), append([]string{"diff"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// writeGaps writes a gaps file of steps steps: every step a read gap of
// readMS (±10%) and every third step a comm gap of 5 ms.
func writeGaps(t *testing.T, path string, seed uint64, steps int, readMS float64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	var b bytes.Buffer
	for n := range steps {
		gs := []correlate.Gap{{PID: 7, Step: int64(n), Cause: correlate.CauseIORead,
			Duration: int64(readMS * 1e6 * (0.9 + 0.2*r.Float64()))}}
		if n%3 == 0 {
			gs = append(gs, correlate.Gap{PID: 7, Step: int64(n), Cause: correlate.CauseComm, Duration: 5e6})
		}
		for _, g := range gs {
			line, err := json.Marshal(g)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(append(line, '\n'))
		}
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

type diffJSON struct {
	BaseSteps int `json:"base_steps"`
	NewSteps  int `json:"new_steps"`
	Causes    []struct {
		Cause  string                         `json:"cause"`
		Base   struct{ Mean, Lo, Hi float64 } `json:"base_ms_per_step"`
		New    struct{ Mean, Lo, Hi float64 } `json:"new_ms_per_step"`
		Change struct{ Mean, Lo, Hi float64 } `json:"change_ms_per_step"`
	}
	Regressions []string `json:"regressions"`
}

func TestDiffGapsFilesFailOn(t *testing.T) {
	dir := t.TempDir()
	base, same, slow := filepath.Join(dir, "base.jsonl"), filepath.Join(dir, "same.jsonl"), filepath.Join(dir, "slow.jsonl")
	writeGaps(t, base, 1, 60, 10)
	writeGaps(t, same, 2, 60, 10)
	writeGaps(t, slow, 3, 60, 14)

	out, stderr, code := gaptraceDiff(t, "--fail-on", "20", base, slow)
	if code != ExitFailure || !strings.Contains(out, "io.read") || !strings.Contains(out, "REGRESSION (> 20%)") {
		t.Fatalf("read 10 → 14 ms/step under --fail-on 20: exit %d\n%s%s", code, out, stderr)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "comm") && strings.Contains(line, "REGRESSION") {
			t.Errorf("comm did not change: %s", line)
		}
	}
	// 40% growth is not beyond 50%.
	if out, stderr, code := gaptraceDiff(t, "--fail-on", "50", base, slow); code != ExitOK {
		t.Errorf("--fail-on 50: exit %d\n%s%s", code, out, stderr)
	}
	if out, stderr, code := gaptraceDiff(t, "--fail-on", "5", base, same); code != ExitOK ||
		!strings.Contains(out, "no cause grew by more than 5%") {
		t.Errorf("two runs alike: exit %d\n%s%s", code, out, stderr)
	}

	out, _, code = gaptraceDiff(t, "--json", "--fail-on", "20", base, slow)
	var d diffJSON
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != ExitFailure {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	if d.BaseSteps != 60 || d.NewSteps != 60 || len(d.Regressions) != 1 || d.Regressions[0] != "io.read" {
		t.Errorf("--json: %+v", d)
	}
	for _, c := range d.Causes {
		switch c.Cause {
		case "io.read":
			if c.Base.Lo > 10 || c.Base.Hi < 10 || c.New.Lo > 14 || c.New.Hi < 14 || c.Change.Lo > 4 || c.Change.Hi < 4 {
				t.Errorf("io.read: intervals %+v miss the truth (10 → 14 ms/step)", c)
			}
		case "comm":
			// Every third step: 5/3 ms per step, exactly, in both.
			if c.Base.Mean < 1.66 || c.Base.Mean > 1.67 || c.Change.Lo > 0 || c.Change.Hi < 0 {
				t.Errorf("comm: %+v", c)
			}
		}
	}
}

// Spans files carry each step's idle by cause; a recording is replayed.
func TestDiffSpansAndRecordings(t *testing.T) {
	dir := t.TempDir()
	spans := func(name string, readMS float64) string {
		var b bytes.Buffer
		for n := range 30 {
			ms := readMS + float64(n%5)
			fmt.Fprintf(&b, `{"trace_id":"%032x","span_id":"%016x","name":"train.step","start_unix_nano":1,"end_unix_nano":2,`+
				`"attributes":{"gpu.step.number":%d,"gpu.step.duration_ms":50,"gpu.device":0,"gpu.step.idle.io.read":%g},`+
				`"service":"gaptrace","resource":{"process.pid":7}}`+"\n", n+1, n+1, n, ms)
			fmt.Fprintf(&b, `{"trace_id":"%032x","span_id":"%016x","parent_span_id":"%016x","name":"gpu.idle","start_unix_nano":1,"end_unix_nano":2,`+
				`"attributes":{"gpu.step.number":%d,"gpu.gap.duration_ms":%g,"gpu.gap.cause":"io.read"},"service":"gaptrace"}`+"\n", n+1, 1000+n, n+1, n, ms)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := spans("a.jsonl", 10), spans("b.jsonl", 20)
	out, stderr, code := gaptraceDiff(t, "--json", "--fail-on", "50", a, b)
	var d diffJSON
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != ExitFailure || d.BaseSteps != 30 {
		t.Fatalf("spans: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	if c := d.Causes[0]; c.Cause != "io.read" || c.Base.Mean != 12 || c.New.Mean != 22 {
		t.Errorf("spans: %+v, want io.read 12 → 22 ms/step", c)
	}

	rec := filepath.Join("..", "..", "..", "..", "correlate", "testdata", "recordings", "h200-acc-lite.rec.gz")
	out, stderr, code = gaptraceDiff(t, "--json", "--fail-on", "0", rec, rec)
	d = diffJSON{}
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != ExitOK || d.BaseSteps < 10 || d.BaseSteps != d.NewSteps {
		t.Fatalf("a recording against itself: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	for _, c := range d.Causes {
		if c.Change.Mean != 0 || c.Base != c.New {
			t.Errorf("a recording against itself: %+v", c)
		}
	}

	// The summary of its replay carries the same per-step figures.
	sum := filepath.Join(dir, "summary.json")
	if out, err := exec.Command(testutil.Gaptrace(t), "replay", rec, "--summary-json", sum).CombinedOutput(); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	out, stderr, code = gaptraceDiff(t, "--json", sum, rec)
	var ds diffJSON
	if err := json.Unmarshal([]byte(out), &ds); err != nil || code != ExitOK || ds.BaseSteps != d.BaseSteps || len(ds.Causes) != len(d.Causes) {
		t.Fatalf("summary against its recording: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	for i, c := range ds.Causes {
		if r := d.Causes[i]; c.Cause != r.Cause || math.Abs(c.Base.Mean-r.Base.Mean) > 1e-6 || math.Abs(c.Base.Hi-r.Base.Hi) > 1e-6 ||
			math.Abs(c.Change.Mean) > 1e-6 {
			t.Errorf("%s: from the summary %+v, from the recording %+v", c.Cause, c.Base, r.Base)
		}
	}
}

func TestDiffBadInput(t *testing.T) {
	dir := t.TempDir()
	gaps := filepath.Join(dir, "gaps.jsonl")
	writeGaps(t, gaps, 1, 10, 10)
	summary := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(summary, []byte("{\n  \"wall_ns\": 1,\n  \"by_cause\": {}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.txt")
	if err := os.WriteFile(junk, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badGap := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(badGap, []byte(`{"cause":"io.read","duration_ns":-5,"step":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{gaps}, "want two runs, BASE and NEW, got 1"},
		{[]string{"--fail-on", "-3", gaps, gaps}, "--fail-on -3: want a percentage >= 0"},
		{[]string{gaps, filepath.Join(dir, "missing")}, "no such file"},
		{[]string{summary, gaps}, "this summary has no step_idle (written before gaptrace kept per-step idle"},
		{[]string{gaps, junk}, "not a gaptrace recording, spans file, gaps file or summary"},
		{[]string{badGap, gaps}, "line 1: gap with cause \"io.read\", duration -5 ns"},
	} {
		out, stderr, code := gaptraceDiff(t, tc.args...)
		if code != ExitUsage || !strings.Contains(stderr, tc.msg) {
			t.Errorf("diff %v: exit %d, want %d and %q\n%s%s", tc.args, code, ExitUsage, tc.msg, out, stderr)
		}
	}
}
