package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// hub serves the exchange: it relays every member's records to the others
// and sends its own to all.
type hub struct {
	x   *Exchange
	ctx context.Context
	wg  sync.WaitGroup

	mu       sync.Mutex
	members  map[string]*link       // welcomed members by ID
	conns    int                    // open connections, handshakes included
	unproven map[net.Conn]time.Time // connections yet to prove the secret, by arrival
}

// link is the hub's connection to one member.
type link struct {
	id     string
	conn   net.Conn
	w      *conn
	recs   bucket         // its records' rate
	warned bool           // a rejected batch of it was logged
	out    chan line      // messages to write
	queued atomic.Int64   // bytes in out
	done   chan struct{}  // closed once the reader has stopped
	lost   *atomic.Uint64 // the Exchange's Dropped
	heard  atomic.Int64   // when its last message came (time.Now, ns)
}

// line is an encoded message and the records it carries.
type line struct {
	b []byte
	n int
}

// serve is the hub's role, on ln, until ctx ends (nil) or ln fails.
func (x *Exchange) serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &hub{x: x, ctx: ctx, members: map[string]*link{}, unproven: map[net.Conn]time.Time{}}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	x.setRole(roleHub, nil)
	defer x.setRole(roleConnecting, nil)
	x.log.Info("peer exchange: serving at "+x.cfg.Addr, "job", x.cfg.Job, "id", x.cfg.ID)

	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.pump()
	}()
	err := h.accept(ln)
	cancel()
	ln.Close()
	h.wg.Wait()
	return err
}

// accept takes connections until ln is closed.
func (h *hub) accept(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if h.ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !h.admit() {
			h.x.log.Debug("peer exchange: too many connections", "remote", c.RemoteAddr())
			c.Close()
			continue
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			defer h.release()
			h.handle(c)
		}()
	}
}

func (h *hub) admit() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns >= maxConns {
		return false
	}
	h.conns++
	return true
}

func (h *hub) release() {
	h.mu.Lock()
	h.conns--
	h.mu.Unlock()
}

// arrived counts c among the connections that have not proved the secret,
// closing the oldest of them when there are too many.
func (h *hub) arrived(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.unproven) >= maxUnproven {
		var oldest net.Conn
		var at time.Time
		for o, t := range h.unproven {
			if oldest == nil || t.Before(at) {
				oldest, at = o, t
			}
		}
		delete(h.unproven, oldest)
		oldest.Close()
	}
	h.unproven[c] = time.Now()
}

// proven takes c out of the connections yet to prove the secret.
func (h *hub) proven(c net.Conn) {
	h.mu.Lock()
	delete(h.unproven, c)
	h.mu.Unlock()
}

// handle serves one connection until it fails or the hub stops.
func (h *hub) handle(c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(h.ctx, func() { c.Close() })
	defer stop()
	h.arrived(c)
	defer h.proven(c)
	w := newConn(c)
	l, err := h.handshake(c, w)
	if err != nil {
		h.x.log.Debug("peer exchange: refused connection", "remote", c.RemoteAddr(), "err", err)
		return
	}
	h.x.log.Info("peer exchange: member joined", "id", l.id, "remote", c.RemoteAddr())
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		l.write()
	}()
	err = h.read(l)
	if h.remove(l) {
		h.x.leave(h.ctx, l.id)
	}
	close(l.done)
	c.Close()
	switch {
	case h.ctx.Err() != nil:
	case isClosed(err):
		h.x.log.Info("peer exchange: member left", "id", l.id)
	default:
		h.x.log.Warn("peer exchange: dropped member", "id", l.id, "remote", c.RemoteAddr(), "err", err)
	}
}

