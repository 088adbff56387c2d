package peers

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

func TestStartChecksConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Addr: "10.0.0.5:29601", Job: "j", ID: "a"}, "head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"},
		{Config{Addr: "10.0.0.5:29601", Job: "j", ID: "a", Secret: []byte("short")}, "--peers-secret-file"},
		{Config{Addr: "10.0.0.5", Job: "j", ID: "a"}, `--peers "10.0.0.5"`},
		{Config{Addr: ":29601", Job: "j", ID: "a"}, `--peers ":29601": no host`},
		{Config{Addr: "10.0.0.5:http", Job: "j", ID: "a"}, `--peers "10.0.0.5:http": port`},
		{Config{Addr: "10.0.0.5:0", Job: "j", ID: "a"}, `--peers "10.0.0.5:0": port`},
		{Config{Addr: "10.0.0.5:70000", Job: "j", ID: "a"}, `--peers "10.0.0.5:70000": port`},
		{Config{Addr: "10.0.0.5:29601", ID: "a"}, "--job-id"},
		{Config{Addr: "10.0.0.5:29601", Job: "j"}, "--peers: empty sidecar ID"},
		{Config{Addr: "10.0.0.5:29601", Job: strings.Repeat("j", maxName+1), ID: "a"}, "--job-id"},
	} {
		x, err := Start(context.Background(), tc.cfg)
		if err == nil {
			x.Close()
			t.Errorf("Start(%+v): no error", tc.cfg)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%+v): %v, want %q in it", tc.cfg, err, tc.want)
		}
	}
}

// Test 1: one hub among three; every record reaches the two others, in
// order, stamped with its sender, and never comes back.
func TestThreeSidecars(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	ps := []*peer{
		startPeer(t, addr, "job", "a"),
		startPeer(t, addr, "job", "b"),
		startPeer(t, addr, "job", "c"),
	}
	hub, _ := settled(t, ps...)
	t.Logf("hub: %s", hub.id)
	const n = 2000
	for i, p := range ps {
		issues(p, uint32(100+i), n)
	}
	for i, src := range ps {
		for _, dst := range ps {
			if dst == src {
				continue
			}
			eventually(t, dst.id+" has every record of "+src.id, func() bool {
				return len(dst.from(src.id)) >= n
			})
			if recs := dst.from(src.id); !inOrder(recs, uint32(100+i), n) {
				t.Errorf("%s got %d records from %s, not its %d issues in order", dst.id, len(recs), src.id, n)
			}
		}
	}
	for _, p := range ps {
		if got := p.senders(); len(got) != 2 || got[p.id] != 0 {
			t.Errorf("%s received from %v, want the two others only", p.id, got)
		}
		s := p.Stats()
		if s.Received != 2*n || s.Dropped != 0 || s.Sent != n {
			t.Errorf("%s: %+v, want %d sent, %d received, none dropped", p.id, s, n, 2*n)
		}
	}
	if s := hub.Stats(); s.OffsetNS != 0 || s.RTTNS != 0 {
		t.Errorf("hub clock estimate: %+v", s)
	}
}

func comm(pid uint32, c uint64, ranks int32) correlate.PeerRecord {
	return correlate.PeerRecord{Kind: correlate.PeerComm, PID: pid, Comm: c, Ranks: ranks, Rank: 0}
}

// comms returns the communicators in recs by first appearance, with the
// last Ranks seen.
func comms(recs []correlate.PeerRecord) (order []commKey, ranks map[commKey]int32) {
	ranks = map[commKey]int32{}
	for _, r := range recs {
		if r.Kind != correlate.PeerComm {
			continue
		}
		k := commKey{pid: r.PID, comm: r.Comm}
		if _, ok := ranks[k]; !ok {
			order = append(order, k)
		}
		ranks[k] = r.Ranks
	}
	return order, ranks
}

// Test 2: a sidecar that joins late learns the communicators of both
// earlier ones, less those of processes gone.
func TestLateJoinerGetsSnapshots(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	a := startPeer(t, addr, "job", "a")
	b := startPeer(t, addr, "job", "b")
	settled(t, a, b)
	for _, p := range []*peer{a, b} {
		p.Send(comm(1, 10, 4))
		p.Send(comm(1, 11, 4))
		p.Send(comm(2, 20, 2))
		p.Send(comm(1, 10, 8)) // replaces the first in place
		p.Send(correlate.PeerRecord{Kind: correlate.PeerGone, PID: 2})
	}
	for _, pair := range [][2]*peer{{a, b}, {b, a}} {
		dst, src := pair[0], pair[1]
		eventually(t, dst.id+" has every record of "+src.id, func() bool { return len(dst.from(src.id)) >= 5 })
	}

	c := startPeer(t, addr, "job", "c")
	settled(t, a, b, c)
	want := []commKey{{1, 10}, {1, 11}}
	for _, src := range []*peer{a, b} {
		eventually(t, "c has the snapshot of "+src.id, func() bool {
			order, _ := comms(c.from(src.id))
			return len(order) >= 2
		})
		recs := c.from(src.id)
		order, ranks := comms(recs)
		if !slices.Equal(order, want) || ranks[commKey{1, 10}] != 8 || ranks[commKey{1, 11}] != 4 {
			t.Errorf("c's snapshot of %s: %+v", src.id, recs)
		}
		for _, r := range recs {
			if r.Kind != correlate.PeerComm {
				t.Errorf("c got %+v from %s, which was sent before it joined", r, src.id)
			}
		}
	}
}

