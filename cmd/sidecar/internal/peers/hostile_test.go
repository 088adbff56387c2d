package peers

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// readAll reads what the far end sends until it closes or d passes.
func readAll(c net.Conn, d time.Duration) string {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, _ := io.ReadAll(c)
	return string(b)
}

// An outsider learns nothing: a hello of the old protocol under a wrong
// job ID (answered with the real one before) and an auth it cannot follow
// up get no job ID, no member, no record; the hub's records never reach it.
func TestOutsiderLearnsNothing(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "secretjob-42", "hub-sidecar")
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	issues(hub, 1, 10)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, `{"t":"hello","job":"wrongjob","id":"x","v":1}`+"\n")
	_, _ = io.WriteString(c, `{"t":"hello","job":"secretjob-42","id":"x","v":1}`+"\n")
	if got := readAll(c, patience); got != "" {
		t.Errorf("an old hello was answered: %q", got)
	}

	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = io.WriteString(c2, string(encode(&message{Type: typeAuth, Version: version, Nonce: b64(newNonce())}))+"\n")
	_, _ = io.WriteString(c2, `{"t":"hello","job":"secretjob-42","id":"x"}`+"\n")
	got := readAll(c2, patience)
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, `"t":"challenge"`) {
		t.Errorf("answer to an auth not followed by the proof: %q, want the challenge alone", got)
	}
	for _, secret := range []string{"secretjob-42", "hub-sidecar", `"recs"`} {
		if strings.Contains(got, secret) {
			t.Errorf("the challenge tells %s: %q", secret, got)
		}
	}
	if s := hub.Stats(); s.Peers != 0 || s.Sent != 0 {
		t.Errorf("hub after the outsiders: %+v", s)
	}
}

// A sidecar of another job sharing the secret is not joined either: the
// proofs bind the job.
func TestOtherJobSameSecretRefused(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	a := startPeer(t, addr, "job-a", "a")
	eventually(t, "a serving", func() bool { return a.Stats().Role == roleHub })
	b := startPeer(t, addr, "job-b", "b")
	eventually(t, "b says why it does not join", func() bool {
		return strings.Contains(b.logs.String(), "did not prove the peers secret")
	})
	if s := a.Stats(); s.Peers != 0 {
		t.Errorf("hub joined by another job: %+v", s)
	}
}

