package tracer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/wake"
)

// recordReader is the ring buffer as Run sees it; tests feed recorded
// records through a fake. Read(true) waits for a record; Read(false)
// returns errEmpty instead of waiting, so that the consumer hands on what
// it decoded before it waits. A record is valid until the next Read. Read
// returns an error wrapping os.ErrClosed once closed and, after Flush,
// every record pending at that moment followed by an error wrapping
// ringbuf.ErrFlushed.
type recordReader interface {
	Read(wait bool) ([]byte, error)
	Flush() error
	Close() error
}

// errEmpty: no record can be read without waiting.
var errEmpty = errors.New("ring buffer empty")

type ringReader struct {
	rd  *ringbuf.Reader
	rec ringbuf.Record

	// Between records Read parks in Go's network poller on a duplicate of
	// the ring's fd, not in epoll_wait: a goroutine blocked in a system
	// call for milliseconds, 200 times a second, kept the runtime's monitor
	// thread retaking its P and so polling every 20 µs, a third of the
	// sidecar's CPU time. The poller is edge-triggered: the programs' wake-up
	// (a quarter of the ring pending) ends the wait early, the deadline ends
	// it every r.every. poll is nil where the fd cannot join the poller;
	// Read then waits in the reader's own epoll_wait, as before.
	poll   *os.File
	conn   syscall.RawConn
	mu     sync.Mutex // guards closed: pending reads memory Close unmaps
	closed bool
	wake   chan struct{} // closed by Flush and Close
	once   sync.Once

	// every: how often the reader looks on its own (Config.RingPoll).
	every time.Duration

	// caughtUp is set to a time before which every record was read and
	// handed on: the ring was found empty then, and a read that waits is
	// only asked for once the consumer sent what it had read.
	caughtUp *atomic.Int64
}

func newRingReader(m *ebpf.Map, rd *ringbuf.Reader, every time.Duration, log *slog.Logger) *ringReader {
	if every <= 0 {
		every = DefaultRingPoll
	}
	r := &ringReader{rd: rd, wake: make(chan struct{}), every: every}
	fd, err := unix.FcntlInt(uintptr(m.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err == nil {
		if err = unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
		}
	}
	if err == nil {
		r.poll = os.NewFile(uintptr(fd), "ringbuf")
		if r.conn, err = r.poll.SyscallConn(); err == nil {
			err = r.poll.SetReadDeadline(time.Now())
		}
		if err != nil {
			r.poll.Close()
			r.poll, r.conn = nil, nil
		}
	}
	if err != nil {
		log.Debug("ring buffer fd not pollable by the runtime; waiting in epoll_wait", "error", err)
	}
	return r
}

// every (Config.RingPoll) bounds how long a record waits in the ring
// buffer: the programs wake the reader only when a quarter of the ring is
// pending (see wakeup_bytes in bpf/common.h), so the reader looks on its own
// this often.

func (r *ringReader) Read(wait bool) ([]byte, error) {
	for {
		asked := time.Now()
		flushed := false
		select {
		case <-r.wake:
			flushed = true
		default:
		}
		if !flushed && r.poll != nil && !r.pending() {
			if !wait {
				return nil, errEmpty
			}
			r.markCaughtUp(asked)
			r.park()
			continue
		}
		// A record is pending (or the ring is not in the poller): a
		// deadline now reads without blocking. Flushed or closed, the
		// reader returns what is left, then ErrFlushed or ErrClosed.
		deadline := time.Now()
		if wait && (flushed || r.poll == nil) {
			deadline = deadline.Add(r.every)
		}
		r.rd.SetDeadline(deadline)
		err := r.rd.ReadInto(&r.rec)
		if err == nil {
			return r.rec.RawSample, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		if !wait {
			return nil, errEmpty
		}
		r.markCaughtUp(asked)
	}
}

func (r *ringReader) markCaughtUp(at time.Time) {
	if r.caughtUp != nil {
		r.caughtUp.Store(at.UnixNano())
	}
}

// park waits until the programs wake the ring, about every passes (on the
// wake-up grid, internal/wake, when every is a grid step or more), or
// Flush or Close is called (they move the deadline to now).
func (r *ringReader) park() {
	now := time.Now()
	if err := r.poll.SetReadDeadline(now.Add(wake.Every(now, r.every))); err != nil {
		return
	}
	select {
	case <-r.wake: // Flush or Close came before the deadline was set
		return
	default:
	}
	// The callback says "done" once a record is pending; until then the
	// runtime parks this goroutine on the fd.
	_ = r.conn.Read(func(uintptr) bool { return r.pending() }) // the deadline's error ends the wait as intended
}

// pending reads the ring's positions, mapped memory that Close unmaps.
func (r *ringReader) pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.closed && r.rd.AvailableBytes() > 0
}

func (r *ringReader) stopPolling() {
	r.once.Do(func() {
		close(r.wake)
		if r.poll != nil {
			r.poll.SetReadDeadline(time.Now()) //nolint:errcheck // only ends a wait
		}
	})
}

func (r *ringReader) Flush() error {
	r.stopPolling()
	return r.rd.Flush()
}

func (r *ringReader) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.stopPolling()
	err := r.rd.Close()
	if r.poll != nil {
		err = errors.Join(err, r.poll.Close())
	}
	return err
}

