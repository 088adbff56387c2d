package correlate

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// logRecords is a slog handler that keeps every record's level and
// message, so tests can count warnings.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// count is how many records at level carry msg.
func (l *logRecords) count(level slog.Level, msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level && r.Message == msg {
			n++
		}
	}
	return n
}

const lateWarnMsg = "events arrived after the watermark: evidence only, the gaps they would have moved are decided"

// TestLateEventsCounted: an event that ends before the watermark is late.
// It is counted in Stats, Losses and the summary, and warned about when
// late events begin and again at most once a minute of event time, not
// once per event.
func TestLateEventsCounted(t *testing.T) {
	logs := &logRecords{}
	c := &collect{}
	e := newEngine(c, func(cfg *Config) { cfg.Logger = slog.New(logs) })
	read := func(at int64) event.Event {
		return event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: at, End: at + ms, Syscall: event.SysRead,
			Name: "read", FDKind: event.FDFile, Path: "/d"}
	}
	e.Event(read(t0))
	e.Advance(t0 + 2e9) // watermark t0 + 1.5 s
	if l := e.Losses(); l.LateEvents != 0 {
		t.Fatalf("late %d before any late event", l.LateEvents)
	}
	for i := range int64(10) {
		e.Event(read(t0 + 10*ms + i*ms))
	}
	if l := e.Losses(); l.LateEvents != 10 || e.Stats().LateEvents != 10 || e.Snapshot().Losses.LateEvents != 10 {
		t.Errorf("losses %+v, stats %+v: want 10 late", l, e.Stats())
	}
	if n := logs.count(slog.LevelWarn, lateWarnMsg); n != 1 {
		t.Errorf("%d warnings for a burst of 10 late events, want 1 (when they began)", n)
	}
	// A minute of event time later late events still come: warned again.
	e.Event(read(t0 + int64(time.Minute)))
	e.Advance(t0 + int64(time.Minute) + 2e9)
	e.Event(read(t0 + int64(time.Minute) + 10*ms))
	if n := logs.count(slog.LevelWarn, lateWarnMsg); n != 2 {
		t.Errorf("%d warnings after a minute, want 2", n)
	}
	if sum := e.Close(t0 + int64(2*time.Minute)); sum.Losses.LateEvents != 11 {
		t.Errorf("summary losses %+v, want 11 late events", sum.Losses)
	}
}

// TestTimelineDropsCounted: a thread that blocks more than attribute.MaxIntervals
// times within what its timeline must keep loses its oldest intervals;
// each one is counted.
func TestTimelineDropsCounted(t *testing.T) {
	c := &collect{}
	e := newEngine(c, nil)
	const n = attribute.MaxIntervals + 904
	for i := range int64(n) {
		at := t0 + i*100*us
		e.Event(event.Event{Kind: event.KindSyscall, PID: 100, TID: 101, Start: at, End: at + 50*us, Syscall: event.SysRead,
			Name: "read", FDKind: event.FDFile, Path: "/d"})
	}
	e.Advance(t0 + n*100*us + 2e9) // within retain of every read
	if got := e.threads[101].Len(); got != attribute.MaxIntervals {
		t.Fatalf("timeline holds %d intervals, want the cap %d", got, attribute.MaxIntervals)
	}
	if l := e.Losses(); l.DroppedIntervals != n-attribute.MaxIntervals {
		t.Errorf("dropped intervals %d, want %d", l.DroppedIntervals, n-attribute.MaxIntervals)
	}
	if sum := e.Close(t0 + n*100*us + 3e9); sum.Losses.DroppedIntervals != n-attribute.MaxIntervals {
		t.Errorf("summary losses %+v", sum.Losses)
	}
}

// TestIncompleteStepsAndGapsAfterStep: a CPU-ahead gap waits for the GPU
// windows over it; windows 700 ms late hold every step after it, and
// thousands of tiny steps (70 µs) pile up past maxPendingSteps. The oldest
// are emitted incomplete, the gap's own step among them, so the gap is
// delivered after its step: in the totals, in no step. Both are counted,
// and the counts agree with what the sink saw: one warning per incomplete
// step, and the gap arriving after the step that holds its midpoint. The
// same run without the tiny steps loses nothing.
func TestIncompleteStepsAndGapsAfterStep(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tiny        int
		wantLoss    bool
		wantAfterSt uint64
	}{
		{"steps on time", 0, false, 0},
		{"tiny steps pile up", 6000, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim()
			for range 10 {
				s.step(20, 2*ms, 100*us)
			}
			for range 6 {
				s.launches(10, 3*ms, 50*us)
				s.sync()
			}
			s.launches(10, 3*ms, 50*us)
			s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDFile,
				Path: "/ckpt/a.pt"}, 60*ms)
			s.launches(10, 3*ms, 50*us)
			s.sync()
			for range tc.tiny {
				s.step(1, 50*us, 5*us)
			}
			for range 8 {
				s.step(20, 2*ms, 100*us)
			}
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			logs := &logRecords{}
			c := &orderSink{}
			e := New(Config{Logger: slog.New(logs)}, c)
			sum := feed(e, &c.collect, s.evs, wins, s.t+3e9, 20*ms, 700*ms)
			l := sum.Losses
			if got := c.afterStep(); l.GapsAfterStep != got || got != tc.wantAfterSt {
				t.Errorf("gaps after step %d, the sink saw %d, want %d", l.GapsAfterStep, got, tc.wantAfterSt)
			}
			warned := logs.count(slog.LevelWarn, "step waited too long for its inputs, emitting it incomplete")
			if l.IncompleteSteps != uint64(warned) || (l.IncompleteSteps > 0) != tc.wantLoss {
				t.Errorf("incomplete steps %d, %d warned", l.IncompleteSteps, warned)
			}
			if !tc.wantLoss && l.Any() {
				t.Errorf("losses %+v in a run that loses nothing", l)
			}
			if len(c.gaps) != 1 || c.gaps[0].Evidence.Source != "host+gpu" {
				t.Fatalf("gaps %+v, want the one CPU-ahead gap", c.gaps)
			}
		})
	}
}

