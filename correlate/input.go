package correlate

import "github.com/gaptrace/gaptrace/event"

// Input is everything that feeds the engine: the calls a recording holds,
// in the order they were made. *Engine implements it; record.Wrap wraps one
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
