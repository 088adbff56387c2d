package accuracy

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

const msNS = int64(1e6)

func iv(a, b int64) Interval { return Interval{a * msNS, b * msNS} }

func TestSetOps(t *testing.T) {
	s := NewSet(iv(5, 7), iv(0, 2), iv(1, 3), iv(3, 4), iv(9, 9), iv(8, 6))
	if want := (Set{iv(0, 4), iv(5, 7)}); !slices.Equal(s, want) {
		t.Fatalf("NewSet = %v, want %v (sorted, merged where overlapping or touching, empty dropped)", s, want)
	}
	if got := s.Total(); got != 6*msNS {
		t.Errorf("Total = %d, want %d", got, 6*msNS)
	}
	if got, want := Intersect(s, Set{iv(1, 6)}), (Set{iv(1, 4), iv(5, 6)}); !slices.Equal(got, want) {
		t.Errorf("Intersect = %v, want %v", got, want)
	}
	if got := Intersect(s, nil); len(got) != 0 {
		t.Errorf("Intersect with empty = %v", got)
	}
	if got, want := Complement(s, iv(-1, 10)), (Set{iv(-1, 0), iv(4, 5), iv(7, 10)}); !slices.Equal(got, want) {
		t.Errorf("Complement = %v, want %v", got, want)
	}
	if got, want := Complement(s, iv(1, 3)), Set(nil); !slices.Equal(got, want) {
		t.Errorf("Complement inside busy = %v, want none", got)
	}
	if got, want := subtract(s, Set{iv(1, 2), iv(6, 9)}), (Set{iv(0, 1), iv(2, 4), iv(5, 6)}); !slices.Equal(got, want) {
		t.Errorf("subtract = %v, want %v", got, want)
	}
	if got, want := s.Clip(iv(3, 6)), (Set{iv(3, 4), iv(5, 6)}); !slices.Equal(got, want) {
		t.Errorf("Clip = %v, want %v", got, want)
	}
}

func TestRatio(t *testing.T) {
	r := Ratio{3, 4}
	if r.Value() != 0.75 || r.String() != "0.750" {
		t.Errorf("3/4: %v %q", r.Value(), r.String())
	}
	u := Ratio{0, 0}
	if u.Defined() || !math.IsNaN(u.Value()) || u.String() != "-" {
		t.Errorf("0/0 must be undefined: %v %q", u.Value(), u.String())
	}
	b, err := json.Marshal(map[string]Ratio{"a": r, "u": u})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":{"value":0.75,"num_ns":3,"den_ns":4},"u":{"value":null,"num_ns":0,"den_ns":0}}`; string(b) != want {
		t.Errorf("JSON %s, want %s", b, want)
	}
}

func TestPercentile(t *testing.T) {
	v := []int64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	if p := Percentile(v, 0.5); p != 5 {
		t.Errorf("p50 = %d, want 5", p)
	}
	if p := Percentile(v, 0.9); p != 9 {
		t.Errorf("p90 = %d, want 9", p)
	}
	if v[0] != 5 {
		t.Error("Percentile sorted its input")
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("empty percentile must be 0")
	}
}

func gap(kind correlate.GapKind, cause correlate.Cause, a, b int64) correlate.Gap {
	return correlate.Gap{Kind: kind, Cause: cause, Start: a * msNS, End: b * msNS, Duration: (b - a) * msNS}
}

// handMade is three 20 ms steps with a stall before steps 2 and 3 and a
// comm stall at the end of step 3:
//
//	step 1 [0,20): kernels [0,8), [8.5,19) → 0.5 ms micro-gap, 1 ms idle at the end
//	io.read stall [20,50) before step 2, GPU idle [19,52)
//	step 2 [52,72): kernels [52,71)
//	loader.wait.cpu stall [72,102), GPU idle [71,104)
//	step 3 [104,140): kernels [104,115), collective [115,140) (late peer: comm stall [116,140))
func handMade() *Truth {
	return &Truth{
		PID: 1,
		Steps: []TruthStep{
			{Number: 1, Interval: iv(0, 20)},
			{Number: 2, Interval: iv(52, 72)},
			{Number: 3, Interval: iv(104, 140)},
		},
		Stalls: []TruthStall{
			{Step: 2, Cause: "io.read", Interval: iv(20, 50)},
			{Step: 3, Cause: "loader.wait.cpu", Interval: iv(72, 102), WorkerDid: "cpu"},
			{Step: 3, Cause: "comm", Interval: iv(116, 140)},
		},
		Busy:  NewSet(Interval{0, 8 * msNS}, Interval{8*msNS + msNS/2, 19 * msNS}, iv(52, 71), iv(104, 115), iv(115, 140)),
		Ended: true,
	}
}

