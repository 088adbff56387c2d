package correlate_test

import (
	"bytes"
	"sort"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/correlate/record"
	"github.com/gaptrace/gaptrace/event"
)

// gapSink keeps the gaps an engine emits.
type gapSink struct{ gaps []correlate.Gap }

func (c *gapSink) Gap(g correlate.Gap)       { c.gaps = append(c.gaps, g) }
func (c *gapSink) Step(correlate.StepResult) {}

// TestAutoRecordReplay: a recording carries auto's windows, so its replay
// decides the same gaps as full or lite as the live engine did.
func TestAutoRecordReplay(t *testing.T) {
	evs, on, off, end := correlate.AutoRun()
	var buf bytes.Buffer
	rec := record.NewWriter(&buf, record.Header{Probes: correlate.ProbesAuto})
	rec.ProbesLive(true, on)
	rec.ProbesLive(false, off)
	for i := range evs {
		rec.Event(&evs[i])
	}
	if err := rec.Close(end + 2e9); err != nil {
		t.Fatal(err)
	}
	h, calls, err := record.Read(&buf)
	if err != nil || h.Probes != correlate.ProbesAuto {
		t.Fatalf("read recording: %v, header %+v", err, h)
	}
	c := &gapSink{}
	sum := record.Replay(correlate.Config{Probes: h.Probes, Logger: correlate.Quiet()}, c, calls)
	var big []correlate.Gap
	for _, g := range c.gaps {
		if g.Duration >= correlate.Ms {
			big = append(big, g)
		}
	}
	if len(big) != 1 || big[0].Probes != correlate.ProbesFull || big[0].Cause != correlate.CauseIORead {
		t.Fatalf("replayed gaps %+v, want one io.read decided as full", big)
	}
	if sum.ProbesFullNS != off-on {
		t.Errorf("replayed time at full %d, want %d", sum.ProbesFullNS, off-on)
	}
}

// TestRanksRecordedRank: a recording keeps SetRank, so its replay names
// the late rank as the live engine did.
func TestRanksRecordedRank(t *testing.T) {
	ranks, pids, end := correlate.RankRun()
	var buf bytes.Buffer
	rec := record.NewWriter(&buf, record.Header{Probes: "full"})
	var evs []event.Event
	for r, pid := range pids {
		rec.SetDevice(pid, r)
		rec.SetRank(pid, r, 2)
		evs = append(evs, ranks[r]...)
	}
	sort.SliceStable(evs, func(a, b int) bool { return evs[a].End < evs[b].End })
	until := end + 2e9
	i := 0
	for now := correlate.T0; now <= until; now += 20 * correlate.Ms {
		for ; i < len(evs) && evs[i].End <= now; i++ {
			rec.Event(&evs[i])
		}
		rec.Advance(now)
	}
	if err := rec.Close(until); err != nil {
		t.Fatal(err)
	}
	h, calls, err := record.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	cfg := h.Config()
	cfg.Logger = correlate.Quiet()
	c := &gapSink{}
	record.Replay(cfg, c, calls)
	n := 0
	for _, g := range c.gaps {
		if g.Kind != correlate.GapStall || g.PID != 100 {
			continue
		}
		n++
		if lr := g.Evidence.Collective.LateRank; lr == nil || *lr != 1 {
			t.Fatalf("replayed stall names rank %v, want 1", lr)
		}
	}
	if n != 12 {
		t.Errorf("%d replayed stalls of rank 0, want 12", n)
	}
}
