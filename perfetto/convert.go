package perfetto

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// Input formats Convert recognises.
const (
	FormatGaps  = "gaps"  // --gaps-out: one correlate.Gap per line
	FormatSpans = "spans" // --spans-out: one otel.FileSpan per line
)

// Bounds of a converted file: a line (a gap with its operations, a span
// with its attributes) and, as a spans file is held whole to rebuild gaps
// from their spans' children, the bytes of a spans file (rotated at
// --spans-max-size, 256 MiB by default).
const (
	MaxLine      = 1 << 20
	MaxSpansFile = 1 << 30
	maxTime      = int64(1) << 62 // Unix ns (year 2116)
	maxDevice    = 1 << 16
)

// Convert reads a saved gaps or spans file (told apart by its first line)
// and feeds what it holds to w. It returns the format found. A gaps file
// has no steps, so its trace has GPU idle and host tracks but no step or
// busy slices; a spans file has both.
func Convert(r io.Reader, w *Writer) (string, error) {
	format, _, err := ConvertCount(r, w)
	return format, err
}

// ConvertCount is Convert that also returns how many gaps or spans it left
// out: a time, a device or a count out of range. A line that is not JSON,
// or longer than MaxLine, is an error.
func ConvertCount(r io.Reader, w *Writer) (format string, skipped int, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	var spans []otel.FileSpan
	var spanBytes int
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		// Hang records share the gaps file; they are not gaps.
		if len(b) == 0 || bytes.HasPrefix(b, []byte(`{"kind":"hang"`)) {
			continue
		}
		if format == "" {
			if format, err = sniff(b, line); err != nil {
				return "", 0, err
			}
		}
		switch format {
		case FormatGaps:
			var g correlate.Gap
			if err := json.Unmarshal(b, &g); err != nil {
				return format, skipped, fmt.Errorf("line %d: bad gap: %w", line, err)
			}
			if checkGap(&g) != nil {
				skipped++
				continue
			}
			w.Gap(g)
		case FormatSpans:
			if spanBytes += len(b); spanBytes > MaxSpansFile {
				return format, skipped, fmt.Errorf("line %d: a spans file over %d MiB; convert each rotated file (--spans-max-size) on its own", line, MaxSpansFile>>20)
			}
			var s otel.FileSpan
			if err := json.Unmarshal(b, &s); err != nil {
				return format, skipped, fmt.Errorf("line %d: bad span: %w", line, err)
			}
			if checkTimes(s.StartUnixNano, s.EndUnixNano) != nil {
				skipped++
				continue
			}
			spans = append(spans, s)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("longer than %d KiB: not a line gaptrace writes", MaxLine>>10)
		}
		return format, skipped, fmt.Errorf("read line %d: %w", line+1, err)
	}
	if format == "" {
		return "", 0, errors.New("empty file: no gaps or spans in it")
	}
	if format == FormatSpans {
		skipped += fromSpans(spans, w)
	}
	return format, skipped, nil
}

// sniff tells a gaps file from a spans file by its first line.
func sniff(b []byte, line int) (string, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return "", fmt.Errorf("line %d: not a JSON object (want a gaptrace gaps or spans file): %w", line, err)
	}
	switch {
	case probe["trace_id"] != nil && probe["span_id"] != nil:
		return FormatSpans, nil
	case probe["cause"] != nil && probe["start_unix_nano"] != nil:
		return FormatGaps, nil
	}
	return "", fmt.Errorf("line %d: neither a gap (cause, start_unix_nano) nor a span (trace_id, span_id): want a file written by --gaps-out or --spans-out", line)
}

// checkTimes reports whether start..end is an interval gaptrace writes.
func checkTimes(start, end int64) error {
	if start < 0 || start >= maxTime || end < start || end >= maxTime {
		return fmt.Errorf("interval %d..%d out of range", start, end)
	}
	return nil
}