func TestSnapshot(t *testing.T) {
	var s snapshot
	for _, r := range []correlate.PeerRecord{
		comm(1, 10, 4), comm(2, 20, 2), comm(1, 11, 4),
		{Kind: correlate.PeerIssue, PID: 1, Comm: 10, Seq: 3},
		comm(1, 10, 8),
		{Kind: correlate.PeerGone, PID: 2},
		comm(3, 30, 2),
		{Kind: correlate.PeerGone, PID: 9},
	} {
		s.note(&r)
	}
	want := []correlate.PeerRecord{comm(1, 10, 8), comm(1, 11, 4), comm(3, 30, 2)}
	if got := s.records(); !slices.Equal(got, want) {
		t.Errorf("snapshot %+v, want %+v", got, want)
	}
	r := comm(3, 30, 16)
	s.note(&r)
	if got := s.records(); got[2].Ranks != 16 {
		t.Errorf("after PeerGone, replacing by index: %+v", got)
	}
}

// Test 3: the hub exits; a sidecar on the same host takes over, the other
// joins it and both re-send their snapshots.
func TestHubTakeover(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	ps := []*peer{
		startPeer(t, addr, "job", "a"),
		startPeer(t, addr, "job", "b"),
		startPeer(t, addr, "job", "c"),
	}
	hub, rest := settled(t, ps...)
	for i, p := range rest {
		p.Send(comm(1, uint64(10+i), 2))
	}
	x, y := rest[0], rest[1]
	commsFrom := func(dst, src *peer) int {
		n := 0
		for _, r := range dst.from(src.id) {
			if r.Kind == correlate.PeerComm {
				n++
			}
		}
		return n
	}
	eventually(t, "the members have each other's communicator", func() bool {
		return commsFrom(x, y) >= 1 && commsFrom(y, x) >= 1
	})
	before := [2]int{commsFrom(x, y), commsFrom(y, x)}

	hub.Close()
	newHub, members := settled(t, x, y)
	t.Logf("hub %s exited, %s took over", hub.id, newHub.id)
	if len(members) != 1 {
		t.Fatalf("members after takeover: %d", len(members))
	}
	eventually(t, "the snapshots are re-sent after the takeover", func() bool {
		return commsFrom(x, y) > before[0] && commsFrom(y, x) > before[1]
	})
	issues(x, 5, 100)
	issues(y, 6, 100)
	eventually(t, "records flow again", func() bool {
		return len(filterIssues(y.from(x.id))) == 100 && len(filterIssues(x.from(y.id))) == 100
	})
	if !inOrder(filterIssues(y.from(x.id)), 5, 100) || !inOrder(filterIssues(x.from(y.id)), 6, 100) {
		t.Error("records after the takeover out of order")
	}
	if !strings.Contains(members[0].logs.String(), "lost hub") {
		t.Errorf("member did not log the lost hub:\n%s", members[0].logs)
	}
}

func filterIssues(recs []correlate.PeerRecord) []correlate.PeerRecord {
	return slices.DeleteFunc(recs, func(r correlate.PeerRecord) bool { return r.Kind != correlate.PeerIssue })
}