// isClosed reports whether err is the peer closing its connection.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// handshake proves the secret to the member and has it prove it, then
// answers the clock pings the member sends and its hello. Nothing but a
// version mismatch is answered before the member proved the secret.
func (h *hub) handshake(c net.Conn, w *conn) (*link, error) {
	x := h.x
	m, err := w.next(time.Now().Add(x.proofTimeout))
	switch {
	case err != nil:
		return nil, err
	case m.Type != typeAuth:
		return nil, fmt.Errorf("%q message before auth", m.Type)
	case m.Version != version:
		// The refusal is all it gets; a write that fails changes nothing.
		reason := fmt.Sprintf("protocol version %d, this hub speaks %d", m.Version, version)
		_ = w.send(&message{Type: typeError, Error: reason})
		return nil, errors.New(reason)
	}
	nm, err := decodeNonce(m.Nonce)
	if err != nil {
		return nil, err
	}
	nh := newNonce()
	if err := w.send(&message{Type: typeChallenge, Nonce: b64(nh), MAC: b64(hubProof(x.cfg.Secret, x.cfg.Job, nm, nh))}); err != nil {
		return nil, err
	}
	w.seal(newSealer(x.cfg.Secret, labelMembeKey, x.cfg.Job, nm, nh), newSealer(x.cfg.Secret, labelHubKey, x.cfg.Job, nm, nh))
	deadline := time.Now().Add(x.proofTimeout)
	for pings := 0; ; pings++ {
		m, err := w.next(deadline)
		if err != nil {
			return nil, err
		}
		if pings == 0 {
			// It opened: the member holds the secret.
			h.proven(c)
			deadline = time.Now().Add(x.helloTimeout)
		}
		t2 := x.now()
		switch {
		case m.Type == typeHello:
			if m.ID == "" || !checkProof(m.MAC, memberProof(x.cfg.Secret, x.cfg.Job, nm, nh, m.ID)) {
				return nil, errors.New("hello without the member's proof")
			}
			return h.welcome(c, w, m)
		case m.Type != typePing:
			return nil, fmt.Errorf("%q message before hello", m.Type)
		case pings >= maxHelloPings:
			return nil, fmt.Errorf("more than %d pings before hello", maxHelloPings)
		}
		if err := w.send(&message{Type: typePong, T1: m.T1, T2: t2}); err != nil {
			return nil, err
		}
	}
}

// welcome admits the member that sent hello, or refuses it.
func (h *hub) welcome(c net.Conn, w *conn, hello *message) (*link, error) {
	l, reason := h.register(c, w, hello)
	if reason != "" {
		// The refusal is all it gets; a write that fails changes nothing.
		_ = w.send(&message{Type: typeError, Error: reason})
		return nil, errors.New(reason)
	}
	return l, nil
}

// register makes the member that sent hello one of the hub's, queueing the
// welcome and the hub's snapshot for it and telling the others; or returns
// why not.
func (h *hub) register(c net.Conn, w *conn, hello *message) (*link, string) {
	x := h.x
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case hello.ID == x.cfg.ID:
		return nil, fmt.Sprintf("sidecar ID %q is already in job %q", hello.ID, x.cfg.Job)
	case h.members[hello.ID] == nil && len(h.members) >= maxMembers:
		return nil, fmt.Sprintf("the exchange is full (%d members)", maxMembers)
	}
	if old := h.members[hello.ID]; old != nil {
		// The same sidecar again (IDs hold the host and pid) after its old
		// connection broke on its side, which has not timed out here yet:
		// the old one has missed two pings. One that is still heard from is
		// another sidecar under the same name.
		if time.Since(time.Unix(0, old.heard.Load())) < 2*x.pingEvery {
			return nil, fmt.Sprintf("sidecar ID %q is already in job %q", hello.ID, x.cfg.Job)
		}
		delete(h.members, old.id)
		old.conn.Close()
		x.log.Info("peer exchange: member reconnected", "id", old.id)
	}
	l := &link{id: hello.ID, conn: c, w: w, out: make(chan line, linkQueueLen), done: make(chan struct{}), lost: &x.dropped}
	l.heard.Store(time.Now().UnixNano())
	others := make([]string, 0, len(h.members))
	joined := encode(&message{Type: typeJoined, ID: l.id})
	for id, o := range h.members {
		others = append(others, id)
		o.send(line{b: joined})
	}
	l.send(line{b: encode(&message{Type: typeWelcome, ID: x.cfg.ID, Peers: others})})
	for _, recs := range chunks(x.snap.records()) {
		l.send(line{b: encode(&message{Type: typeRecs, From: x.cfg.ID, Recs: recs}), n: len(recs)})
	}
	h.members[l.id] = l
	h.setPeers()
	return l, ""
}