func TestEvaluate(t *testing.T) {
	tr := handMade()
	loader := gap(correlate.GapIdle, correlate.CauseLoaderWait, 71, 104)
	loader.Evidence.Workers = []correlate.WorkerEvidence{{PID: 7, Activity: "cpu"}}
	gaps := []correlate.Gap{
		// The io.read gap starts 2 ms late and ends 1 ms late: 1 ms of it
		// is not idle (the GPU was busy again).
		gap(correlate.GapIdle, correlate.CauseIORead, 21, 53),
		loader,
		// A comm stall reported for 20 of its 24 ms.
		gap(correlate.GapStall, correlate.CauseComm, 120, 140),
	}
	r := Evaluate(tr, gaps, msNS)

	// True idle: 0.5 + [19,52) 33 + [71,104) 33 = 66.5 ms; gaps ≥ 1 ms: 66.
	if r.TrueIdleNS != 66*msNS+msNS/2 || r.TrueGapNS != 66*msNS || r.TrueGaps != 2 {
		t.Errorf("true idle %d, gaps %d (%d), want 66.5 ms, 66 ms in 2", r.TrueIdleNS, r.TrueGapNS, r.TrueGaps)
	}
	// Recall: [21,52) + [71,104) = 31 + 33 of 66. Precision: 64 of 65.
	if r.Recall != (Ratio{64 * msNS, 66 * msNS}) {
		t.Errorf("recall %+v, want 64/66 ms", r.Recall)
	}
	if r.Precision != (Ratio{64 * msNS, 65 * msNS}) {
		t.Errorf("precision %+v, want 64/65 ms", r.Precision)
	}
	if r.StallRecall != (Ratio{20 * msNS, 24 * msNS}) || r.StallPrecision != (Ratio{20 * msNS, 20 * msNS}) {
		t.Errorf("stall recall %+v precision %+v, want 20/24 and 20/20", r.StallRecall, r.StallPrecision)
	}
	io := r.Causes["io.read"]
	if io == nil || io.TruthNS != 30*msNS || io.Coverage != (Ratio{29 * msNS, 30 * msNS}) || io.Accuracy != (Ratio{29 * msNS, 29 * msNS}) {
		t.Errorf("io.read %+v, want truth 30 ms, covered 29, all right", io)
	}
	ld := r.Causes["loader.wait.cpu"]
	if ld == nil || ld.Accuracy != (Ratio{30 * msNS, 30 * msNS}) || ld.Confusion["loader.wait.cpu"] != 30*msNS {
		t.Errorf("loader.wait.cpu %+v, want 30/30 ms labelled loader.wait.cpu", ld)
	}
	cm := r.Causes["comm"]
	if cm == nil || cm.TruthNS != 24*msNS || cm.Accuracy != (Ratio{20 * msNS, 20 * msNS}) || cm.Coverage != (Ratio{20 * msNS, 24 * msNS}) {
		t.Errorf("comm %+v, want 20 of 24 ms covered, all right", cm)
	}
	// Boundaries: io.read gap [19,52) vs [21,53): 2 and 1 ms; loader 0 and 0.
	if got := slices.Sorted(slices.Values(r.BoundaryErrNS)); !slices.Equal(got, []int64{0, 0, 1 * msNS, 2 * msNS}) {
		t.Errorf("boundary errors %v", got)
	}
	if len(r.Missed) != 0 {
		t.Errorf("missed %v, want none", r.Missed)
	}
}

