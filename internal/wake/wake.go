// Package wake lines the sidecar's periodic work up on one grid of instants,
// so that timers of different loops fire in the same wake-up of the process.
//
// Each loop that runs on its own timer (the ring buffer's reader, GPM and
// utilization reads per device, the hardware poll, the engine's advance)
// costs the process an OS wake-up per tick, and each wake-up costs more
// than the work it does: the Go scheduler parks and unparks threads, and the
// runtime's monitor thread, woken by the first system call, polls every
// 20 µs for a while after. With 8 devices the sidecar woke ~270 times a
// second, 8 GPM timers a few hundred µs apart among them. A tick moved to
// the next multiple of Grid on the Unix clock (at most Grid late) fires at
// the same instant as every other tick moved there, and the runtime runs
// all of them in one wake-up.
package wake

import "time"

// Grid is the spacing of the instants periodic work is moved to, and so
// the most a tick is made late: the ring buffer reader's default period.
const Grid = 20 * time.Millisecond

// At returns the first grid instant at or after t.
func At(t time.Time) time.Time {
	ns := t.UnixNano()
	g := int64(Grid)
	up := ns + (g-ns%g)%g
	return t.Add(time.Duration(up - ns))
}

// Until returns how long to wait from now for work due at due, moved to
// the grid: never less than zero.
func Until(now, due time.Time) time.Duration {
	return max(At(due).Sub(now), 0)
}

// Every returns how long to wait from now for the next tick of a loop
// that should run about every d: the grid instant nearest to now+d, so the
// ticks average d. A period shorter than a grid step is kept as it is:
// lining it up would make it a grid step.
func Every(now time.Time, d time.Duration) time.Duration {
	if d < Grid {
		return d
	}
	return Until(now, now.Add(d-Grid/2))
}

// Ticker ticks about every d, each tick on the grid: the k-th at the
// first grid instant at or after start+k·d, so ticks never drift. Its
// timer fires once per Next: call Next after each receive from C.
type Ticker struct {
	C     <-chan time.Time
	t     *time.Timer
	start time.Time
	d     time.Duration
	k     int64
}

// NewTicker returns a ticker whose first tick is about d from now.
func NewTicker(d time.Duration) *Ticker {
	if d <= 0 {
		panic("wake.NewTicker: period must be positive")
	}
	now := time.Now()
	k := &Ticker{start: now, d: d, k: 1}
	k.t = time.NewTimer(Until(now, now.Add(d)))
	k.C = k.t.C
	return k
}

// Next arms the tick after the one just received. Ticks missed while the
// receiver was busy are skipped: the next one is the first still ahead.
func (k *Ticker) Next() {
	now := time.Now()
	k.k++
	due := k.start.Add(time.Duration(k.k) * k.d)
	if due.Before(now) {
		k.k = int64(now.Sub(k.start)/k.d) + 1
		due = k.start.Add(time.Duration(k.k) * k.d)
	}
	k.t.Reset(Until(now, due))
}

// Stop stops the ticker.
func (k *Ticker) Stop() { k.t.Stop() }
