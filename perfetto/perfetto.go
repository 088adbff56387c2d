// Package perfetto writes gaptrace's results as a Chrome trace-event JSON
// file (the {"traceEvents": [...]} form), which the Perfetto UI
// (ui.perfetto.dev) and chrome://tracing open as a timeline.
//
// Layout: each traced process (a rank) is a process of the trace, named
// "rank R · comm (pid P)" when its rank is known. Inside it:
//
//   - one track per GPU it drives ("GPU d"): a slice per gap, named by its
//     cause, with the gap's evidence in args, and "busy" slices for the rest
//     of each step;
//   - one track of steps per GPU ("steps · GPU d"): a slice per step;
//   - one track per host thread: the blocking operations the gaps' evidence
//     says the thread did (read, sendto, ncclAllReduce, cuStreamSynchronize),
//     or, for a feeder thread with no such operation, what it was doing by
//     the gap's cause.
//
// The Writer is a correlate.Sink: the session tees it next to the gaps
// file, so both hold the same gaps. Events stream to a temporary file as
// they come; the names of processes and threads (metadata events, which may
// sit anywhere in the array) are written at Close, when ranks are known,
// and only then does the file get its name: a trace that could not be
// written whole (a full disk) is never under it, as half a JSON document
// opens nowhere.
package perfetto

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

// Synthetic thread IDs of the GPU and step tracks. Linux thread IDs stay
// below 2^22 (pid_max's limit), so these never collide with a host thread.
const (
	gpuTIDBase  = 0x7fff0000
	stepTIDBase = 0x7ffe0000
)

// Event categories, so a Perfetto query or the chrome://tracing filter can
// select one kind of slice.
const (
	CatIdle  = "gpu.idle"
	CatStall = "gpu.stall"
	CatBusy  = "gpu.busy"
	CatStep  = "step"
	CatHost  = "host"
)

// Event is one trace event as written (and, in tests, read back).
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   json.Number    `json:"ts,omitempty"`  // microseconds
	Dur  json.Number    `json:"dur,omitempty"` // microseconds
	PID  uint32         `json:"pid"`
	TID  uint32         `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// File is the trace-event JSON object form.
type File struct {
	TraceEvents     []Event        `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit,omitempty"`
	OtherData       map[string]any `json:"otherData,omitempty"`
}

// Options name what the trace alone cannot.
type Options struct {
	// ProcessName returns a process's short name (its comm) when the
	// process is first seen; nil or "" leaves "pid P".
	ProcessName func(pid uint32) string
	// ThreadName likewise names host threads.
	ThreadName func(pid, tid uint32) string
	// OnError, for a Writer made by Create, hears of the first failed
	// write of the file when it happens (Close returns it too).
	OnError func(error)
}

type devKey struct {
	pid    uint32
	device int
}

type interval struct{ start, end int64 }

type procInfo struct {
	name    string
	rank    int32 // -1 unknown
	devices map[int]bool
	threads map[uint32]string
}

// Writer turns gaps and steps into trace events. Gap and Step may be called
// from one goroutine while Close is called from another.
type Writer struct {
	opts  Options
	mu    sync.Mutex
	out   *safefile.Atomic // nil when the caller owns the writer
	w     *bufio.Writer
	err   error
	first bool

	procs map[uint32]*procInfo
	// gaps of each GPU not yet covered by a step, so a step's busy slices
	// are its window minus its idle.
	open map[devKey][]interval
	// recent host slices per thread: an operation named by two gaps is
	// written once, and one that would cross another's edge is skipped
	// (trace-event slices on one thread must nest).
	recent map[devKey][]interval
	gaps   int64
	steps  int64
}

// Create writes a trace to path, never through a link: to a new
// temporary file that Close renames over path once the trace is whole
// (safefile.Atomic).
func Create(path string, opts Options) (*Writer, error) {
	f, err := safefile.CreateAtomic(path)
	if err != nil {
		return nil, fmt.Errorf("create perfetto trace: %w", err)
	}
	f.OnError = opts.OnError
	x := New(f, opts)
	x.out = f
	return x, nil
}