// Test 4: a sidecar of another job, or with an ID already taken, is
// refused and says why; the exchange goes on.
func TestRefused(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	a := startPeer(t, addr, "train-alpha", "a")
	b := startPeer(t, addr, "train-alpha", "b")
	settled(t, a, b)

	other := startPeer(t, addr, "train-beta", "c")
	dup := startPeer(t, addr, "train-alpha", "b")
	for _, tc := range []struct {
		p    *peer
		want []string
	}{
		{other, []string{"did not prove the peers secret"}},
		{dup, []string{`\"b\"`, "already"}},
	} {
		eventually(t, tc.p.id+" logs the refusal", func() bool {
			for _, l := range strings.Split(tc.p.logs.String(), "\n") {
				if strings.Contains(l, "level=ERROR") && containsAll(l, tc.want) {
					return true
				}
			}
			return false
		})
		if s := tc.p.Stats(); s.Role != roleConnecting || s.Peers != 0 {
			t.Errorf("refused sidecar %s: %+v", tc.p.id, s)
		}
	}
	for _, p := range []*peer{a, b} {
		if s := p.Stats(); s.Peers != 1 {
			t.Errorf("%s after the refusals: %+v", p.id, s)
		}
	}
	issues(a, 1, 10)
	issues(b, 2, 10)
	eventually(t, "a and b still exchange records", func() bool {
		return inOrder(b.from("a"), 1, 10) && inOrder(a.from("b"), 2, 10)
	})
	if got := other.senders(); len(got) != 0 {
		t.Errorf("refused sidecar received %v", got)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Test 6: a client that sends garbage, an overlong line or nothing at all,
// before or after proving the secret, is dropped; one that cannot prove it
// hears nothing but the hub's challenge; the hub keeps serving.
func TestHubDropsBadClients(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub", func(x *Exchange) { x.helloTimeout, x.proofTimeout = 300*time.Millisecond, 300*time.Millisecond })
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })

	auth := encode(&message{Type: typeAuth, Version: version, Nonce: b64(newNonce())})
	for _, tc := range []struct {
		name   string
		proved bool   // the client proves the secret first
		hello  bool   // and is welcomed
		bad    []byte // then sends this (sealed when proved)
	}{
		{name: "garbage", bad: []byte("not json at all")},
		{name: "old hello", bad: []byte(`{"t":"hello","job":"job","id":"raw","v":1}`)},
		{name: "wrong field type", bad: []byte(`{"t":"auth","v":"2"}`)},
		{name: "overlong before auth", bad: []byte(strings.Repeat("x", maxOpenLine+10))},
		{name: "unsealed after auth", bad: append(append(auth, '\n'), `{"t":"ping","t1":5}`...)},
		{name: "wrong secret after auth", bad: auth},
		{name: "silent"},
		{name: "garbage after proof", proved: true, bad: []byte("{{{")},
		{name: "recs before hello", proved: true, bad: []byte(`{"t":"recs","from":"x","recs":[{"k":4}]}`)},
		{name: "overlong after hello", proved: true, hello: true, bad: []byte(strings.Repeat("x", maxLine))},
		{name: "too many records after hello", proved: true, hello: true,
			bad: []byte(`{"t":"recs","recs":[` + strings.Repeat(`{"k":4},`, maxBatch) + `{"k":4}]}`)},
		{name: "hello again", proved: true, hello: true,
			bad: encode(&message{Type: typeHello, ID: "raw"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, addr)
			if err := r.c.SetDeadline(time.Now().Add(patience)); err != nil {
				t.Fatal(err)
			}
			if tc.proved {
				r.prove(t, "job", testSecret)
			}
			if tc.hello {
				if m := r.hello(t, "job", testSecret, "raw"); m.Type != typeWelcome {
					t.Fatalf("answer to hello: %+v", m)
				}
			}
			if tc.name == "wrong secret after auth" {
				// It gets the challenge, cannot check it, answers under
				// another secret: the hub says nothing more.
				if err := r.w.write(tc.bad); err != nil {
					t.Fatal(err)
				}
				m, err := r.w.next(time.Now().Add(patience))
				if err != nil || m.Type != typeChallenge {
					t.Fatalf("challenge: %+v %v", m, err)
				}
				nh, _ := decodeNonce(m.Nonce)
				var nm []byte
				r.w.seal(newSealer([]byte("another secret entirely, 32+ bytes"), labelHubKey, "job", nm, nh),
					newSealer([]byte("another secret entirely, 32+ bytes"), labelMembeKey, "job", nm, nh))
				tc.bad = encode(&message{Type: typePing, T1: 5})
			}
			if tc.bad != nil {
				go func() { _ = r.w.write(tc.bad) }() // fails once the hub hangs up
			}
			for {
				l, err := r.w.readLine(time.Now().Add(patience))
				if err != nil {
					if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
						t.Fatal("the hub kept the connection")
					}
					break
				}
				if s := string(l); !tc.proved && !strings.Contains(s, `"t":"challenge"`) {
					t.Errorf("hub sent %q to a client that did not prove the secret", s)
				}
			}
		})
	}
	eventually(t, "the bad clients are gone", func() bool { return hub.Stats().Peers == 0 })
	m := startPeer(t, addr, "job", "m")
	settled(t, hub, m)
	issues(m, 1, 10)
	issues(hub, 2, 10)
	eventually(t, "the hub still serves", func() bool {
		return inOrder(hub.from("m"), 1, 10) && inOrder(m.from("hub"), 2, 10)
	})
	if got := hub.senders(); len(got) != 1 {
		t.Errorf("hub delivered records from %v", got)
	}
}

