package live

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/whatif"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func ms(n int64) int64 { return n * int64(time.Millisecond) }

func feed(a *Aggregator, c *clock) {
	base := time.Unix(1_700_000_000, 0).UnixNano()
	for i := range int64(20) {
		c.t = c.t.Add(100 * time.Millisecond)
		a.Step(correlate.StepResult{Step: correlate.Step{PID: 42, Number: i + 1, Start: base + i*ms(100), End: base + (i+1)*ms(100),
			IdleNS: ms(40), ByCause: map[correlate.Cause]int64{correlate.CauseIORead: ms(30), correlate.CauseCPU: ms(10)}}})
	}
	a.Gap(correlate.Gap{PID: 42, TID: 43, Step: 7, Duration: ms(38), Cause: correlate.CauseIORead,
		Breakdown: map[correlate.Cause]int64{correlate.CauseIORead: ms(38)},
		Evidence: correlate.Evidence{Files: []correlate.FileEvidence{
			{Path: "/data/shard-0003.bin", Op: "read", Bytes: 4 << 20, Calls: 4, NS: ms(37)},
			{Path: "/data/shard-0004.bin", Op: "read", Bytes: 1 << 20, Calls: 1, NS: ms(5)},
		}}})
	a.Gap(correlate.Gap{PID: 42, TID: 43, Step: 9, Duration: ms(12), Cause: correlate.CauseNet,
		Breakdown: map[correlate.Cause]int64{correlate.CauseNet: ms(12)},
		Evidence: correlate.Evidence{Peers: []correlate.PeerEvidence{
			{Address: "127.0.0.1:7777", PID: 99, Comm: "logsrv", Bytes: 512, Calls: 2, NS: ms(12)},
		}}})
}

func TestViewFromSteps(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	a.SetStats(Stats{Drops: 3, Targets: []int{42}})
	v := a.View("pid 42 python train.py")

	if v.Steps != 20 || v.Gaps != 2 {
		t.Fatalf("steps=%d gaps=%d, want 20 and 2", v.Steps, v.Gaps)
	}
	// 20 steps in 2 s of elapsed time.
	if v.StepsPerSec < 9.9 || v.StepsPerSec > 10.1 {
		t.Errorf("rate %.2f/s, want 10/s", v.StepsPerSec)
	}
	if v.IdlePct < 39.9 || v.IdlePct > 40.1 {
		t.Errorf("idle %.2f%%, want 40%% (40 of every 100 ms)", v.IdlePct)
	}
	if len(v.ByCause) != 2 || v.ByCause[0].Cause != correlate.CauseIORead || v.ByCause[0].Share != 0.75 {
		t.Errorf("by cause %+v, want io.read 75%% first", v.ByCause)
	}
	if v.TopFiles[0].Name != "/data/shard-0003.bin" || v.TopFiles[0].Bytes != 4<<20 {
		t.Errorf("top file %+v", v.TopFiles[0])
	}
	if v.TopPeers[0].Note != "pid 99 logsrv" {
		t.Errorf("top peer %+v", v.TopPeers[0])
	}
	if v.Stats.Drops != 3 {
		t.Errorf("drops %d", v.Stats.Drops)
	}
}