// Abort drops a trace made by Create: nothing is written under its name.
func (x *Writer) Abort() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.out != nil {
		x.out.Abort()
		x.out = nil
	}
}

// New writes a trace to w; Close finishes the JSON but does not close w.
func New(w io.Writer, opts Options) *Writer {
	x := &Writer{opts: opts, w: bufio.NewWriterSize(w, 64<<10), first: true,
		procs: map[uint32]*procInfo{}, open: map[devKey][]interval{}, recent: map[devKey][]interval{}}
	_, x.err = x.w.WriteString(`{"displayTimeUnit":"ms","traceEvents":[` + "\n")
	return x
}

// us renders nanoseconds since the epoch as exact decimal microseconds: a
// float64 would lose the last digits of a 2020s timestamp.
func us(ns int64) json.Number {
	mag := uint64(ns)
	if ns < 0 {
		mag = -mag // two's complement: exact for math.MinInt64 too
	}
	s := strconv.FormatUint(mag/1000, 10)
	if r := mag % 1000; r != 0 {
		s += fmt.Sprintf(".%03d", r)
	}
	if ns < 0 {
		s = "-" + s
	}
	return json.Number(s)
}

func (x *Writer) emit(e Event) {
	if x.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		x.err = fmt.Errorf("encode trace event: %w", err)
		return
	}
	if !x.first {
		x.w.WriteString(",\n") //nolint:errcheck // bufio keeps the error for Flush
	}
	x.first = false
	_, x.err = x.w.Write(b)
}

func (x *Writer) proc(pid uint32) *procInfo {
	p := x.procs[pid]
	if p == nil {
		p = &procInfo{rank: -1, devices: map[int]bool{}, threads: map[uint32]string{}}
		if x.opts.ProcessName != nil {
			p.name = x.opts.ProcessName(pid)
		}
		x.procs[pid] = p
	}
	return p
}

func (x *Writer) thread(pid, tid uint32) {
	p := x.proc(pid)
	if _, ok := p.threads[tid]; ok {
		return
	}
	name := ""
	if x.opts.ThreadName != nil {
		name = x.opts.ThreadName(pid, tid)
	}
	p.threads[tid] = name
}

// SetRank names pid's rank; gaps with collective evidence set it too.
func (x *Writer) SetRank(pid uint32, rank int32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.proc(pid).rank = rank
}

func gapArgs(g *correlate.Gap) map[string]any {
	a := map[string]any{
		"cause":       string(g.Cause),
		"kind":        string(cmp.Or(g.Kind, correlate.GapIdle)),
		"duration_ns": g.Duration,
		"step":        g.Step,
		"device":      g.Device,
		"tid":         g.TID,
		"source":      g.Evidence.Source,
	}
	if len(g.Breakdown) > 0 {
		b := map[string]int64{}
		for c, ns := range g.Breakdown {
			b[string(c)] = ns
		}
		a["breakdown_ns"] = b
	}
	ev := g.Evidence
	if len(ev.Files) > 0 {
		a["files"] = ev.Files
	}
	if len(ev.Peers) > 0 {
		a["peers"] = ev.Peers
	}
	if len(ev.Workers) > 0 {
		a["workers"] = ev.Workers
	}
	if ev.Collective != nil {
		a["collective"] = ev.Collective
	}
	if len(ev.LockHolders) > 0 {
		a["lock_holders"] = ev.LockHolders
	}
	if ev.CUDACall != "" {
		a["cuda_call"] = ev.CUDACall
	}
	if len(ev.Syscalls) > 0 {
		a["syscalls"] = ev.Syscalls
	}
	if len(ev.Threads) > 0 {
		a["threads"] = ev.Threads
	}
	if ev.SMActivity != nil {
		a["sm_activity"] = *ev.SMActivity
	}
	if ev.BaselineNS > 0 {
		a["baseline_ns"] = ev.BaselineNS
	}
	return a
}