// checkGap reports whether a gap read from a file lies within what
// gaptrace writes; one that does not is left out.
func checkGap(g *correlate.Gap) error {
	if g.Device < 0 || g.Device >= maxDevice {
		return fmt.Errorf("device %d out of range", g.Device)
	}
	if g.Duration < 0 || g.Duration >= maxTime {
		return fmt.Errorf("duration %d out of range", g.Duration)
	}
	if err := checkTimes(g.Start, g.End); err != nil {
		return err
	}
	for _, op := range g.Ops {
		if op.Start != 0 || op.End != 0 {
			if err := checkTimes(op.Start, op.End); err != nil {
				return err
			}
		}
	}
	return nil
}

func num(m map[string]any, k string) (float64, bool) {
	v, ok := m[k].(float64)
	return v, ok
}

func integer(m map[string]any, k string) int64 {
	v, _ := num(m, k)
	return int64(v)
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func msToNS(ms float64) int64 { return int64(math.Round(ms * 1e6)) }

// fromSpans rebuilds gaps (with their host operations, the gpu.idle span's
// children) and steps from the spans' attributes, then writes them in time
// order. Evidence comes back as far as the span attributes carry it.
func fromSpans(spans []otel.FileSpan, w *Writer) (skipped int) {
	children := map[string][]*otel.FileSpan{}
	for i := range spans {
		if p := spans[i].ParentSpanID; p != "" {
			children[p] = append(children[p], &spans[i])
		}
	}
	type stepKey struct {
		pid    uint32
		device int
		n      int64
	}
	seenStep := map[stepKey]bool{}
	var gaps []correlate.Gap
	var steps []correlate.Step
	for i := range spans {
		s := &spans[i]
		a := s.Attributes
		if a == nil {
			continue
		}
		pid := uint32(integer(a, "process.pid"))
		if r, ok := num(a, "gaptrace.rank"); ok && pid != 0 {
			w.SetRank(pid, int32(r))
		}
		switch {
		case s.Name == otel.SpanGap:
			g := gapOf(s, pid, children[s.SpanID])
			if checkGap(&g) != nil {
				skipped++
				continue
			}
			gaps = append(gaps, g)
		case a["gpu.step.number"] != nil && a["gpu.step.duration_ms"] != nil:
			// In job mode the root train.step and the rank's span carry
			// the same step; write it once.
			st := stepOf(s, pid)
			k := stepKey{st.PID, st.Device, st.Number}
			if st.Device < 0 || st.Device >= maxDevice {
				skipped++
				continue
			}
			if seenStep[k] {
				continue
			}
			seenStep[k] = true
			steps = append(steps, st)
		}
	}
	// A live session sees a step's gaps before the step; replay in that
	// order so busy slices are computed as they would have been.
	slices.SortStableFunc(gaps, func(x, y correlate.Gap) int { return int(min(max(x.Start-y.Start, -1), 1)) })
	slices.SortStableFunc(steps, func(x, y correlate.Step) int { return int(min(max(x.End-y.End, -1), 1)) })
	gi := 0
	for _, st := range steps {
		for gi < len(gaps) && gaps[gi].Start < st.End {
			w.Gap(gaps[gi])
			gi++
		}
		// The writer cuts busy slices by time; which step carries a gap
		// does not matter to it.
		w.Step(correlate.StepResult{Step: st})
	}
	for ; gi < len(gaps); gi++ {
		w.Gap(gaps[gi])
	}
	return skipped
}

// gapOf rebuilds a gap from its gpu.idle span and the host-operation spans
// under it, as far as the attributes carry it.
func gapOf(s *otel.FileSpan, pid uint32, children []*otel.FileSpan) correlate.Gap {
	a := s.Attributes
	g := correlate.Gap{PID: pid, TID: uint32(integer(a, "thread.id")), Device: int(integer(a, "gpu.device")),
		Step: integer(a, "gpu.step.number"), Kind: correlate.GapKind(str(a, "gpu.gap.kind")),
		Start: s.StartUnixNano, End: s.EndUnixNano, Cause: correlate.Cause(str(a, "gpu.gap.cause")),
		Breakdown: map[correlate.Cause]int64{}}
	if d, ok := num(a, "gpu.gap.duration_ms"); ok {
		g.Duration = msToNS(d)
	}
	for k, v := range a {
		if c, ok := strings.CutPrefix(k, "gpu.gap.breakdown."); ok {
			if f, ok := v.(float64); ok {
				g.Breakdown[correlate.Cause(c)] = msToNS(f)
			}
		}
	}
	g.Evidence = correlate.Evidence{Source: str(a, "gpu.gap.source"), CUDACall: str(a, "gpu.cuda.call")}
	if p := str(a, "file.path"); p != "" {
		g.Evidence.Files = []correlate.FileEvidence{{Path: p, Op: str(a, "gpu.gap.file.op"), Bytes: uint64(integer(a, "gpu.gap.io.bytes"))}}
	}
	if p := str(a, "network.peer.address"); p != "" {
		g.Evidence.Peers = []correlate.PeerEvidence{{Address: p, Bytes: uint64(integer(a, "gpu.gap.net.bytes")),
			PID: uint32(integer(a, "gpu.gap.peer.process.pid")), Comm: str(a, "gpu.gap.peer.process.name")}}
	}
	if tid := integer(a, "gpu.gap.lock.holder.tid"); tid != 0 {
		g.Evidence.LockHolders = []correlate.LockHolderEvidence{{TID: uint32(tid), Comm: str(a, "gpu.gap.lock.holder.name"),
			Doing: correlate.Cause(str(a, "gpu.gap.lock.holder.doing")), File: str(a, "gpu.gap.lock.holder.file"),
			Peer: str(a, "gpu.gap.lock.holder.peer")}}
	}
	if op := str(a, "gpu.collective.op"); op != "" {
		c := &correlate.CollectiveEvidence{Op: op, Bytes: uint64(integer(a, "gpu.collective.bytes")),
			Comm: str(a, "gpu.collective.comm"), Ranks: int32(integer(a, "gpu.collective.ranks"))}
		if r, ok := num(a, "gpu.collective.rank"); ok {
			rank := int32(r)
			c.Rank = &rank
		}
		g.Evidence.Collective = c
	}
	for _, c := range children {
		op := correlate.HostOp{Name: c.Name, TID: uint32(integer(c.Attributes, "thread.id")),
			Start: c.StartUnixNano, End: c.EndUnixNano, Attrs: map[string]string{}}
		for k, v := range c.Attributes {
			if k != "thread.id" {
				op.Attrs[k] = fmt.Sprint(v)
			}
		}
		g.Ops = append(g.Ops, op)
	}
	return g
}

// stepOf rebuilds a step from its train.step span's attributes.
func stepOf(s *otel.FileSpan, pid uint32) correlate.Step {
	a := s.Attributes
	st := correlate.Step{PID: pid, Device: int(integer(a, "gpu.device")), Number: integer(a, "gpu.step.number"),
		Start: s.StartUnixNano, End: s.EndUnixNano, Window: a["gpu.step.window"] == true,
		ByCause: map[correlate.Cause]int64{}, Gaps: int(integer(a, "gpu.step.gaps")),
		Launches: uint64(integer(a, "gpu.step.launches"))}
	st.IdleRatio, _ = num(a, "gpu.step.idle_ratio")
	for key, dst := range map[string]*int64{"gpu.step.idle_ms": &st.IdleNS, "gpu.step.bounded_idle_ms": &st.BoundedIdleNS,
		"gpu.step.micro_idle_ms": &st.MicroIdleNS, "gpu.step.stall_ms": &st.StallNS} {
		if v, ok := num(a, key); ok {
			*dst = msToNS(v)
		}
	}
	for k, v := range a {
		if c, ok := strings.CutPrefix(k, "gpu.step.idle."); ok {
			if f, ok := v.(float64); ok {
				st.ByCause[correlate.Cause(c)] = msToNS(f)
			}
		}
	}
	return st
}