// A comm stall judged on the ranks' own timelines names the late rank.
func TestFrameLateRank(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	late := int32(1)
	a.Gap(correlate.Gap{PID: 100, TID: 100, Step: 7, Kind: correlate.GapStall, Duration: ms(30), Cause: correlate.CauseComm,
		Breakdown: map[correlate.Cause]int64{correlate.CauseComm: ms(30)},
		Evidence:  correlate.Evidence{Collective: &correlate.CollectiveEvidence{Op: "AllReduce", LateRank: &late, LatePID: 101, LateByNS: ms(31)}}})
	f := Frame(a.View("x"), 80)
	if !strings.Contains(f, "last gap: 30 ms comm (pid 100 tid 100, step 7)\n  waited on rank 1 (pid 101), 31 ms late") {
		t.Errorf("frame does not name the late rank:\n%s", f)
	}
	// Traced by another sidecar of the job: named with it.
	a.Gap(correlate.Gap{PID: 100, TID: 100, Step: 8, Kind: correlate.GapStall, Duration: ms(30), Cause: correlate.CauseComm,
		Breakdown: map[correlate.Cause]int64{correlate.CauseComm: ms(30)},
		Evidence: correlate.Evidence{Collective: &correlate.CollectiveEvidence{Op: "AllReduce", LateRank: &late, LatePID: 1,
			LateByNS: ms(31), LateSidecar: "worker-1/rank1/7"}}})
	if f := Frame(a.View("x"), 80); !strings.Contains(f, "waited on rank 1 (pid 1, sidecar worker-1/rank1/7), 31 ms late") {
		t.Errorf("frame does not name the late rank's sidecar:\n%s", f)
	}
	v := a.View("x")
	v.Stats.Peers = "serving 10.0.0.5:29601, 1 other sidecar"
	if f := Frame(v, 80); !strings.Contains(f, "\npeers: serving 10.0.0.5:29601, 1 other sidecar\n") {
		t.Errorf("frame does not say how the peer exchange stands:\n%s", f)
	}
	// Linked by their collectives, with no RANK to say it: the pid alone.
	a.Gap(correlate.Gap{PID: 100, TID: 100, Step: 8, Kind: correlate.GapStall, Duration: ms(30), Cause: correlate.CauseComm,
		Breakdown: map[correlate.Cause]int64{correlate.CauseComm: ms(30)},
		Evidence:  correlate.Evidence{Collective: &correlate.CollectiveEvidence{Op: "AllReduce", LatePID: 101, LateByNS: ms(31)}}})
	f = Frame(a.View("x"), 80)
	if !strings.Contains(f, "step 8)\n  waited on pid 101 (rank unknown), 31 ms late") {
		t.Errorf("frame does not name the late process:\n%s", f)
	}
}

func TestSnapshotWins(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	a.SetSummary(correlate.Summary{WallNS: ms(10_000), GPUIdleNS: ms(2_000), GPUStallNS: ms(500), Steps: 25, Gaps: 9,
		DroppedEvents: 11, ByCause: map[correlate.Cause]int64{correlate.CauseComm: ms(500), correlate.CauseLoaderWait: ms(2000)}})
	v := a.View("x")
	if v.IdlePct != 25 {
		t.Errorf("idle %.2f%%, want 25%% from the snapshot (idle+stall over wall)", v.IdlePct)
	}
	if v.Steps != 25 || v.Gaps != 9 || v.Stats.Drops != 11 {
		t.Errorf("steps=%d gaps=%d drops=%d, want the snapshot's 25/9/11", v.Steps, v.Gaps, v.Stats.Drops)
	}
	if v.ByCause[0].Cause != correlate.CauseLoaderWait || v.ByCause[1].Cause != correlate.CauseComm {
		t.Errorf("order %+v", v.ByCause)
	}
}

func TestFrame(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	f := Frame(a.View("pid 42 python train.py"), 80)
	for _, want := range []string{
		"gaptrace · pid 42 python train.py · 00:00:02",
		"steps 20 (10.0/s)   GPU idle 40.0%   gaps 2   dropped events 0",
		"idle by cause (800 ms lost of 2.00 s)",
		"/data/shard-0003.bin",
		"127.0.0.1:7777 pid 99 logsrv",
		"last gap: 12 ms net",
	} {
		if !strings.Contains(f, want) {
			t.Errorf("frame lacks %q:\n%s", want, f)
		}
	}
	lines := strings.Split(f, "\n")
	var ioLine, cpuLine string
	for _, l := range lines {
		if utf8.RuneCountInString(l) > 80 {
			t.Errorf("line wider than 80 columns: %q", l)
		}
		if strings.HasPrefix(l, "  io.read") {
			ioLine = l
		}
		if strings.HasPrefix(l, "  cpu ") {
			cpuLine = l
		}
	}
	if !strings.Contains(ioLine, "600 ms") || !strings.Contains(ioLine, "75.0%") {
		t.Errorf("io.read line %q", ioLine)
	}
	// Bars are proportional: io.read has three times cpu's share.
	if n, m := strings.Count(ioLine, "█"), strings.Count(cpuLine, "█"); n < 3*m-1 || n > 3*m+3 || m == 0 {
		t.Errorf("bar lengths io.read=%d cpu=%d, want about 3:1", n, m)
	}
	// Causes are listed largest first.
	if strings.Index(f, "  io.read") > strings.Index(f, "  cpu ") {
		t.Error("io.read (75%) listed after cpu (25%)")
	}
}

