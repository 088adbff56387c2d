package tracer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gaptrace/gaptrace/event"
)

// recordReader is the ring buffer as Run sees it; tests feed recorded
// records through a fake. Read returns a record valid until the next Read,
// an error wrapping os.ErrClosed once closed and, after Flush, every record
// pending at that moment followed by an error wrapping ringbuf.ErrFlushed.
type recordReader interface {
	Read() ([]byte, error)
	Flush() error
	Close() error
}

type ringReader struct {
	rd  *ringbuf.Reader
	rec ringbuf.Record
	// caughtUp is set to a time before which every record was read: a
	// read that timed out took everything in the ring first.
	caughtUp *atomic.Int64
}

// ringPoll bounds how long a record waits in the ring buffer: the programs
// wake the reader only when a quarter of the ring is pending (see
// wakeup_bytes in bpf/common.h), so the reader looks on its own this often.
const ringPoll = 5 * time.Millisecond

func (r *ringReader) Read() ([]byte, error) {
	for {
		asked := time.Now()
		r.rd.SetDeadline(asked.Add(ringPoll))
		err := r.rd.ReadInto(&r.rec)
		if err == nil {
			return r.rec.RawSample, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		// Run delivered every record read before this call, so every
		// event submitted before it reached the consumer.
		r.caughtUp.Store(asked.UnixNano())
	}
}

func (r *ringReader) Flush() error { return r.rd.Flush() }
func (r *ringReader) Close() error { return r.rd.Close() }

// Delivered is a time (Unix ns) before which every event the tracer
// recorded has been sent to Run's out, or 0 while Run has not yet found
// the ring buffer empty. Events are submitted when they end, so a consumer
// that has taken what out holds has every event that ended before it: a
// watermark on that bound cannot pass an event still in the ring buffer
// on a host too busy to let the reader keep up.
func (t *Tracer) Delivered() int64 { return t.caughtUp.Load() }

// deliver hands ev to the consumer; false when Run should stop: the tracer
// was closed, or ctx is done and the consumer took nothing for drainWait.
func (t *Tracer) deliver(ctx context.Context, out chan<- event.Event, ev event.Event) bool {
	if ctx.Err() == nil {
		select {
		case out <- ev:
			return true
		case <-t.done: // Close while the consumer is not reading
			return false
		case <-ctx.Done():
		}
	}
	// Draining what the flush left in the ring, for as long as the
	// consumer takes it.
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
	select {
	case out <- ev:
		return true
	case <-t.done:
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
	return t.run(ctx, t.reader, out)
}

func (t *Tracer) run(ctx context.Context, rd recordReader, out chan<- event.Event) error {
	stop := context.AfterFunc(ctx, func() {
		if err := rd.Flush(); err != nil && !errors.Is(err, os.ErrClosed) {
			t.log.Debug("flush ring buffer", "error", err)
		}
	})
	defer stop()
	err := t.consume(ctx, rd, out)
	if ctx.Err() != nil {
		if cerr := rd.Close(); cerr != nil && !errors.Is(cerr, os.ErrClosed) {
			err = errors.Join(err, fmt.Errorf("close ring buffer reader: %w", cerr))
		}
	}
	return err
}

func (t *Tracer) consume(ctx context.Context, rd recordReader, out chan<- event.Event) error {
	var d decoded
	for {
		rec, err := rd.Read()
		if err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, ringbuf.ErrFlushed) {
				return nil
			}
			return fmt.Errorf("read ring buffer: %w", err)
		}
		t.eventsRead.Add(1)
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
		if !t.deliver(ctx, out, d.ev) {
			return nil
		}
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
		t.requestRescan(ev.PID)
	case ctlNewProcess:
		if err := t.addProcess(ev.ChildPID, true); err == nil {
			t.requestRescan(ev.ChildPID)
		}
	case ctlExec:
		// Uprobes stay: they are bound to the task and the library inode,
		// so they hold across exec for a library the new image maps again.
		// Libraries it maps for the first time are picked up by the rescan.
		t.fds.forgetProcess(ev.PID)
		t.syms.forget(ev.PID)
		t.pyForget(ev.PID)
		t.comms.set(ev.TID, ev.TaskComm)
		t.requestRescan(ev.PID)
	case ctlProcessGone:
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
	if ev.Kind == event.KindSyscall && ev.Syscall == event.SysOpen && ev.Ret >= 0 {
		// A slow open: say what was opened (its fd record came first).
		ev.FD = int32(ev.Ret)
	}
	if ev.Kind == event.KindSyscall && ev.FD >= 0 {
		if ev.Name == "connect" {
			t.fds.invalidate(ev.PID, ev.FD) // the peer changed
		}
		applyFD(ev, t.fds.resolve(ev.PID, ev.FD))
	}
	if ev.TaskComm == "" {
		ev.TaskComm = t.comms.get(ev.PID, ev.TID)
	}
	if d.stackID >= 0 {
		ev.Stack, ev.StackTruncated = t.syms.frames(ev.PID, d.stackID, t.stackIPs(ev.PID, d.stackID), d.spWords)
	}
	t.pyMerge(ev, d.ktime)
	if ev.Kind == event.KindExit {
		t.comms.forget(ev.TID)
	}
}

func applyFD(ev *event.Event, info fdInfo) {
	ev.FDKind = info.kind
	ev.Path = info.path
	ev.PeerAddr = info.peerAddr
	ev.PeerPID = info.peerPID
}