func TestEvaluateWrongCauses(t *testing.T) {
	tr := handMade()
	// The loader wait labelled with the wrong worker activity, the io.read
	// stall half reported as cpu, the comm stall reported as idle.
	loader := gap(correlate.GapIdle, correlate.CauseLoaderWait, 71, 104)
	loader.Evidence.Workers = []correlate.WorkerEvidence{{PID: 7, Activity: "io"}}
	gaps := []correlate.Gap{
		gap(correlate.GapIdle, correlate.CauseIORead, 19, 35),
		gap(correlate.GapIdle, correlate.CauseCPU, 35, 52),
		loader,
		gap(correlate.GapIdle, correlate.CauseComm, 130, 140),
	}
	r := Evaluate(tr, gaps, msNS)
	if io := r.Causes["io.read"]; io.Accuracy != (Ratio{15 * msNS, 30 * msNS}) || io.Confusion["cpu"] != 15*msNS {
		t.Errorf("io.read %+v, want 15 of 30 ms right, 15 as cpu", io)
	}
	if ld := r.Causes["loader.wait.cpu"]; ld.Accuracy.Num != 0 || ld.Confusion["loader.wait.io"] != 30*msNS {
		t.Errorf("loader.wait.cpu %+v: workers said io, want 0 right", ld)
	}
	if cm := r.Causes["comm"]; cm.Accuracy != (Ratio{0, 10 * msNS}) || cm.Confusion["idle-kind"] != 10*msNS {
		t.Errorf("comm %+v: reported as an idle gap, want covered but wrong", cm)
	}
	// The idle-kind comm report is not truly idle: precision drops.
	if r.Precision != (Ratio{66 * msNS, 76 * msNS}) {
		t.Errorf("precision %+v, want 66/76 ms", r.Precision)
	}
	if r.StallRecall != (Ratio{0, 24 * msNS}) || r.StallPrecision.Defined() {
		t.Errorf("stall recall %+v precision %+v, want 0/24 and undefined", r.StallRecall, r.StallPrecision)
	}
}

func TestEvaluateNothingReported(t *testing.T) {
	r := Evaluate(handMade(), nil, msNS)
	if r.Recall != (Ratio{0, 66 * msNS}) || r.Precision.Defined() {
		t.Errorf("recall %+v precision %+v, want 0/66 and undefined", r.Recall, r.Precision)
	}
	if len(r.Missed) != 2 || r.BoundaryP50NS != 0 {
		t.Errorf("missed %v p50 %d, want both gaps and no boundary errors", r.Missed, r.BoundaryP50NS)
	}
	for c, cr := range r.Causes {
		if cr.Accuracy.Defined() || cr.Coverage.Num != 0 {
			t.Errorf("%s: %+v, want no coverage", c, cr)
		}
	}
}

func TestTracedFrom(t *testing.T) {
	tr := handMade()
	// Probes attached during step 1: step 2 is the first traced step and
	// only primes the queue model, step 3 is scored with its stalls.
	tr.TracedFrom(10 * msNS)
	if len(tr.Steps) != 1 || tr.Steps[0].Number != 3 {
		t.Fatalf("steps %v, want only step 3", tr.Steps)
	}
	if len(tr.Stalls) != 1 || tr.Stalls[0].Cause != "comm" {
		t.Errorf("stalls %v, want the comm stall inside step 3 only", tr.Stalls)
	}
	tr.TracedFrom(200 * msNS)
	if len(tr.Steps) != 0 || tr.Range() != (Interval{}) {
		t.Errorf("attached after the last step: %v", tr.Steps)
	}
}