func TestEmptyFrameAndSummary(t *testing.T) {
	a := NewAggregator(nil)
	v := a.View("pid 1 sleep 30")
	if v.IdlePct != -1 {
		t.Errorf("idle %.1f with no data, want unknown", v.IdlePct)
	}
	s := Summary(v, Outputs{Gaps: "/tmp/g.jsonl", Summary: "/tmp/s.json"}, 80)
	for _, want := range []string{"GPU idle n/a", "nothing attributed yet", "no GPU activity was attributed", "gaps     /tmp/g.jsonl", "summary  /tmp/s.json"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
}

// TestFrameLosses: what the engine could not use in full is named under
// the dropped-events line, wrapped to the width, zero counts left out; a
// run that lost nothing shows no such line. The log line carries them too.
func TestFrameLosses(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	if f := Frame(a.View("x"), 80); strings.Contains(f, "late events") || strings.Contains(f, "incomplete") {
		t.Errorf("losses shown in a run that lost nothing:\n%s", f)
	}
	a.SetSummary(correlate.Summary{WallNS: ms(10_000), Steps: 25, Gaps: 9, DroppedEvents: 2,
		Losses: correlate.Losses{LateEvents: 37, ForcedEvents: 5, IncompleteSteps: 3, GapsAfterStep: 1, DroppedIntervals: 904}})
	v := a.View("x")
	f := Frame(v, 80)
	lines := strings.Split(f, "\n")
	var at int
	for i, l := range lines {
		if utf8.RuneCountInString(l) > 80 {
			t.Errorf("line wider than 80 columns: %q", l)
		}
		if strings.Contains(l, "dropped events 2") {
			at = i
		}
	}
	under := strings.Join(lines[at+1:at+3], "\n")
	for _, want := range []string{"late events 37", "forced events 5", "incomplete steps 3", "gaps after their step 1",
		"dropped intervals 904"} {
		if !strings.Contains(under, want) {
			t.Errorf("the two lines under dropped events lack %q:\n%s", want, f)
		}
	}
	a.SetSummary(correlate.Summary{WallNS: ms(10_000), Losses: correlate.Losses{LateEvents: 37}})
	if f := Frame(a.View("x"), 80); !strings.Contains(f, "dropped events 0\n  late events 37\n") || strings.Contains(f, "forced") {
		t.Errorf("late events alone:\n%s", f)
	}
	if l := LogLine(v); !strings.Contains(l, " late=37 forced=5 incomplete_steps=3 gaps_after_step=1 dropped_intervals=904") {
		t.Errorf("log line lacks the losses: %s", l)
	}
}

func TestLogLine(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	l := LogLine(a.View("x"))
	want := "gaptrace elapsed=2s steps=20 rate=10.0/s gpu_idle=40.0% gaps=2 drops=0 causes=io.read:75%,cpu:25% top_file=/data/shard-0003.bin top_peer=127.0.0.1:7777"
	if l != want {
		t.Errorf("log line\n got %s\nwant %s", l, want)
	}
	if strings.Contains(l, "\n") {
		t.Error("log line spans lines")
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		frac  float64
		width int
		full  int
	}{{0, 10, 0}, {1, 10, 10}, {0.5, 10, 5}, {2, 10, 10}, {-1, 10, 0}} {
		b := Bar(tc.frac, tc.width)
		if utf8.RuneCountInString(b) != tc.width {
			t.Errorf("Bar(%v,%d) = %q: %d cells", tc.frac, tc.width, b, utf8.RuneCountInString(b))
		}
		if n := strings.Count(b, "█"); n != tc.full {
			t.Errorf("Bar(%v,%d) = %q: %d full cells, want %d", tc.frac, tc.width, b, n, tc.full)
		}
	}
	// A share too small for a full cell still shows.
	if b := Bar(0.01, 10); strings.Count(b, "·") != 9 {
		t.Errorf("Bar(0.01) = %q, want a partial cell", b)
	}
}

func TestFormat(t *testing.T) {
	for ns, want := range map[int64]string{500: "500 ns", 1500: "2 µs", ms(38): "38 ms", ms(1500): "1.50 s", ms(12_345): "12.3 s", ms(123_456): "123 s"} {
		if got := FormatNS(ns); got != want {
			t.Errorf("FormatNS(%d) = %q, want %q", ns, got, want)
		}
	}
	for b, want := range map[uint64]string{512: "512 B", 4 << 20: "4.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := FormatBytes(b); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", b, got, want)
		}
	}
}