// Delivered is a time (Unix ns) before which every event the tracer
// recorded has been sent to Run's (or RunBatches') out, or 0 while Run has not yet found
// the ring buffer empty. Events are submitted when they end, so a consumer
// that has taken what out holds has every event that ended before it: a
// watermark on that bound cannot pass an event still in the ring buffer
// on a host too busy to let the reader keep up.
func (t *Tracer) Delivered() int64 { return t.caughtUp.Load() }

// deliver hands v (an event or a batch) to the consumer; false when Run
// should stop: the tracer was closed, or ctx is done and the consumer took
// nothing for drainWait.
func deliver[T any](ctx context.Context, done <-chan struct{}, out chan<- T, v T) bool {
	if ctx.Err() == nil {
		select {
		case out <- v:
			return true
		case <-done: // Close while the consumer is not reading
			return false
		case <-ctx.Done():
		}
	}
	// Draining what the flush left in the ring, for as long as the
	// consumer takes it.
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
	select {
	case out <- v:
		return true
	case <-done:
		return false
	case <-timer.C:
		return false
	}
}

// drainWait bounds how long Run, once its context is done, waits for the
// consumer to take each record still in the ring: long enough for a
// pipeline that keeps reading until Run returns, short enough that a
// consumer that stopped reading does not hold Run forever.
const drainWait = time.Second

// Run reads and decodes events into out until ctx is done or the tracer is
// closed. It blocks while out is full (the consumer is expected to keep up;
// the ring buffer absorbs bursts, and what it cannot hold is counted in
// Stats.RingDrops). When ctx is done it still delivers the records already
// in the ring (the last ones are often the traced process's exit), then
// closes the reader. It returns nil on a clean shutdown.
func (t *Tracer) Run(ctx context.Context, out chan<- event.Event) error {
	return t.run(ctx, t.reader, t.sendEach(ctx, out))
}

// sendEach delivers a batch event by event, for Run.
func (t *Tracer) sendEach(ctx context.Context, out chan<- event.Event) func([]event.Event) bool {
	return func(batch []event.Event) bool {
		for _, ev := range batch {
			if !deliver(ctx, t.done, out, ev) {
				return false
			}
		}
		return true
	}
}

// RunBatches is Run handing on slices: every event decoded from the ring
// in one pass (up to maxBatch), in ring order, one channel send for all of
// them. At tens of thousands of events a second a send per event, and the
// consumer's wake-up it causes, cost more than decoding. Each slice is the
// consumer's: the tracer does not touch it again.
func (t *Tracer) RunBatches(ctx context.Context, out chan<- []event.Event) error {
	return t.run(ctx, t.reader, func(batch []event.Event) bool {
		return deliver(ctx, t.done, out, batch)
	})
}

