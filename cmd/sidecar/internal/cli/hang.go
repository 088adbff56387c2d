package cli

import (
	"encoding/json"
	"sync"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/hang"
)

// Dumper is a pipeline that can say, now, what every traced thread is
// doing: its in-flight call and its native and Python stacks. `gaptrace
// dump` and SIGUSR1 ask for it.
type Dumper interface {
	Dump() ([]byte, error)
}

// hangRecords remembers which hangs the gaps file has: one record when a
// hang is found, one more when it ends.
type hangRecords struct {
	mu      sync.Mutex
	written map[string]bool
}

// hangSink is the session's side of a hang, called from the pipeline's
// hang watch as it happens (not from the engine, whose reorder window
// would hold it): the gaps file gets the record at once, flushed, and the
// live view its banner.
func (s *session) hangSink(r *hang.Report) {
	s.agg.SetHang(live.Hang{ID: r.ID, Text: r.Reason, Seconds: r.Seconds, Ongoing: r.Status == hang.Ongoing})
	if s.gaps == nil {
		return
	}
	s.hangs.mu.Lock()
	if s.hangs.written == nil {
		s.hangs.written = map[string]bool{}
	}
	first := !s.hangs.written[r.ID]
	s.hangs.written[r.ID] = true
	s.hangs.mu.Unlock()
	if !first && r.Status == hang.Ongoing {
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		s.log.Error("encode hang record", "err", err)
		return
	}
	s.gaps.record(append(b, '\n'))
}

// record writes one line to the gaps file now: what is buffered first
// (whole lines), then the line, then the flush.
func (g *gapsWriter) record(line []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.buf.Write(line)
	g.flushLocked()
}

// hangTotals is the summary file's line for hangs: their time is in no
// cause's share.
type hangTotals struct {
	Count   int     `json:"count"`
	Seconds float64 `json:"seconds"`
}

func totalHangs(hs []live.Hang) *hangTotals {
	if len(hs) == 0 {
		return nil
	}
	t := &hangTotals{Count: len(hs)}
	for _, h := range hs {
		t.Seconds += h.Seconds
	}
	return t
}