func TestTerminalFencesTheFrameOff(t *testing.T) {
	var b strings.Builder
	rows := 24
	term := &Terminal{W: &b, Rows: func() int { return rows }}
	term.Draw("a\nb\n")
	// Room made below the cursor, the scroll region set above the frame,
	// the frame drawn in the bottom two rows, the cursor left where it was.
	want := "\n\n\x1b[2A" + "\x1b7\x1b[1;22r\x1b8" +
		"\x1b7\x1b[23;1H\x1b[2Ka\x1b[24;1H\x1b[2Kb\x1b8"
	if got := b.String(); got != want {
		t.Errorf("first frame %q, want %q", got, want)
	}
	b.Reset()
	term.Draw("c\n")
	// A shorter frame keeps the area: no region change, a blank row.
	if got, want := b.String(), "\x1b7\x1b[23;1H\x1b[2Kc\x1b[24;1H\x1b[2K\x1b8"; got != want {
		t.Errorf("shorter frame %q, want %q", got, want)
	}
	b.Reset()
	term.Draw("x\ny\nz\n")
	// A taller one scrolls the command's region up by one row, follows its
	// cursor, and moves the fence.
	want = "\x1b7\x1b[22;1H\n\x1b8\x1b[1A" + "\x1b7\x1b[1;21r\x1b8" +
		"\x1b7\x1b[22;1H\x1b[2Kx\x1b[23;1H\x1b[2Ky\x1b[24;1H\x1b[2Kz\x1b8"
	if got := b.String(); got != want {
		t.Errorf("taller frame %q, want %q", got, want)
	}
	b.Reset()
	rows = 10
	term.Draw(strings.Repeat("l\n", 9))
	// The terminal shrank: the frame is cut to leave the command 4 rows.
	if got := b.String(); !strings.HasPrefix(got, "\x1b7\x1b[1;4r\x1b8") || strings.Count(got, "\x1b[2K") != 6 {
		t.Errorf("after a resize %q: want the region 1-4 and 6 frame rows", got)
	}
	b.Reset()
	term.Clear()
	if got, want := b.String(), "\x1b7\x1b[r\x1b[5;1H\x1b[J\x1b8"; got != want {
		t.Errorf("clear %q, want %q (region reset, frame rows erased)", got, want)
	}
	b.Reset()
	term.Draw("H\n")
	term.Clear()
	if b.Len() != 0 {
		t.Errorf("after Clear: %q, want nothing (no more frames)", b.String())
	}
}

func TestTerminalUnknownHeightDrawsNothing(t *testing.T) {
	var b strings.Builder
	term := &Terminal{W: &b}
	term.Draw("a\n")
	term.Clear()
	if b.Len() != 0 {
		t.Errorf("wrote %q without knowing the terminal's height", b.String())
	}
}

