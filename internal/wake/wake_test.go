package wake

import (
	"testing"
	"time"
)

func TestAtIsOnTheGridAndNotEarly(t *testing.T) {
	base := time.Unix(1_796_000_000, 0)
	for _, off := range []time.Duration{0, 1, Grid - 1, Grid, Grid + 1, 7*Grid + 3*time.Millisecond} {
		in := base.Add(off)
		got := At(in)
		if got.Before(in) || got.Sub(in) >= Grid || got.UnixNano()%int64(Grid) != 0 {
			t.Errorf("At(base+%v) = base+%v: want the first multiple of %v at or after it", off, got.Sub(base), Grid)
		}
	}
	if Until(base.Add(5*time.Millisecond), base) != 0 {
		t.Error("Until a due time already past: want 0")
	}
}

func TestEveryAveragesThePeriod(t *testing.T) {
	now := time.Unix(1_796_000_000, 3_000_000)
	if got := Every(now, 5*time.Millisecond); got != 5*time.Millisecond {
		t.Errorf("Every(5ms) = %v: a period under a grid step is kept", got)
	}
	for _, d := range []time.Duration{Grid, 100 * time.Millisecond} {
		var sum time.Duration
		var prev time.Time
		n := 0
		for i := 0; i < 1000; i++ {
			w := Every(now, d)
			at := now.Add(w)
			if at.UnixNano()%int64(Grid) != 0 || w < d-Grid/2 || w > d+Grid/2 {
				t.Fatalf("Every(%v) from %v waits %v: want a grid instant within half a step of %v", d, now, w, d)
			}
			if i > 0 {
				sum += at.Sub(prev) // tick to tick
				n++
			}
			prev = at
			now = at.Add(time.Duration(i%7) * 1300 * time.Microsecond) // the work after each tick, under half a step
		}
		if avg := sum / time.Duration(n); avg < d-d/20 || avg > d+d/20 {
			t.Errorf("Every(%v): ticks %v apart on average", d, avg)
		}
	}
}

func TestTickerTicksOnTheGridWithoutDrift(t *testing.T) {
	k := NewTicker(2 * Grid)
	defer k.Stop()
	start := k.start
	for i := 0; i < 4; i++ {
		got := <-k.C
		if i == 1 {
			time.Sleep(5 * Grid) // a busy receiver: the ticks it missed are skipped, not queued
		}
		k.Next()
		_ = got
	}
	due := start.Add(time.Duration(k.k) * k.d)
	if At(due).UnixNano()%int64(Grid) != 0 {
		t.Errorf("tick %d due %v is off the grid", k.k, due)
	}
	if k.k < 6 {
		t.Errorf("after a receiver late by 5 grid steps the ticker is at tick %d: missed ticks should be skipped", k.k)
	}
}
