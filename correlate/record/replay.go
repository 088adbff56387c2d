package record

import (
	"iter"
	"slices"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

// Replay runs calls through a fresh Engine configured by cfg and returns
// its summary; gaps and steps go to sink. Without a recorded Close the
// engine is closed one second after the last Advance, like a sidecar's
// shutdown.
func Replay(cfg correlate.Config, sink correlate.Sink, calls []Call) correlate.Summary {
	return ReplaySeq(cfg, sink, slices.Values(calls))
}

// ReplaySeq is Replay of calls as they come (Reader.Calls), in
// bounded memory.
func ReplaySeq(cfg correlate.Config, sink correlate.Sink, calls iter.Seq[Call]) correlate.Summary {
	return feed(correlate.New(cfg, sink), calls)
}

// feed makes calls on e in order and closes it, at the recorded Close or
// one second after the last Advance.
func feed(e correlate.Input, calls iter.Seq[Call]) correlate.Summary {
	var last int64
	for c := range calls {
		switch {
		case c.Ev != nil:
			e.Event(*c.Ev)
			last = max(last, c.Ev.End)
		case c.Win != nil:
			e.Window(*c.Win)
		case c.Device != nil:
			e.SetDevice(c.Device.PID, c.Device.Device)
		case c.Rank != nil:
			e.SetRank(c.Rank.PID, c.Rank.Rank, c.Rank.Size)
		case c.Probes != nil:
			e.ProbesLive(c.Probes.Full, c.Probes.At)
		case c.Peer != nil && c.Peer.Left:
			e.PeerLeft(c.Peer.From)
		case c.Peer != nil:
			e.Peer(c.Peer.From, c.Peer.Recs)
		case c.Advance != 0:
			e.Advance(c.Advance)
			last = max(last, c.Advance)
		case c.Close != 0:
			return e.Close(c.Close)
		}
	}
	return e.Close(last + int64(time.Second))
}

// Wrap returns in with every call written to w before it is passed on, so
// that Replay of the recording makes the same calls. Its Close closes w
// too; w.Close, called again, returns what recording met.
func Wrap(in correlate.Input, w *Writer) correlate.Input { return wrapped{in: in, w: w} }

type wrapped struct {
	in correlate.Input
	w  *Writer
}

func (r wrapped) Event(ev event.Event) {
	r.w.Event(&ev)
	r.in.Event(ev)
}

func (r wrapped) Window(win event.GPUWindow) {
	r.w.Window(&win)
	r.in.Window(win)
}

func (r wrapped) Advance(now int64) {
	r.w.Advance(now)
	r.in.Advance(now)
}

func (r wrapped) SetDevice(pid uint32, dev int) {
	r.w.SetDevice(pid, dev)
	r.in.SetDevice(pid, dev)
}

func (r wrapped) SetRank(pid uint32, rank, size int) {
	r.w.SetRank(pid, rank, size)
	r.in.SetRank(pid, rank, size)
}

func (r wrapped) Peer(from string, recs []correlate.PeerRecord) {
	r.w.Peer(from, recs)
	r.in.Peer(from, recs)
}

func (r wrapped) PeerLeft(from string) {
	r.w.PeerLeft(from)
	r.in.PeerLeft(from)
}

func (r wrapped) ProbesLive(full bool, at int64) {
	r.w.ProbesLive(full, at)
	r.in.ProbesLive(full, at)
}

func (r wrapped) Close(now int64) correlate.Summary {
	_ = r.w.Close(now) // kept by w: its owner asks again
	return r.in.Close(now)
}