// A checkpoint file's column names what blocked most, within its width.
func TestOpsNote(t *testing.T) {
	for _, c := range []struct {
		ops  map[string]int64
		want string
	}{
		{map[string]int64{"read": 5}, "read"},
		{map[string]int64{"fsync": 970, "write": 300, "open": 40}, "fsync+write"},
		{map[string]int64{"open": 40, "write": 900, "fsync": 30}, "write+open"},
		{map[string]int64{"pwrite64": 9, "fdatasync": 10}, "fdatasync"},
	} {
		if got := opsNote(c.ops); got != c.want {
			t.Errorf("opsNote(%v) = %q, want %q", c.ops, got, c.want)
		}
		if len(opsNote(c.ops)) > opsNoteWidth && len(c.ops) > 1 {
			t.Errorf("opsNote(%v) wider than its column", c.ops)
		}
	}
}

// The live view shows the two largest savings on one line; the summary a
// block with each fix, saying when a cause was paid in few steps only, and
// leaves out savings too small to act on.
func TestWhatIf(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	acc := whatif.New()
	a.SetWhatIf(acc.Estimates)
	for n := int64(1); n <= 10; n++ {
		s := correlate.Step{PID: 1, Number: n, Start: n * 1e9, End: n*1e9 + 100e6,
			ByCause: map[correlate.Cause]int64{correlate.CauseCPU: 5e6, correlate.CauseOther: 1e5}}
		if n%5 == 0 {
			s.ByCause[correlate.CauseIOWrite] = 210e6
			s.End += 210e6
		}
		a.Step(correlate.StepResult{Step: s})
		acc.Step(correlate.StepResult{Step: s})
	}
	v := a.View("x")
	frame := Frame(v, 100)
	if want := "what if: without io.write −42 ms/step (−29.6%), cpu −5.0 ms/step (−3.5%)\n"; !strings.Contains(frame, want) {
		t.Errorf("live view lacks %q:\n%s", want, frame)
	}
	sum := Summary(v, Outputs{}, 100)
	for _, want := range []string{
		"without io.write        −42 ms/step (−29.6%) — write checkpoints and logs asynchronously\n",
		"paid in 2 of 10 steps, up to 210 ms in one\n",
		"without cpu             −5.0 ms/step (−3.5%) — cut launch overhead",
	} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
	if strings.Contains(sum, "what if:") || strings.Contains(sum, "without other") || strings.Count(sum, "paid in") != 1 {
		t.Errorf("summary repeats the live line, shows a negligible saving or spreads an every-step cause:\n%s", sum)
	}
	if l := LogLine(v); !strings.Contains(l, " what_if=io.write:-42ms/step:-29.6%") {
		t.Errorf("log line lacks the largest saving: %s", l)
	}
}