// Test 7: with no hub to be reached, Send never blocks and counts what the
// queue cannot hold.
func TestSendNeverBlocks(t *testing.T) {
	noLeaks(t)
	p := startPeer(t, "192.0.2.1:1", "job", "a") // TEST-NET: not local, not served
	const n = 100_000
	start := time.Now()
	for i := range n {
		p.Send(correlate.PeerRecord{Kind: correlate.PeerIssue, PID: 1, Seq: int64(i)})
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%d Sends took %v", n, d)
	}
	s := p.Stats()
	if s.Role != roleConnecting || s.Sent != 0 || s.Dropped != n-queueLen {
		t.Errorf("%+v, want connecting, %d dropped", s, n-queueLen)
	}
	start = time.Now()
	p.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v", d)
	}
	if _, ok := <-p.Recv(); ok {
		t.Error("Recv not closed")
	}
	p.Send(correlate.PeerRecord{Kind: correlate.PeerComm}) // after Close: dropped, no panic
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// A consumer that does not keep up loses batches, counted; the network
// reader never waits for it.
func TestSlowConsumer(t *testing.T) {
	x, err := newExchange(Config{Addr: "127.0.0.1:1", Job: "job", ID: "a", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]correlate.PeerRecord, 3)
	for range recvLen + 10 {
		x.deliver("b", recs)
	}
	if s := x.Stats(); s.Received != 3*(recvLen+10) || s.Dropped != 3*10 {
		t.Errorf("%+v, want %d received, 30 dropped", s, 3*(recvLen+10))
	}
}

// A member's connection that is backed up at the hub loses messages,
// counted, rather than holding up the others.
func TestLinkBackedUp(t *testing.T) {
	var lost atomic.Uint64
	l := &link{out: make(chan line, 2), lost: &lost}
	for range 3 {
		l.send(line{b: []byte("x\n"), n: 5})
	}
	l.send(line{b: make([]byte, linkQueueBytes), n: 7})
	if len(l.out) != 2 || lost.Load() != 12 || l.queued.Load() != 4 {
		t.Errorf("queued %d (%d bytes), lost %d; want 2 (4 bytes), 12", len(l.out), l.queued.Load(), lost.Load())
	}
}

// The exchange stops with the context it was started with.
func TestContextEnds(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	x, err := Start(ctx, Config{Addr: freeAddr(t), Job: "job", ID: "a", Secret: testSecret, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "serving", func() bool { return x.Stats().Role == roleHub })
	cancel()
	select {
	case _, ok := <-x.Recv():
		if ok {
			t.Error("batch from nobody")
		}
	case <-time.After(patience):
		t.Fatal("Recv not closed after the context ended")
	}
	if err := x.Close(); err != nil {
		t.Error(err)
	}
}

// left reports whether p was told that sidecar id left.
func (p *peer) left(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.got {
		if b.Left && b.From == id {
			return true
		}
	}
	return false
}

// A sidecar that goes is reported to the others as Left, so that their
// engines stop waiting for its ranks; the members of a hub that goes are
// told the hub and every member it relayed left, until heard from again.
func TestLeftReported(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	a := startPeer(t, addr, "job", "a")
	b := startPeer(t, addr, "job", "b")
	c := startPeer(t, addr, "job", "c")
	hub, members := settled(t, a, b, c)
	gone, stay := members[0], members[1]
	gone.Close()
	eventually(t, "the hub and the other member are told "+gone.id+" left", func() bool {
		return hub.left(gone.id) && stay.left(gone.id)
	})
	if stay.left(hub.id) || hub.left(stay.id) {
		t.Errorf("sidecars still there were reported gone")
	}
	hub.Close()
	eventually(t, stay.id+" is told the hub left", func() bool { return stay.left(hub.id) })
}

// A member whose connection broke on its side comes back under its ID
// before the hub timed the old connection out: once the old one missed
// two pings, the new one replaces it; while it is still heard from, a
// second sidecar of that name is refused.
func TestReconnectReplacesSilentLink(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub", func(x *Exchange) { x.pingEvery = 100 * time.Millisecond })
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	r := dialRaw(t, addr)
	r.prove(t, "job", testSecret)
	if m := r.hello(t, "job", testSecret, "b"); m.Type != typeWelcome {
		t.Fatalf("welcome: %+v", m)
	}
	// Silent from now on, as a connection whose far end is gone.
	time.Sleep(300 * time.Millisecond)
	b := startPeer(t, addr, "job", "b")
	settled(t, hub, b)
	issues(b, 1, 10)
	eventually(t, "records from the new connection", func() bool { return inOrder(hub.from("b"), 1, 10) })
	if hub.left("b") {
		t.Errorf("a member replaced by its own reconnection was reported gone")
	}
}