// Recycle hands back a batch RunBatches sent, once the consumer is done
// with it (nothing may keep pointers into it): the next batches reuse it
// instead of allocating.
func (t *Tracer) Recycle(b []event.Event) {
	clear(b) // drop the strings and stacks it points to
	select {
	case t.free <- b[:0]:
	default:
	}
}

// maxBatch bounds a batch while the ring never empties: the consumer gets
// events at least every maxBatch records.
const maxBatch = 512

func (t *Tracer) run(ctx context.Context, rd recordReader, send func([]event.Event) bool) error {
	stop := context.AfterFunc(ctx, func() {
		if err := rd.Flush(); err != nil && !errors.Is(err, os.ErrClosed) {
			t.log.Debug("flush ring buffer", "error", err)
		}
	})
	defer stop()
	err := t.consume(rd, send)
	if ctx.Err() != nil {
		if cerr := rd.Close(); cerr != nil && !errors.Is(cerr, os.ErrClosed) {
			err = errors.Join(err, fmt.Errorf("close ring buffer reader: %w", cerr))
		}
	}
	return err
}

// consume decodes records and sends them in batches: a batch goes out
// when the ring has nothing more to read right now (so no event waits for
// a later one), when it reaches maxBatch, and before consume returns.
func (t *Tracer) consume(rd recordReader, send func([]event.Event) bool) error {
	var d decoded
	var batch []event.Event
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		b := batch
		batch = nil
		return send(b)
	}
	for {
		if len(batch) >= maxBatch && !flush() {
			return nil
		}
		rec, err := rd.Read(len(batch) == 0)
		if errors.Is(err, errEmpty) {
			if !flush() {
				return nil
			}
			continue
		}
		if err != nil {
			if !flush() {
				return nil
			}
			if errors.Is(err, os.ErrClosed) || errors.Is(err, ringbuf.ErrFlushed) {
				return nil
			}
			return fmt.Errorf("read ring buffer: %w", err)
		}
		t.eventsRead.Add(1)
		t.eventsByKind[recordKind(rec)].Add(1)
		if err := decodeRecord(rec, &d); err != nil {
			if t.decodeErrors.Add(1) <= 10 {
				t.log.Warn("undecodable record", "error", err)
			}
			continue
		}
		t.handle(&d)
		if !d.emit {
			continue
		}
		if batch == nil {
			select {
			case batch = <-t.free:
			default:
				batch = make([]event.Event, 0, 64)
			}
		}
		batch = append(batch, d.ev)
	}
}