// TestFrameLastGapDetail: the last gap's copy or host operation, or the
// thread its feeder waited on, gets a line under it, with the fix for a
// pageable copy, within the width.
func TestFrameLastGapDetail(t *testing.T) {
	for _, tc := range []struct {
		ev   correlate.Evidence
		want string
	}{
		{correlate.Evidence{Copy: &correlate.CopyEvidence{Call: "cuMemcpyHtoDAsync", Direction: "htod", Bytes: 180e6,
			NS: ms(30), GBps: 6, Pageable: true, Fix: "pin the host buffer (pin_memory=True / cudaHostRegister)"}},
			"pageable cuMemcpyHtoDAsync htod 180.0 MB at 6.0 GB/s: pin the host"},
		{correlate.Evidence{Episode: &correlate.EpisodeEvidence{Kind: "checkpoint", File: "/ckpt/state.pt", Copies: 12,
			CopyNS: ms(4), SerializeNS: ms(27), Writes: 12, WriteNS: ms(7), FsyncNS: ms(13)}},
			"checkpoint /ckpt/state.pt: 12 copies 4 ms, serialization 27 ms, 12 writes"},
		{correlate.Evidence{LockHolders: []correlate.LockHolderEvidence{{TID: 44, Comm: "metrics", NS: ms(25), Doing: correlate.CauseSleep}}},
			"waited 25 ms on tid 44 (metrics), which slept holding the lock"},
		{correlate.Evidence{LockHolders: []correlate.LockHolderEvidence{{TID: 44, NS: ms(25), Doing: correlate.CauseCPU}}},
			"waited 25 ms on tid 44, which computed holding the lock"},
		{correlate.Evidence{LockHolders: []correlate.LockHolderEvidence{{TID: 44, NS: ms(25), Doing: correlate.CauseNet, Peer: "10.0.0.7:443"}}},
			"waited 25 ms on tid 44, which was in net with 10.0.0.7:443"},
	} {
		c := &clock{t: time.Unix(1_700_000_000, 0)}
		a := NewAggregator(c.now)
		feed(a, c)
		a.Gap(correlate.Gap{PID: 42, TID: 43, Step: 11, Duration: ms(30), Cause: correlate.CauseCUDAMemcpy, Evidence: tc.ev})
		f := Frame(a.View("pid 42 python train.py"), 80)
		if !strings.Contains(f, tc.want) {
			t.Errorf("frame lacks %q:\n%s", tc.want, f)
		}
		for _, l := range strings.Split(f, "\n") {
			if utf8.RuneCountInString(l) > 80 {
				t.Errorf("line wider than 80 columns: %q", l)
			}
		}
	}
}

// TestFrameAutoProbes: under auto the frame and the summary say how much
// of the time ran at full, and the last gap which set decided it.
func TestFrameAutoProbes(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	feed(a, c)
	a.Gap(correlate.Gap{PID: 42, TID: 42, Duration: 5e6, Cause: correlate.CauseIORead, Probes: correlate.ProbesLite})
	a.SetSummary(correlate.Summary{WallNS: 2e9, GPUIdleNS: 8e8, Probes: correlate.ProbesAuto, ProbesFullNS: 25e7,
		ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 8e8}})
	f := Summary(a.View("x"), Outputs{}, 80)
	for _, want := range []string{"probes auto: 12.5% of the time at full", "last gap: 5 ms io.read (pid 42 tid 42, step 0, probes lite)"} {
		if !strings.Contains(f, want) {
			t.Errorf("summary lacks %q:\n%s", want, f)
		}
	}
	a.SetSummary(correlate.Summary{WallNS: 2e9, Probes: correlate.ProbesFull})
	if f := Frame(a.View("x"), 80); strings.Contains(f, "probes auto") {
		t.Errorf("frame under full mentions auto:\n%s", f)
	}
}

// TestWindowsAreNoSteps: fixed windows (no step period known yet: a
// model's setup, a first iteration that compiled for seconds) count apart
// from steps in the view, its header and its log line; their idle counts.
func TestWindowsAreNoSteps(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	for i := int64(1); i <= 3; i++ {
		a.Step(correlate.StepResult{Step: correlate.Step{PID: 42, Number: i, Window: true, Start: i * ms(1000), End: (i + 1) * ms(1000), IdleNS: ms(900),
			ByCause: map[correlate.Cause]int64{correlate.CauseCPU: ms(900)}}})
	}
	c.t = c.t.Add(time.Second)
	for i := int64(4); i <= 13; i++ {
		a.Step(correlate.StepResult{Step: correlate.Step{PID: 42, Number: i, Start: i * ms(100), End: (i + 1) * ms(100), IdleNS: ms(10),
			ByCause: map[correlate.Cause]int64{correlate.CauseIORead: ms(10)}}})
	}
	v := a.View("pid 42 python train.py")
	if v.Steps != 10 || v.Windows != 3 {
		t.Fatalf("steps=%d windows=%d, want 10 and 3", v.Steps, v.Windows)
	}
	if f := Frame(v, 100); !strings.Contains(f, "steps 10 (") || !strings.Contains(f, "+ 3 windows") {
		t.Errorf("header does not count the windows apart:\n%s", f)
	}
	if l := LogLine(v); !strings.Contains(l, "steps=10 ") || !strings.Contains(l, "windows=3") {
		t.Errorf("log line: %s", l)
	}
	if v.LostNS != 3*ms(900)+10*ms(10) {
		t.Errorf("lost %d ns, want the windows' idle counted too", v.LostNS)
	}
}