// remove forgets member l and tells the others; false when it was
// already replaced.
func (h *hub) remove(l *link) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.members[l.id] != l {
		return false
	}
	delete(h.members, l.id)
	h.setPeers()
	left := encode(&message{Type: typeLeft, ID: l.id})
	for _, o := range h.members {
		o.send(line{b: left})
	}
	return true
}

// setPeers publishes the member count; h.mu is held.
func (h *hub) setPeers() {
	h.x.mu.Lock()
	h.x.hubPeers = len(h.members)
	h.x.mu.Unlock()
}

// read serves member l's messages until its connection fails.
func (h *hub) read(l *link) error {
	for {
		m, err := l.w.next(time.Now().Add(h.x.idleTimeout))
		if errors.Is(err, errBadRecords) {
			h.reject(l, len(m.Recs), err)
			continue
		}
		if err != nil {
			return err
		}
		now := time.Now()
		l.heard.Store(now.UnixNano())
		switch m.Type {
		case typePing:
			l.send(line{b: encode(&message{Type: typePong, T1: m.T1, T2: h.x.now()})})
		case typeRecs:
			if !l.recs.take(len(m.Recs), now) {
				h.reject(l, len(m.Recs), fmt.Errorf("over %d records a second", recRate))
				continue
			}
			h.relay(l, m.Recs)
		default:
			return fmt.Errorf("unexpected %q message", m.Type)
		}
	}
}

// reject counts a batch of member l refused as it came, and logs the
// first.
func (h *hub) reject(l *link, n int, why error) {
	h.x.rejected.Add(uint64(n))
	if !l.warned {
		l.warned = true
		h.x.log.Warn("peer exchange: rejected a batch of records from a member (more are only counted)",
			"id", l.id, "records", n, "err", why)
	}
}

// relay hands records of member from to every other member and to Recv.
func (h *hub) relay(from *link, recs []correlate.PeerRecord) {
	if len(recs) == 0 {
		return
	}
	b := line{b: encode(&message{Type: typeRecs, From: from.id, Recs: recs}), n: len(recs)}
	h.mu.Lock()
	for _, o := range h.members {
		if o != from {
			o.send(b)
		}
	}
	h.mu.Unlock()
	h.x.deliver(from.id, recs)
}

// pump sends the hub's own records to every member.
func (h *hub) pump() {
	b := newBatch()
	defer b.take()
	for {
		select {
		case <-h.ctx.Done():
			return
		case r := <-h.x.out:
			if b.add(r) {
				h.broadcast(b.take())
			}
		case <-b.due.C:
			h.broadcast(b.take())
		}
	}
}

// broadcast sends the hub's records to every member; with none they are
// not needed (a member that joins gets the snapshot).
func (h *hub) broadcast(recs []correlate.PeerRecord) {
	b := line{b: encode(&message{Type: typeRecs, From: h.x.cfg.ID, Recs: recs}), n: len(recs)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.members) == 0 {
		return
	}
	for _, o := range h.members {
		o.send(b)
	}
	h.x.sent.Add(uint64(len(recs)))
}

// send queues a message for l, dropping it when l's connection is backed
// up.
func (l *link) send(m line) {
	if l.queued.Add(int64(len(m.b))) <= linkQueueBytes {
		select {
		case l.out <- m:
			return
		default:
		}
	}
	l.queued.Add(-int64(len(m.b)))
	l.lost.Add(uint64(m.n))
}

// write writes l's queued messages until l's reader stops.
func (l *link) write() {
	for {
		select {
		case <-l.done:
			return
		case m := <-l.out:
			l.queued.Add(-int64(len(m.b)))
			if err := l.w.write(m.b); err != nil {
				l.conn.Close() // the reader fails and stops
				<-l.done
				return
			}
		}
	}
}