// Gap implements correlate.Sink.
func (x *Writer) Gap(g correlate.Gap) {
	x.mu.Lock()
	defer x.mu.Unlock()
	p := x.proc(g.PID)
	p.devices[g.Device] = true
	if c := g.Evidence.Collective; c != nil && c.Rank != nil {
		p.rank = *c.Rank
	}
	if g.Duration == 0 {
		g.Duration = g.End - g.Start
	}
	cat := CatIdle
	if g.Kind == correlate.GapStall {
		cat = CatStall
	}
	x.gaps++
	x.emit(Event{Name: string(g.Cause), Cat: cat, Ph: "X", TS: us(g.Start), Dur: us(g.End - g.Start),
		PID: g.PID, TID: gpuTIDBase + uint32(g.Device), Args: gapArgs(&g)})
	k := devKey{g.PID, g.Device}
	x.open[k] = append(x.open[k], interval{g.Start, g.End})

	feederDid := false
	for _, op := range g.Ops {
		tid := op.TID
		if tid == 0 {
			tid = g.TID
		}
		if tid == g.TID {
			feederDid = true
		}
		args := map[string]any{"gap.cause": string(g.Cause), "step": g.Step}
		for k, v := range op.Attrs {
			args[k] = v
		}
		name := op.Name
		if name == "" {
			name = "host.op"
		}
		x.hostSlice(g.PID, tid, name, op.Start, op.End, args)
	}
	if !feederDid && g.TID != 0 {
		// No operation of the feeder thread explains the gap: the
		// cause is what it did (on CPU, asleep, preempted, in a CUDA
		// call).
		name := string(g.Cause)
		if g.Evidence.CUDACall != "" {
			name = g.Evidence.CUDACall
		}
		x.hostSlice(g.PID, g.TID, name, g.Start, g.End,
			map[string]any{"gap.cause": string(g.Cause), "step": g.Step, "from": "gap evidence"})
	}
}

func (x *Writer) hostSlice(pid, tid uint32, name string, start, end int64, args map[string]any) {
	if end < start {
		return
	}
	k := devKey{pid, int(tid)}
	for _, r := range x.recent[k] {
		if r.start == start && r.end == end {
			return // the same operation, named by another gap
		}
		contains := r.start <= start && end <= r.end
		inside := start <= r.start && r.end <= end
		disjoint := end <= r.start || r.end <= start
		if !contains && !inside && !disjoint {
			return
		}
	}
	x.recent[k] = append(x.recent[k], interval{start, end})
	if rs := x.recent[k]; len(rs) > 64 {
		x.recent[k] = rs[len(rs)-64:]
	}
	x.thread(pid, tid)
	x.emit(Event{Name: name, Cat: CatHost, Ph: "X", TS: us(start), Dur: us(end - start), PID: pid, TID: tid, Args: args})
}

// Step implements correlate.Sink. The step's gaps are on the track
// already (Gap): a step's busy slices are cut by time, around every gap of
// its GPU, whichever step carries it.
func (x *Writer) Step(r correlate.StepResult) {
	s := r.Step
	x.mu.Lock()
	defer x.mu.Unlock()
	p := x.proc(s.PID)
	p.devices[s.Device] = true
	x.steps++
	byCause := map[string]int64{}
	for c, ns := range s.ByCause {
		if ns > 0 {
			byCause[string(c)] = ns
		}
	}
	name := "step " + strconv.FormatInt(s.Number, 10)
	if s.Window {
		name = "window " + strconv.FormatInt(s.Number, 10)
	}
	x.emit(Event{Name: name, Cat: CatStep, Ph: "X", TS: us(s.Start), Dur: us(s.End - s.Start),
		PID: s.PID, TID: stepTIDBase + uint32(s.Device), Args: map[string]any{
			"step": s.Number, "duration_ns": s.End - s.Start, "idle_ns": s.IdleNS, "micro_idle_ns": s.MicroIdleNS,
			"stall_ns": s.StallNS, "idle_ratio": s.IdleRatio, "gaps": s.Gaps, "launches": s.Launches,
			"idle_by_cause_ns": byCause, "device": s.Device,
		}})

	// Busy is the step's window minus every gap of this GPU that overlaps
	// it, whatever step the gap was counted in, so that idle and busy
	// slices never overlap on the track.
	k := devKey{s.PID, s.Device}
	gaps := x.open[k]
	slices.SortFunc(gaps, func(a, b interval) int { return cmp.Compare(a.start, b.start) })
	cur := s.Start
	for _, g := range gaps {
		if g.end <= cur || g.start >= s.End {
			continue
		}
		if g.start > cur {
			x.busy(s, cur, g.start)
		}
		cur = max(cur, g.end)
	}
	if cur < s.End {
		x.busy(s, cur, s.End)
	}
	kept := gaps[:0]
	for _, g := range gaps {
		if g.end > s.End {
			kept = append(kept, g)
		}
	}
	x.open[k] = kept
}

