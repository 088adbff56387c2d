package correlate

import "github.com/gaptrace/gaptrace/event"

// Input is everything that feeds the engine: the calls a recording holds,
// in the order they were made. *Engine implements it; Recording wraps one
// so that a caller feeds a single value whether it records or not.
type Input interface {
	Event(ev event.Event)
	Window(w event.GPUWindow)
	Advance(now int64)
	SetDevice(pid uint32, dev int)
	SetRank(pid uint32, rank, size int)
	Peer(from string, recs []PeerRecord)
	PeerLeft(from string)
	ProbesLive(full bool, at int64)
	Close(now int64) Summary
}

var _ Input = (*Engine)(nil)

// Recording returns in with every call written to rec before it is
// passed on, so that Replay of the recording makes the same calls. Its
// Close closes rec too; rec.Close, called again, returns what recording
// met.
func Recording(in Input, rec *Recorder) Input { return recording{in: in, rec: rec} }

type recording struct {
	in  Input
	rec *Recorder
}

func (r recording) Event(ev event.Event) {
	r.rec.Event(&ev)
	r.in.Event(ev)
}

func (r recording) Window(w event.GPUWindow) {
	r.rec.Window(&w)
	r.in.Window(w)
}

func (r recording) Advance(now int64) {
	r.rec.Advance(now)
	r.in.Advance(now)
}

func (r recording) SetDevice(pid uint32, dev int) {
	r.rec.SetDevice(pid, dev)
	r.in.SetDevice(pid, dev)
}

func (r recording) SetRank(pid uint32, rank, size int) {
	r.rec.SetRank(pid, rank, size)
	r.in.SetRank(pid, rank, size)
}

func (r recording) Peer(from string, recs []PeerRecord) {
	r.rec.Peer(from, recs)
	r.in.Peer(from, recs)
}

func (r recording) PeerLeft(from string) {
	r.rec.PeerLeft(from)
	r.in.PeerLeft(from)
}

func (r recording) ProbesLive(full bool, at int64) {
	r.rec.ProbesLive(full, at)
	r.in.ProbesLive(full, at)
}

func (r recording) Close(now int64) Summary {
	_ = r.rec.Close(now) // kept by rec: its owner asks again
	return r.in.Close(now)
}