func TestStepIdle(t *testing.T) {
	tr := handMade()
	// gaptrace numbers from 10 and delimits steps sync to sync.
	steps := []StepSpan{
		{PID: 1, Number: 10, Interval: iv(0, 20), IdleNS: 15 * msNS / 10},             // true 1.5 ms
		{PID: 1, Number: 11, Interval: iv(20, 72), IdleNS: 33 * msNS},                 // true 33 ms
		{PID: 1, Number: 12, Interval: iv(72, 140), IdleNS: 32 * msNS * 11 / 10},      // true 32 ms, +10%
		{PID: 2, Number: 5, Interval: iv(0, 140), IdleNS: 0},                          // another process
		{PID: 1, Number: 13, Interval: iv(140, 160), IdleNS: 20 * msNS, Window: true}, // no truth step
	}
	r := StepIdle(tr, steps, 1)
	if r.Steps != 4 || r.Matched != 3 || r.Offset != 9 {
		t.Fatalf("%+v: want 4 steps of pid 1, 3 matched, offset 9", r)
	}
	if math.Abs(r.MedianRelErr-0) > 1e-9 || math.Abs(r.P90RelErr-0.1) > 1e-9 {
		t.Errorf("median %.4f p90 %.4f, want 0 and 0.1", r.MedianRelErr, r.P90RelErr)
	}
	if r.TrueNS != 66*msNS+msNS/2 {
		t.Errorf("true %d, want 66.5 ms", r.TrueNS)
	}

	// The feeder waited 10 ms of step 3's 36 for a CPU: the machine's load
	// placed its idle, so it is left out of the per-step errors (its +10%
	// with it) and kept in the totals.
	tr.Steps[2].RunDelayNS = 10 * msNS
	r = StepIdle(tr, steps, 1)
	if r.Matched != 3 || r.Preempted != 1 || r.P90RelErr != 0 || r.TrueNS != 66*msNS+msNS/2 {
		t.Errorf("%+v: want 3 matched, 1 preempted, p90 0, totals unchanged", r)
	}
}