// orderSink keeps gaps and steps in the order the engine emitted them.
type orderSink struct {
	collect
	order []any
}

func (o *orderSink) Gap(g Gap) {
	o.collect.Gap(g)
	o.order = append(o.order, g)
}

func (o *orderSink) Step(s StepResult) {
	o.collect.Step(s)
	o.order = append(o.order, s.Step)
}

// afterStep counts gaps emitted after the step holding their midpoint.
func (o *orderSink) afterStep() uint64 {
	var n uint64
	var done []Step
	for _, x := range o.order {
		switch v := x.(type) {
		case Step:
			done = append(done, v)
		case Gap:
			mid := v.Start + v.Duration/2
			for _, st := range done {
				if st.PID == v.PID && st.Start <= mid && mid < st.End {
					if !v.Late {
						panic("a gap delivered after its step is not marked Late")
					}
					n++
					break
				}
			}
		}
	}
	return n
}

// TestEventQueueBound: a flood of events with no Advance (a reader far
// behind, a probe firing nonstop) never holds more than MaxBuffered. The
// oldest are processed early, in end order, and counted; the watermark
// moves with them, so an event that ends before it and arrives later is
// late. Advance then takes the rest as usual.
func TestEventQueueBound(t *testing.T) {
	t.Run("small bound", func(t *testing.T) {
		logs := &logRecords{}
		e := New(Config{MaxBuffered: 8, Logger: slog.New(logs)}, &collect{})
		for i := range int64(20) {
			// Arrival order is not end order: every other pair swapped.
			k := i ^ 1
			at := t0 + k*ms
			e.Event(event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: at, End: at + 100*us, Syscall: event.SysRead,
				Name: "read", FDKind: event.FDFile, Path: "/d"})
			if b := e.Stats().Buffered; b > 8 {
				t.Fatalf("%d events buffered past the bound of 8", b)
			}
		}
		l := e.Losses()
		if l.ForcedEvents != 12 || e.Stats().Buffered != 8 {
			t.Errorf("forced %d, buffered %d: want 12 and 8", l.ForcedEvents, e.Stats().Buffered)
		}
		// The forced events were the 12 oldest, in end order: the
		// watermark is at the end of the 12th read.
		if want := t0 + 11*ms + 100*us; e.wm != want {
			t.Errorf("watermark %d, want the end of the 12th oldest (%d)", e.wm-t0, want-t0)
		}
		if th := e.threads[100]; th.Len() != 12 || th.At(0).Start != t0 || th.At(11).Start != t0+11*ms {
			t.Errorf("timeline %d intervals, want the 12 oldest in end order", th.Len())
		}
		if logs.count(slog.LevelWarn, "event queue full: the oldest events are processed before their watermark") != 1 {
			t.Errorf("want one warning when forcing began")
		}
		e.Event(event.Event{Kind: event.KindSyscall, PID: 100, TID: 100, Start: t0 + 5*ms, End: t0 + 5*ms + 50*us,
			Syscall: event.SysRead, Name: "read", FDKind: event.FDFile, Path: "/d"})
		if l := e.Losses(); l.LateEvents != 1 {
			t.Errorf("an event behind the forced watermark: late %d, want 1", l.LateEvents)
		}
		sum := e.Close(t0 + 3e9)
		if sum.Losses.ForcedEvents != 12 || e.Stats().Buffered != 0 || e.threads[100].Len() != 21 {
			t.Errorf("after close: losses %+v, buffered %d, timeline %d", sum.Losses, e.Stats().Buffered, e.threads[100].Len())
		}
	})
	t.Run("default bound", func(t *testing.T) {
		e := New(Config{Logger: quiet()}, &collect{})
		const flood = DefaultMaxBuffered + 1000
		for i := range int64(flood) {
			at := t0 + i*us
			e.Event(event.Event{Kind: event.KindRunqueue, PID: 100, TID: 100 + uint32(i%64), Start: at, End: at + us})
		}
		if b, f := e.Stats().Buffered, e.Losses().ForcedEvents; b != DefaultMaxBuffered || f != 1000 {
			t.Errorf("buffered %d, forced %d: want %d and 1000", b, f, DefaultMaxBuffered)
		}
	})
}