// TestFrameNeverContradicts: a snapshot taken before the engine folded the
// first gaps into its totals (idle 0, no cause) must not leave a frame with
// gaps and a 44 ms fsync as the last gap beside "nothing attributed yet"
// and an idle GPU of 0%.
func TestFrameNeverContradicts(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	a := NewAggregator(c.now)
	c.t = c.t.Add(2 * time.Second)
	a.SetSummary(correlate.Summary{WallNS: ms(2000), Steps: 0})
	for i := range 15 {
		a.Gap(correlate.Gap{PID: 42, TID: 42, Step: int64(i), Duration: ms(2), Cause: correlate.CauseCPU})
	}
	a.Gap(correlate.Gap{PID: 42, TID: 42, Step: 15, Duration: ms(44), Cause: correlate.CauseIOWrite,
		Breakdown: map[correlate.Cause]int64{correlate.CauseIOWrite: ms(44)}})
	v := a.View("x")
	f := Frame(v, 100)
	if strings.Contains(f, "nothing attributed yet") || v.IdlePct <= 0 {
		t.Errorf("idle %.1f%% with %d gaps:\n%s", v.IdlePct, v.Gaps, f)
	}
	if len(v.ByCause) == 0 || v.ByCause[0].Cause != correlate.CauseIOWrite || v.LostNS != ms(74) {
		t.Errorf("causes %+v lost %d, want io.write first and the gaps' 74 ms", v.ByCause, v.LostNS)
	}
	// Once the engine's totals cover more than the gaps, they win again.
	a.SetSummary(correlate.Summary{WallNS: ms(3000), GPUIdleNS: ms(600), Steps: 20, Gaps: 16,
		ByCause: map[correlate.Cause]int64{correlate.CauseIOWrite: ms(400), correlate.CauseCPU: ms(200)}})
	if v := a.View("x"); v.LostNS != ms(600) || v.IdlePct != 20 {
		t.Errorf("lost %d idle %.1f%%, want the snapshot's 600 ms, 20%%", v.LostNS, v.IdlePct)
	}
	// Without any snapshot or step, the gaps alone are shown against the
	// time elapsed.
	b := NewAggregator(c.now)
	c.t = c.t.Add(time.Second)
	b.Gap(correlate.Gap{PID: 42, Duration: ms(100), Cause: correlate.CauseSleep})
	if v := b.View("x"); v.IdlePct != 10 || strings.Contains(Frame(v, 100), "nothing attributed yet") {
		t.Errorf("gaps only: idle %.1f%%\n%s", v.IdlePct, Frame(v, 100))
	}
}

func TestFrameExportLine(t *testing.T) {
	a := NewAggregator(nil)
	a.SetStats(Stats{Export: ExportStats{Exported: 0, Dropped: 882, Errors: 7, Failing: true}})
	v := a.View("x")
	if f := Frame(v, 100); !strings.Contains(f, "span export failing: 7 failed exports, 882 spans dropped, 0 exported\n") {
		t.Errorf("no export line:\n%s", f)
	}
	if l := LogLine(v); !strings.Contains(l, " export_errors=7 export_dropped=882 export_failing=true") {
		t.Errorf("log line: %s", l)
	}
	a.SetStats(Stats{Export: ExportStats{Exported: 500}})
	if f := Frame(a.View("x"), 100); strings.Contains(f, "span export") {
		t.Errorf("export line while every export succeeded:\n%s", f)
	}
}