// handle applies a decoded record to the tracer's own state and fills in
// what only user space knows (fd targets, thread names).
func (t *Tracer) handle(d *decoded) {
	ev := &d.ev
	if d.pyStack != nil {
		t.py.hold(d.pyStack)
		return
	}
	switch d.ctl {
	case ctlRescan:
		t.syms.mapped(ev.PID)
		t.requestRescan(ev.PID)
	case ctlNewProcess:
		if err := t.addProcess(ev.ChildPID, 0); err == nil {
			t.requestRescan(ev.ChildPID)
		}
	case ctlExec:
		// Uprobes stay: they are bound to the task and the library inode,
		// so they hold across exec for a library the new image maps again.
		// Libraries it maps for the first time are picked up by the rescan.
		t.fds.forgetProcess(ev.PID)
		t.syms.forget(ev.PID)
		t.pyForget(ev.PID)
		t.fmaps.forget(ev.PID)
		t.children.exec(ev.PID, ev.Path)
		t.comms.set(ev.TID, ev.TaskComm)
		t.requestRescan(ev.PID)
	case ctlProcessGone:
		t.fmaps.forget(ev.PID)
		t.dropProcess(ev.PID)
		t.syms.forget(ev.PID)
		t.pyForget(ev.PID)
	case ctlFDChanged:
		if ev.Kind == event.KindClose {
			if info, ok := t.fds.cached(ev.PID, ev.FD); ok {
				applyFD(ev, info)
			}
			t.fds.invalidate(ev.PID, ev.FD)
		} else if ev.Ret >= 0 {
			// Remember what was opened right away: the fd may be read and
			// closed before a lazy /proc lookup could see it.
			t.fds.opened(ev.PID, ev.FD, ev.Path)
			ev.FDKind = event.FDFile
		}
	}
	if ev.Kind == event.KindSyscall && ev.SyscallNr == unix.SYS_WAIT4 && ev.Ret > 0 && ev.Ret <= math.MaxUint32 {
		// A wait for a child that ended: which one, and what it ran.
		ev.ChildPID = uint32(ev.Ret)
		ev.Path = t.children.reaped(ev.ChildPID)
	}
	if ev.Kind == event.KindSyscall && ev.Syscall == event.SysOpen && ev.Ret >= 0 {
		// A slow open: say what was opened (its fd record came first).
		ev.FD = int32(ev.Ret)
	}
	switch {
	case ev.Kind == event.KindSyscall && ev.FD >= 0:
		if ev.Name == "connect" {
			t.fds.invalidate(ev.PID, ev.FD) // the peer changed
		}
		applyFD(ev, t.fds.resolve(ev.PID, ev.FD))
		if ev.FDKind == event.FDPipe && ev.Syscall == event.SysWrite {
			// Blocked writing into a pipe: its reader is who was slow.
			ev.Path, ev.PeerPID = t.pipes.describe(ev.PID, ev.Path)
		}
	case ev.Kind == event.KindSyscall && d.waitSocks != 0:
		t.waitedSocket(ev, d)
	}
	if ev.TaskComm == "" {
		ev.TaskComm = t.comms.get(ev.PID, ev.TID)
	}
	if ev.Kind == event.KindCPUSample {
		t.sample(ev, d)
		return
	}
	if d.faultAddr != 0 {
		// Blocked in a page fault, or a burst of faults on the CPU: on a
		// mapped file, a read of it. One the kernel saw read a regular
		// file was on a file mapping by the event's end.
		at := int64(0)
		if d.faultFile {
			at = ev.End
		}
		ev.Path = t.fmaps.file(ev.PID, d.faultAddr, at)
		if ev.Path != "" {
			ev.FDKind = event.FDFile
		}
	}
	if d.stackID >= 0 {
		ips, sum := t.stacks.ips(d.stackID)
		ev.Stack, ev.StackTruncated = t.syms.frames(ev.PID, sum, ips, d.spWords)
	}
	t.pyMerge(ev, d.ktime)
	if ev.Kind == event.KindExit {
		t.comms.forget(ev.TID)
	}
}

// waitedSocket resolves the socket a poll or select waited on. When every
// fd it waited on was listed (bpf/events.h WAIT_FDS) and each one the
// kernel does not ignore is a socket, the call waited on the network as a
// recv on that socket does (a socket with a timeout polls before it
// reads), and the event takes that socket's fd, path and peer: the one
// with a known peer first, then the first listed. One closed before it could
// be resolved is still a socket, the program saw it: FDSocket without a
// path. A wait that also named a pipe, an eventfd or a file, or fds not
// listed, is left as it came: a wait on something else.
func (t *Tracer) waitedSocket(ev *event.Event, d *decoded) {
	if int(d.waitN) > len(d.waitFDs) {
		return
	}
	var best fdInfo
	bestFD, bestRank := int32(-1), -1
	for i, fd := range d.waitFDs {
		if fd < 0 {
			continue
		}
		if d.waitSocks&(1<<i) == 0 {
			return
		}
		info := t.fds.resolve(ev.PID, fd)
		switch info.kind {
		case event.FDSocket:
		case event.FDUnknown: // closed already
			info = fdInfo{kind: event.FDSocket}
		default:
			return // the fd number was reused for something else
		}
		rank := 0
		switch {
		case info.peerPID != 0:
			rank = 3
		case info.peerAddr != "":
			rank = 2
		case info.path != "":
			rank = 1
		}
		if rank > bestRank {
			best, bestFD, bestRank = info, fd, rank
		}
	}
	if bestFD < 0 {
		return
	}
	ev.FD = bestFD
	applyFD(ev, best)
}

func applyFD(ev *event.Event, info fdInfo) {
	ev.FDKind = info.kind
	ev.Path = info.path
	ev.PeerAddr = info.peerAddr
	ev.PeerPID = info.peerPID
}