func writeFile(t *testing.T, name string, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadTruth(t *testing.T) {
	p := writeFile(t, "truth.jsonl",
		`{"type":"meta","clock":"monotonic","realtime_minus_monotonic_ns":1000,"pid":42,"stalls":[]}`,
		`{"type":"busy","start":10,"end":20,"kind":"kernel"}`,
		`{"type":"busy","start":15,"end":30,"kind":"collective"}`,
		`{"type":"busy","start":40,"end":50,"kind":"copy"}`,
		`{"type":"stall","step":2,"cause":"sleep","start":60,"end":70,"tid":42,"ms":1,"run_delay_ns":0,"at":"ahead"}`,
		`{"type":"stall","step":2,"cause":"loader.wait.io","start":50,"end":55,"worker_did":"io"}`,
		`{"type":"step","step":2,"start":31,"end":80}`,
		`{"type":"step","step":1,"start":5,"end":30}`,
		`{"type":"call","what":"sync","step":1,"start":25,"end":30}`,
		`{"type":"end","steps":2,"wall_ns":100,"interrupted":true}`)
	tr, err := ReadTruth(p)
	if err != nil {
		t.Fatal(err)
	}
	if tr.PID != 42 || !tr.Ended || len(tr.Steps) != 2 || tr.Steps[0].Number != 1 || tr.Steps[0].Start != 1005 {
		t.Errorf("truth %+v", tr)
	}
	if want := (Set{{1010, 1030}}); !slices.Equal(tr.Busy, want) {
		t.Errorf("busy %v, want %v (kernel ∪ collective, copies excluded, Unix ns)", tr.Busy, want)
	}
	if len(tr.Stalls) != 2 || tr.Stalls[0].Cause != "loader.wait.io" || tr.Stalls[0].WorkerDid != "io" ||
		!tr.Stalls[1].Ahead || tr.Stalls[1].Start != 1060 {
		t.Errorf("stalls %+v", tr.Stalls)
	}
	if _, err := ReadTruth(writeFile(t, "bad.jsonl", `{"type":"step","step":1,"start":1,"end":2}`)); err == nil {
		t.Error("a truth without its meta record must be rejected")
	}
	if _, err := ReadTruth(writeFile(t, "bad.jsonl", `{"type":"meta"}`, `{"type":`)); err == nil {
		t.Error("a truncated record must be rejected")
	}
}

func TestReadStepSpans(t *testing.T) {
	p := writeFile(t, "spans.jsonl",
		`{"name":"gpu.idle","start_unix_nano":1,"end_unix_nano":2,"attributes":{}}`,
		`{"name":"train.step","start_unix_nano":300,"end_unix_nano":400,"attributes":{"gpu.step.number":8,"gpu.step.idle_ms":1.5,"gpu.step.bounded_idle_ms":1,"gpu.step.micro_idle_ms":0.5,"gpu.step.stall_ms":0,"process.pid":9,"gpu.step.window":true}}`,
		`{"name":"train.step","start_unix_nano":100,"end_unix_nano":300,"attributes":{"gpu.step.number":7,"gpu.step.idle_ms":0.000001,"gpu.step.bounded_idle_ms":0,"gpu.step.micro_idle_ms":0.000001,"gpu.step.stall_ms":2,"process.pid":9}}`)
	steps, err := ReadStepSpans(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []StepSpan{
		{PID: 9, Number: 7, Interval: Interval{100, 300}, IdleNS: 1, MicroNS: 1, StallNS: 2 * msNS},
		{PID: 9, Number: 8, Interval: Interval{300, 400}, IdleNS: 1500000, BoundedNS: msNS, MicroNS: 500000, Window: true},
	}
	if !slices.Equal(steps, want) {
		t.Errorf("steps %+v\nwant %+v", steps, want)
	}
	if _, err := ReadStepSpans(writeFile(t, "bad.jsonl", `{"name":"train.step","attributes":{"gpu.step.number":1}}`)); err == nil {
		t.Error("a train.step span without idle attributes must be rejected")
	}
}

func TestReportedCause(t *testing.T) {
	g := correlate.Gap{Cause: correlate.CauseLoaderWait}
	if c := ReportedCause(g); c != "loader.wait" {
		t.Errorf("no worker evidence: %s", c)
	}
	g.Evidence.Workers = []correlate.WorkerEvidence{{Activity: "io"}, {Activity: "cpu"}, {Activity: "io"}}
	if c := ReportedCause(g); c != "loader.wait.io" {
		t.Errorf("mostly io: %s", c)
	}
	if c, w := ExpectedCause("loader.wait"); c != correlate.CauseLoaderWait || w != "io" || TruthCauseName("loader.wait") != "loader.wait.io" {
		t.Errorf("simtrain's loader.wait is loader.wait.io: %s %s", c, w)
	}
	if c, w := ExpectedCause("cpu.contention"); c != correlate.CauseCPUContention || w != "" {
		t.Errorf("cpu.contention: %s %q", c, w)
	}
}

func TestAttachTime(t *testing.T) {
	lines := []string{
		`time=2026-11-30T12:00:00.100Z level=INFO msg="uprobes attached" component=tracer library=/x/libcuda.so.1 pid=42 probes=42 missing=8`,
		`time=2026-11-30T12:00:00.900Z level=INFO msg="uprobes attached" component=tracer library=/x/libcuda.so.1 pid=43 probes=42 missing=8`,
		`time=2026-11-30T12:00:00.300Z level=INFO msg="uprobes attached" component=tracer library=/x/libnccl.so.2 pid=42 probes=10 missing=0`,
		`time=2026-11-30T12:00:01.000Z level=INFO msg="detaching probes" component=pipeline`,
	}
	at, libs := attachTime(lines, 42)
	if libs != 2 || at != 1796040000301000000 {
		t.Errorf("attach %d (%d libraries), want 12:00:00.301 for both libraries of pid 42", at, libs)
	}
	if _, libs := attachTime(lines, 7); libs != 0 {
		t.Errorf("pid 7 never attached, got %d libraries", libs)
	}
}

func TestAcceptsContention(t *testing.T) {
	s := TruthStall{Cause: "cpu", Interval: iv(0, 30), RunDelayNS: 12 * msNS}
	g := gap(correlate.GapIdle, correlate.CauseCPUContention, 0, 30)
	if s.Accepts(g) {
		t.Error("40% run-queue wait: cpu.contention is not the dominant cause")
	}
	s.RunDelayNS = 15 * msNS
	if !s.Accepts(g) || !s.Accepts(gap(correlate.GapIdle, correlate.CauseCPU, 0, 30)) {
		t.Error("50% run-queue wait: cpu and cpu.contention are both right")
	}
	if s.Accepts(gap(correlate.GapIdle, correlate.CauseSleep, 0, 30)) {
		t.Error("sleep is never right for a cpu stall")
	}
}

func TestUntil(t *testing.T) {
	tr := handMade()
	tr.Until(110 * msNS)
	if len(tr.Steps) != 2 || tr.Steps[1].Number != 2 || len(tr.Stalls) != 1 {
		t.Errorf("until 110 ms: steps %v stalls %v, want steps 1-2 and the io.read stall (the loader stall precedes step 3)", tr.Steps, tr.Stalls)
	}
	tr = handMade()
	tr.Until(0)
	if len(tr.Steps) != 3 {
		t.Error("Until(0) must keep everything")
	}
}

func TestPeriodTime(t *testing.T) {
	lines := []string{
		`time=2026-11-30T12:00:00.500Z level=DEBUG msg="step period found" component=correlate pid=43 syncs_per_step=1`,
		`time=2026-11-30T12:00:00.700Z level=DEBUG msg="step period found" component=correlate pid=42 syncs_per_step=3`,
	}
	if at, ok := periodTime(lines, 42); !ok || at != 1796040000701000000 {
		t.Errorf("period of pid 42 at %d (%v), want 12:00:00.701", at, ok)
	}
	if _, ok := periodTime(lines, 7); ok {
		t.Error("pid 7 has no period")
	}
}

// NetShare takes, per net stall, the idle gap covering most of it: its net
// time over its duration less the machine's run-queue waits, and whether
// its peers name the stall's server (address and, for simtrain's own
// server, pid).
func TestNetShare(t *testing.T) {
	tr := &Truth{Stalls: []TruthStall{
		{Cause: "net", Interval: iv(10, 40), Peer: "127.0.0.1:9000", ServerPID: 77},
		{Cause: "net", Interval: iv(100, 130), Peer: "127.0.0.1:9000", ServerPID: 77},
		{Cause: "net", Interval: iv(200, 230), Peer: "10.0.0.1:443"},
		{Cause: "sleep", Interval: iv(300, 330)},
		{Cause: "net", Interval: iv(400, 430), Peer: "127.0.0.1:9000", ServerPID: 77}, // no gap
	}}
	peer := func(addr string, pid uint32) correlate.Evidence {
		return correlate.Evidence{Peers: []correlate.PeerEvidence{{Address: addr, PID: pid}}}
	}
	gaps := []correlate.Gap{
		{Start: 9 * msNS, End: 41 * msNS, Duration: 32 * msNS, Cause: correlate.CauseNet, Evidence: peer("127.0.0.1:9000", 77),
			Breakdown: map[correlate.Cause]int64{correlate.CauseNet: 28 * msNS, correlate.CauseCPUContention: 3 * msNS, correlate.CauseCPU: msNS}},
		{Start: 5 * msNS, End: 12 * msNS, Duration: 7 * msNS, Cause: correlate.CauseCPU, // overlaps less
			Breakdown: map[correlate.Cause]int64{correlate.CauseCPU: 7 * msNS}},
		{Start: 100 * msNS, End: 130 * msNS, Duration: 30 * msNS, Cause: correlate.CauseOther, Evidence: peer("127.0.0.1:9000", 0),
			Breakdown: map[correlate.Cause]int64{correlate.CauseOther: 30 * msNS}},
		{Start: 200 * msNS, End: 230 * msNS, Duration: 30 * msNS, Cause: correlate.CauseNet, Evidence: peer("10.0.0.1:443", 0),
			Breakdown: map[correlate.Cause]int64{correlate.CauseNet: 30 * msNS}},
		{Kind: correlate.GapStall, Start: 400 * msNS, End: 430 * msNS, Duration: 30 * msNS, Cause: correlate.CauseNet,
			Breakdown: map[correlate.Cause]int64{correlate.CauseNet: 30 * msNS}},
	}
	r := NetShare(tr, gaps)
	if r == nil || r.Stalls != 3 || r.Named != 2 || r.Share != (Ratio{58 * msNS, 89 * msNS}) {
		t.Fatalf("NetShare = %+v, want 3 stalls, 2 named, share 58/89 ms", r)
	}
	if NetShare(&Truth{Stalls: tr.Stalls[3:4]}, gaps) != nil {
		t.Error("a truth without net stalls has a net result")
	}
}