// A member of the job that sends records out of range (the sequence
// numbers that made every sidecar panic) has its batches rejected and
// counted; neither the hub nor the other members get them, and the
// connection goes on.
func TestHostileRecordsRejected(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub")
	// Started together, either may bind addr first: hub must hold it
	// before m tries, or m is the hub that counts the rejections.
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	m := startPeer(t, addr, "job", "m")
	settled(t, hub, m)
	r := dialRaw(t, addr)
	r.prove(t, "job", testSecret)
	if w := r.hello(t, "job", testSecret, "evil"); w.Type != typeWelcome {
		t.Fatalf("welcome: %+v", w)
	}
	comm := correlate.PeerRecord{Kind: correlate.PeerComm, PID: 7, Comm: 0xabc, Ranks: 2, Rank: 1}
	bad := []correlate.PeerRecord{
		{Kind: correlate.PeerIssue, PID: 7, Comm: 0xabc, Seq: math.MaxInt64, At: 1e18},
		{Kind: correlate.PeerIssue, PID: 7, Comm: 0xabc, Seq: math.MinInt64 + 1, At: 1e18},
	}
	for _, recs := range [][]correlate.PeerRecord{{comm}, bad[:1], bad[1:]} {
		if err := r.w.send(&message{Type: typeRecs, From: "evil", Recs: recs}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the hub rejects the two bad batches", func() bool { return hub.Stats().Rejected == 2 })
	eventually(t, "the good one is relayed", func() bool { return len(m.from("evil")) == 1 && len(hub.from("evil")) == 1 })
	for _, p := range []*peer{hub, m} {
		for _, rec := range p.from("evil") {
			if rec.Kind != correlate.PeerComm {
				t.Errorf("%s got %+v", p.id, rec)
			}
		}
	}
	if !strings.Contains(hub.logs.String(), "rejected a batch") {
		t.Error("the hub does not say it rejected a batch")
	}
}

// A member that floods records past its rate has the excess rejected and
// counted instead of relayed to every other sidecar.
func TestRecordFloodCapped(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub")
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	r := dialRaw(t, addr)
	r.prove(t, "job", testSecret)
	if w := r.hello(t, "job", testSecret, "flood"); w.Type != typeWelcome {
		t.Fatalf("welcome: %+v", w)
	}
	batch := make([]correlate.PeerRecord, maxBatch)
	for i := range batch {
		batch[i] = correlate.PeerRecord{Kind: correlate.PeerComm, PID: uint32(i), Comm: uint64(i), Ranks: 2, Rank: 1}
	}
	const batches = 2 * recBurst / maxBatch
	start := time.Now()
	for range batches {
		if err := r.w.send(&message{Type: typeRecs, Recs: batch}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the hub has read every batch", func() bool {
		s := hub.Stats()
		return s.Received+s.Rejected == batches*maxBatch
	})
	s := hub.Stats()
	t.Logf("%d records sent in %v: %d relayed, %d rejected", batches*maxBatch, time.Since(start), s.Received, s.Rejected)
	allowed := recBurst + int(time.Since(start).Seconds()*recRate) + maxBatch
	if s.Rejected == 0 || int(s.Received) > allowed {
		t.Errorf("received %d, rejected %d of %d records; want at most %d received", s.Received, s.Rejected, batches*maxBatch, allowed)
	}
}

// A program that bound the exchange's port first (any user can, above
// 1024) is not joined: it cannot prove the secret, so the sidecar sends
// it nothing but its nonce (no job ID, no records) and takes no clock
// from it.
func TestImpostorHubNotJoined(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	heard := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				l, _ := br.ReadString('\n')
				heard <- l
				// A challenge with a made-up proof, then what an old hub said.
				_, _ = io.WriteString(c, string(encode(&message{Type: typeChallenge, Nonce: b64(newNonce()), MAC: b64(newNonce())}))+"\n")
				_, _ = io.WriteString(c, `{"t":"pong","t1":1,"t2":3600000000000}`+"\n")
				rest, _ := io.ReadAll(br)
				heard <- string(rest)
			}()
		}
	}()
	p := startPeer(t, ln.Addr().String(), "secretjob-42", "rank0", func(x *Exchange) { x.refusedRetry = 50 * time.Millisecond })
	issues(p, 1, 10)
	eventually(t, "the sidecar says the server did not prove the secret", func() bool {
		return strings.Contains(p.logs.String(), "did not prove the peers secret")
	})
	p.Close()
	ln.Close()
	var all strings.Builder
	for {
		select {
		case l := <-heard:
			all.WriteString(l)
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
	got := all.String()
	for _, secret := range []string{"secretjob-42", "rank0", `"recs"`, `"hello"`} {
		if strings.Contains(got, secret) {
			t.Errorf("the impostor heard %s: %q", secret, got)
		}
	}
	if s := p.Stats(); s.OffsetNS != 0 || s.Sent != 0 {
		t.Errorf("sidecar after the impostor: %+v", s)
	}
}

// Thousands of idle connections and slow sockets, which never prove the
// secret, never keep a sidecar of the job from joining: the oldest of
// them make room (4,096 of them kept rank 1 out for good).
func TestIdleSocketsDoNotBlockJoin(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub")
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 4200 { // past any cap on connections
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	// Slow ones: a byte now and then, never a line.
	for _, c := range idle[:32] {
		go func() {
			for range 50 {
				if _, err := c.Write([]byte("{")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	start := time.Now()
	m := startPeer(t, addr, "job", "m")
	settled(t, hub, m)
	t.Logf("joined %v after %d idle connections", time.Since(start), len(idle))
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("joining took %v", d)
	}
}

// Lines of 4 MiB from hundreds of connections cost the hub a bounded
// amount of memory: a line is dropped with its connection past 1 KiB
// before the proof (49 MB → 1.66 GB before).
func TestLongLinesBounded(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	hub := startPeer(t, addr, "job", "hub")
	eventually(t, "hub serving", func() bool { return hub.Stats().Role == roleHub })
	line := bytes.Repeat([]byte("x"), 4<<20)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	done := make(chan struct{})
	const conns = 100
	for range conns {
		go func() {
			defer func() { done <- struct{}{} }()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(patience))
			_, _ = c.Write(line) // fails once the hub hangs up
		}()
	}
	for range conns {
		<-done
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("%d lines of 4 MiB: %d MiB allocated in all", conns, grew>>20)
	if grew > 64<<20 {
		t.Errorf("%d lines of 4 MiB made the process allocate %d MiB", conns, grew>>20)
	}
}

// A hub that tells of members without end (3 M joined) leaves the member
// with a bounded list: at most maxMembers others.
func TestJoinedFloodBounded(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		w := newConn(c)
		m, err := w.next(time.Now().Add(patience))
		if err != nil {
			return
		}
		nm, _ := decodeNonce(m.Nonce)
		nh := newNonce()
		_ = w.send(&message{Type: typeChallenge, Nonce: b64(nh), MAC: b64(hubProof(testSecret, "job", nm, nh))})
		w.seal(newSealer(testSecret, labelMembeKey, "job", nm, nh), newSealer(testSecret, labelHubKey, "job", nm, nh))
		for {
			m, err := w.next(time.Now().Add(patience))
			if err != nil {
				return
			}
			if m.Type == typePing {
				_ = w.send(&message{Type: typePong, T1: m.T1, T2: time.Now().UnixNano()})
				continue
			}
			break
		}
		_ = w.send(&message{Type: typeWelcome, ID: "fakehub"})
		for i := range 3 * maxMembers {
			if w.send(&message{Type: typeJoined, ID: "member-" + strconv.Itoa(i)}) != nil {
				return
			}
		}
		readAll(c, 500*time.Millisecond)
	}()
	p := startPeer(t, ln.Addr().String(), "job", "m")
	eventually(t, "the member knows the hub's members", func() bool { return p.Stats().Peers > maxMembers/2 })
	time.Sleep(300 * time.Millisecond)
	if n := p.Stats().Peers; n > maxMembers+1 {
		t.Errorf("the member holds %d peers, want at most %d", n, maxMembers+1)
	}
}

// A member holding another secret cannot join the job's hub: the
// sidecars that share the secret exchange their records meanwhile, and
// none of its records reach them, nor theirs it. (An outsider that holds
// the port first is TestImpostorHubNotJoined.)
func TestWrongSecretNeverJoins(t *testing.T) {
	noLeaks(t)
	addr := freeAddr(t)
	a := startPeer(t, addr, "job", "a")
	eventually(t, "a serves", func() bool { return a.Stats().Role == roleHub })
	x := startPeer(t, addr, "job", "x", withSecret("another secret entirely, 32+ bytes long"))
	b := startPeer(t, addr, "job", "b")
	const n = 200
	issues(a, 100, n)
	issues(x, 101, n)
	issues(b, 102, n)
	eventually(t, "a and b have each other's records", func() bool {
		return len(a.from("b")) >= n && len(b.from("a")) >= n
	})
	for _, p := range []*peer{a, b} {
		if got := p.from("x"); len(got) != 0 {
			t.Errorf("%s received %d records from the sidecar with another secret", p.id, len(got))
		}
	}
	if got := x.senders(); len(got) != 0 {
		t.Errorf("the sidecar with another secret received from %v", got)
	}
}
