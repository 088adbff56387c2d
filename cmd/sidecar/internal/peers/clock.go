package peers

import "time"

const (
	// syncPings is how many pings a member sends on connecting, and how
	// many of the latest samples the offset is chosen from.
	syncPings = 8
	// pingEvery is how often a member pings its hub once connected, to
	// refresh the offset and keep the connection alive.
	pingEvery = 5 * time.Second
)

// sample is one ping: sent at t1 (member clock), seen at t2 (hub clock),
// answered at t3 (member clock).
type sample struct {
	offset, rtt int64
}

// estimator keeps the last syncPings samples of the hub's clock; the one
// with the shortest round trip is the estimate (its error is at most half
// its round trip).
type estimator struct {
	ring [syncPings]sample
	n    int // samples held
	next int // slot of the next sample
}

// add records a ping; it reports false for a sample that cannot be right
// (the member's clock went backwards).
func (e *estimator) add(t1, t2, t3 int64) bool {
	rtt := t3 - t1
	if rtt < 0 {
		return false
	}
	e.ring[e.next] = sample{offset: t2 - (t1 + rtt/2), rtt: rtt}
	e.next = (e.next + 1) % len(e.ring)
	e.n = min(e.n+1, len(e.ring))
	return true
}

// best returns the offset (hub clock − member clock) and round trip of the
// held sample with the shortest round trip.
func (e *estimator) best() (offset, rtt int64, ok bool) {
	if e.n == 0 {
		return 0, 0, false
	}
	b := e.ring[0]
	for _, s := range e.ring[1:e.n] {
		if s.rtt < b.rtt {
			b = s
		}
	}
	return b.offset, b.rtt, true
}