func (x *Writer) busy(s correlate.Step, start, end int64) {
	x.emit(Event{Name: "busy", Cat: CatBusy, Ph: "X", TS: us(start), Dur: us(end - start),
		PID: s.PID, TID: gpuTIDBase + uint32(s.Device), Args: map[string]any{"step": s.Number}})
}

// Counts are the gaps and steps written so far.
func (x *Writer) Counts() (gaps, steps int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.gaps, x.steps
}

func (p *procInfo) label(pid uint32) string {
	s := "pid " + strconv.FormatUint(uint64(pid), 10)
	if p.name != "" {
		s = p.name + " (" + s + ")"
	}
	if p.rank >= 0 {
		s = "rank " + strconv.Itoa(int(p.rank)) + " · " + s
	}
	return s
}

func meta(name string, pid, tid uint32, args map[string]any) Event {
	return Event{Name: name, Ph: "M", PID: pid, TID: tid, Args: args}
}

// Close writes the names of processes and tracks and finishes the JSON.
// The file is valid JSON only after Close.
func (x *Writer) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	pids := make([]uint32, 0, len(x.procs))
	for pid := range x.procs {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	for i, pid := range pids {
		p := x.procs[pid]
		sort := i
		if p.rank >= 0 {
			sort = int(p.rank)
		}
		x.emit(meta("process_name", pid, 0, map[string]any{"name": p.label(pid)}))
		x.emit(meta("process_sort_index", pid, 0, map[string]any{"sort_index": sort}))
		devs := make([]int, 0, len(p.devices))
		for d := range p.devices {
			devs = append(devs, d)
		}
		slices.Sort(devs)
		for j, d := range devs {
			x.emit(meta("thread_name", pid, gpuTIDBase+uint32(d), map[string]any{"name": "GPU " + strconv.Itoa(d)}))
			x.emit(meta("thread_sort_index", pid, gpuTIDBase+uint32(d), map[string]any{"sort_index": -1000 + 2*j}))
			x.emit(meta("thread_name", pid, stepTIDBase+uint32(d), map[string]any{"name": "steps · GPU " + strconv.Itoa(d)}))
			x.emit(meta("thread_sort_index", pid, stepTIDBase+uint32(d), map[string]any{"sort_index": -999 + 2*j}))
		}
		for tid, name := range p.threads {
			label := "thread " + strconv.FormatUint(uint64(tid), 10)
			if name != "" {
				label = name + " (" + strconv.FormatUint(uint64(tid), 10) + ")"
			}
			x.emit(meta("thread_name", pid, tid, map[string]any{"name": label}))
		}
	}
	if x.err == nil {
		_, x.err = fmt.Fprintf(x.w, "\n],\"otherData\":{\"producer\":\"gaptrace\",\"gaps\":%d,\"steps\":%d}}\n", x.gaps, x.steps)
	}
	err := errors.Join(x.err, x.w.Flush())
	if x.out != nil {
		switch ferr := x.out.Err(); {
		case ferr != nil:
			err = ferr // the file's own error, which x.err repeats
		case err != nil:
			err = &safefile.WriteError{Path: x.out.Name(), Err: err, NotWritten: true}
		}
		if err != nil {
			x.out.Abort()
		} else {
			err = x.out.Close()
		}
		x.out = nil
	}
	if err != nil {
		return fmt.Errorf("write perfetto trace: %w", err)
	}
	return nil
}
