package peers

import (
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

func TestEstimator(t *testing.T) {
	const off = int64(5 * time.Second)
	var e estimator
	if _, _, ok := e.best(); ok {
		t.Fatal("estimate from no sample")
	}
	// ping sends a ping at t1 (member clock) that takes up ns to reach the
	// hub and down ns to come back.
	t1 := int64(1e18)
	ping := func(up, down int64) {
		t.Helper()
		if !e.add(t1, t1+up+off, t1+up+down) {
			t.Fatalf("sample up %d down %d refused", up, down)
		}
		t1 += int64(time.Second)
	}
	for _, d := range [][2]int64{{900, 100}, {50, 50}, {3000, 10}, {400, 400}} {
		ping(d[0], d[1])
	}
	if o, rtt, _ := e.best(); o != off || rtt != 100 {
		t.Errorf("best of 4: offset %d rtt %d, want %d 100", o, rtt, off)
	}
	for range 5 { // the 50/50 sample is now the oldest held
		ping(500, 300)
	}
	if o, rtt, _ := e.best(); o != off || rtt != 100 {
		t.Errorf("best of 8: offset %d rtt %d", o, rtt)
	}
	ping(500, 300) // pushes it out
	if o, rtt, _ := e.best(); o != off+100 || rtt != 800 {
		t.Errorf("after the best sample left the window: offset %d rtt %d, want %d 800", o, rtt, off+100)
	}
	if e.add(t1, t1+off, t1-1) {
		t.Error("sample with a negative round trip kept")
	}
}

// Test 5: with the hub's clock 5 s ahead, every sidecar gets records in
// its own clock.
func TestClockShift(t *testing.T) {
	noLeaks(t)
	const (
		t0   = int64(1_700_000_000e9)
		skew = int64(5 * time.Second)
		at   = int64(1_700_000_100e9)
	)
	frozen := func(t int64) option {
		return func(x *Exchange) { x.now = func() int64 { return t } }
	}
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub", frozen(t0+skew))
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	m1 := startPeer(t, addr, "job", "m1", frozen(t0))
	m2 := startPeer(t, addr, "job", "m2", frozen(t0))
	settled(t, hub, m1, m2)
	for _, m := range []*peer{m1, m2} {
		if s := m.Stats(); s.OffsetNS != skew || s.RTTNS != 0 {
			t.Errorf("%s: offset %d rtt %d, want %d 0", m.id, s.OffsetNS, s.RTTNS, skew)
		}
	}

	rec := correlate.PeerRecord{Kind: correlate.PeerDone, PID: 1, Comm: 2, Seq: 3, At: at, From: at - 1000}
	m1.Send(rec)
	hub.Send(rec)
	want := func(shift int64) correlate.PeerRecord {
		r := rec
		r.Shift(shift)
		return r
	}
	for _, tc := range []struct {
		dst, src *peer
		want     correlate.PeerRecord
	}{
		{m2, m1, rec},         // member to member: same clock
		{hub, m1, want(skew)}, // member to hub: +5 s
		{m1, hub, want(-skew)},
		{m2, hub, want(-skew)},
	} {
		eventually(t, tc.dst.id+" has the record of "+tc.src.id, func() bool { return len(tc.dst.from(tc.src.id)) > 0 })
		if got := tc.dst.from(tc.src.id); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s got %+v from %s, want %+v", tc.dst.id, got, tc.src.id, tc.want)
		}
	}
}
