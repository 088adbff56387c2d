package peers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// session is a member's connection to its hub.
type session struct {
	x      *Exchange
	conn   net.Conn
	w      *conn
	est    estimator
	warned bool          // a rejected batch was logged
	ping   atomic.Int64  // T1 of the ping awaiting its pong
	resend chan struct{} // a member joined: re-send the snapshot
}

// join is the member's role: it dials the hub and, once welcomed, sends
// and receives records until the connection fails or ctx ends. joined
// reports whether the hub welcomed it.
func (x *Exchange) join(ctx context.Context) (joined bool, err error) {
	d := net.Dialer{Timeout: x.dialTimeout}
	c, err := d.DialContext(ctx, "tcp", x.cfg.Addr)
	if err != nil {
		return false, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	s := &session{x: x, conn: c, w: newConn(c), resend: make(chan struct{}, 1)}
	w, err := s.handshake()
	if err != nil {
		return false, err
	}
	x.setRole(roleMember, w.Peers)
	s.publish()
	x.log.Info("peer exchange: joined hub at "+x.cfg.Addr, "hub", w.ID, "job", x.cfg.Job, "id", x.cfg.ID,
		"offset", time.Duration(x.offset.Load()), "rtt", time.Duration(x.rtt.Load()))
	err = s.run(ctx)
	// Without the hub nothing more comes from anyone: the hub and every
	// member it relayed are gone until they are heard from again.
	gone := append(x.knownIDs(), w.ID)
	x.setRole(roleConnecting, nil)
	for _, id := range gone {
		x.leave(ctx, id)
	}
	return true, err
}

// handshake has the hub prove the job's secret, proves it in turn,
// measures the hub's clock, then says hello; it returns the hub's welcome.
func (s *session) handshake() (*message, error) {
	x := s.x
	deadline := time.Now().Add(x.proofTimeout)
	nm := newNonce()
	if err := s.w.send(&message{Type: typeAuth, Version: version, Nonce: b64(nm)}); err != nil {
		return nil, err
	}
	m, err := s.expect(deadline, typeChallenge)
	if err != nil {
		return nil, err
	}
	nh, err := decodeNonce(m.Nonce)
	if err != nil || !checkProof(m.MAC, hubProof(x.cfg.Secret, x.cfg.Job, nm, nh)) {
		return nil, &proofError{addr: x.cfg.Addr}
	}
	s.w.seal(newSealer(x.cfg.Secret, labelHubKey, x.cfg.Job, nm, nh), newSealer(x.cfg.Secret, labelMembeKey, x.cfg.Job, nm, nh))
	deadline = time.Now().Add(x.helloTimeout)
	for range syncPings {
		t1 := x.now()
		if err := s.w.send(&message{Type: typePing, T1: t1}); err != nil {
			return nil, err
		}
		m, err := s.expect(deadline, typePong)
		if err != nil {
			return nil, err
		}
		if m.T1 != t1 {
			return nil, fmt.Errorf("pong for ping %d, sent %d", m.T1, t1)
		}
		s.est.add(t1, m.T2, x.now())
	}
	hello := &message{Type: typeHello, ID: x.cfg.ID, MAC: b64(memberProof(x.cfg.Secret, x.cfg.Job, nm, nh, x.cfg.ID))}
	if err := s.w.send(hello); err != nil {
		return nil, err
	}
	return s.expect(deadline, typeWelcome)
}

// expect reads a message of type typ; a hub's error message is a refusal.
func (s *session) expect(deadline time.Time, typ string) (*message, error) {
	m, err := s.w.next(deadline)
	switch {
	case err != nil:
		return nil, err
	case m.Type == typeError:
		return nil, &refusedError{reason: m.Error}
	case m.Type != typ:
		return nil, fmt.Errorf("%q message, want %q", m.Type, typ)
	}
	return m, nil
}

// publish makes the best clock sample the Exchange's estimate.
func (s *session) publish() {
	if off, rtt, ok := s.est.best(); ok {
		s.x.offset.Store(off)
		s.x.rtt.Store(rtt)
	}
}

// run reads the hub's messages in a goroutine of its own and writes this
// sidecar's records until either side fails.
func (s *session) run(ctx context.Context) error {
	done := make(chan struct{})
	var rerr error
	go func() {
		defer close(done)
		rerr = s.read()
	}()
	werr := s.write(ctx, done)
	s.conn.Close()
	<-done
	if werr != nil {
		return werr
	}
	return rerr
}

// read handles the hub's messages until the connection fails.
func (s *session) read() error {
	x := s.x
	for {
		m, err := s.w.next(time.Now().Add(x.idleTimeout))
		if errors.Is(err, errBadRecords) {
			s.reject(len(m.Recs), err)
			continue
		}
		if err != nil {
			return err
		}
		switch m.Type {
		case typePong:
			if t3 := x.now(); m.T1 == s.ping.Load() && s.est.add(m.T1, m.T2, t3) {
				s.publish()
			}
		case typeRecs:
			s.receive(m)
		case typeJoined:
			s.know(m.ID, true)
			select {
			case s.resend <- struct{}{}:
			default:
			}
		case typeLeft:
			s.know(m.ID, false)
			x.leave(context.Background(), m.ID)
		case typeError:
			return &refusedError{reason: m.Error}
		default:
			return fmt.Errorf("unexpected %q message", m.Type)
		}
	}
}

// know records that member id is in the exchange (in) or gone.
func (s *session) know(id string, in bool) {
	x := s.x
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.known == nil || id == x.cfg.ID {
		return
	}
	if in {
		if len(x.known) < maxMembers {
			x.known[id] = true
		}
	} else {
		delete(x.known, id)
	}
}

// receive moves records relayed by the hub from its clock to this one and
// hands them to Recv.
func (s *session) receive(m *message) {
	if m.From == "" || m.From == s.x.cfg.ID {
		return
	}
	off := s.x.offset.Load()
	for i := range m.Recs {
		m.Recs[i].Shift(-off)
		if err := m.Recs[i].Check(); err != nil {
			s.reject(len(m.Recs), err)
			return
		}
	}
	s.x.deliver(m.From, m.Recs)
}

// reject counts a batch from the hub refused as it came, and logs the
// first.
func (s *session) reject(n int, why error) {
	s.x.rejected.Add(uint64(n))
	if !s.warned {
		s.warned = true
		s.x.log.Warn("peer exchange: rejected a batch of records from the hub (more are only counted)",
			"records", n, "err", why)
	}
}

// write sends the snapshot, then this sidecar's records as they come, and
// pings the hub, until the reader stops (done) or a write fails.
func (s *session) write(ctx context.Context, done <-chan struct{}) error {
	x := s.x
	if err := s.sendSnapshot(); err != nil {
		return err
	}
	ping := time.NewTicker(x.pingEvery)
	defer ping.Stop()
	b := newBatch()
	defer func() { x.dropped.Add(uint64(len(b.take()))) }()
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			return nil
		case r := <-x.out:
			if b.add(r) {
				err = s.send(b.take())
			}
		case <-b.due.C:
			err = s.send(b.take())
		case <-ping.C:
			err = s.sendPing()
		case <-s.resend:
			if err = s.send(b.take()); err == nil {
				err = s.sendSnapshot()
			}
		}
		if err != nil {
			return err
		}
	}
}

// send moves records from this clock to the hub's and writes them.
func (s *session) send(recs []correlate.PeerRecord) error {
	if len(recs) == 0 {
		return nil
	}
	off := s.x.offset.Load()
	for i := range recs {
		recs[i].Shift(off)
	}
	err := s.w.send(&message{Type: typeRecs, From: s.x.cfg.ID, Recs: recs})
	if err != nil {
		s.x.dropped.Add(uint64(len(recs)))
		return err
	}
	s.x.sent.Add(uint64(len(recs)))
	return nil
}

// sendSnapshot re-sends every communicator of this sidecar's processes.
func (s *session) sendSnapshot() error {
	for _, recs := range chunks(s.x.snap.records()) {
		if err := s.send(recs); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) sendPing() error {
	t1 := s.x.now()
	s.ping.Store(t1)
	return s.w.send(&message{Type: typePing, T1: t1})
}
