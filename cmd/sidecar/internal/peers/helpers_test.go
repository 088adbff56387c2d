package peers

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// patience bounds every wait for the network: generous for a loaded
// machine, never spent when things work.
const patience = 10 * time.Second

// noLeaks fails t if goroutines started during it are still running once
// its cleanups (registered after this call) are done.
func noLeaks(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines left running (had %d):\n%s", runtime.NumGoroutine(), base,
					buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// freeAddr returns a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// logBuf is a log sink safe for concurrent writes.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// peer is an Exchange under test and what it has received.
type peer struct {
	*Exchange
	id   string
	logs *logBuf

	mu  sync.Mutex
	got []Batch
}

type option func(*Exchange)

// testSecret is the secret the sidecars under test share.
var testSecret = []byte("0123456789abcdef0123456789abcdef-test")

// withSecret gives a sidecar another secret.
func withSecret(secret string) option {
	return func(x *Exchange) { x.cfg.Secret = []byte(secret) }
}

// startPeer starts an exchange of job on addr, closed when t ends.
func startPeer(t *testing.T, addr, job, id string, opts ...option) *peer {
	t.Helper()
	p := &peer{id: id, logs: new(logBuf)}
	var w io.Writer = p.logs
	if testing.Verbose() {
		w = io.MultiWriter(p.logs, testWriter{t, id})
	}
	x, err := newExchange(Config{Addr: addr, Job: job, ID: id, Secret: testSecret,
		Log: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(x)
	}
	x.start(context.Background())
	p.Exchange = x
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := range x.Recv() {
			p.mu.Lock()
			p.got = append(p.got, b)
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		p.Close()
		<-done
	})
	return p
}

type testWriter struct {
	t  *testing.T
	id string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s: %s", w.id, strings.TrimSpace(string(p)))
	return len(p), nil
}

// from returns the records received from sidecar id, in order.
func (p *peer) from(id string) []correlate.PeerRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	var recs []correlate.PeerRecord
	for _, b := range p.got {
		if b.From == id {
			recs = append(recs, b.Recs...)
		}
	}
	return recs
}

// senders returns the IDs the peer received records from.
func (p *peer) senders() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{}
	for _, b := range p.got {
		if !b.Left {
			n[b.From] += len(b.Recs)
		}
	}
	return n
}

// eventually polls cond until it holds, failing t after patience.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", patience, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settled waits until exactly one of ps is the hub and every one reaches
// all the others; it returns the hub and the members.
func settled(t *testing.T, ps ...*peer) (hub *peer, members []*peer) {
	t.Helper()
	eventually(t, "one hub and all members connected", func() bool {
		hub, members = nil, nil
		for _, p := range ps {
			s := p.Stats()
			switch {
			case s.Peers != len(ps)-1:
				return false
			case s.Role == roleHub && hub == nil:
				hub = p
			case s.Role == roleMember:
				members = append(members, p)
			default:
				return false
			}
		}
		return hub != nil
	})
	return hub, members
}

// issues sends n PeerIssue records of process pid, Seq 0 to n-1.
func issues(p *peer, pid uint32, n int) {
	for i := range n {
		p.Send(correlate.PeerRecord{Kind: correlate.PeerIssue, PID: pid, Comm: 7, Seq: int64(i), At: 1e18 + int64(i)})
	}
}

// inOrder reports whether recs are the n issues of pid, Seq 0 to n-1.
func inOrder(recs []correlate.PeerRecord, pid uint32, n int) bool {
	if len(recs) != n {
		return false
	}
	for i, r := range recs {
		if r.Kind != correlate.PeerIssue || r.PID != pid || r.Seq != int64(i) {
			return false
		}
	}
	return true
}

// rawMember is a hand-driven member: it proves secret for job at addr and,
// with id set, says hello; the hub's welcome comes back. Tests play a
// hostile or broken member with it.
type rawMember struct {
	c  net.Conn
	w  *conn
	nm []byte
	nh []byte
}

func dialRaw(t *testing.T, addr string) *rawMember {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawMember{c: c, w: newConn(c)}
}

// prove runs the handshake up to the sealed channel.
func (r *rawMember) prove(t *testing.T, job string, secret []byte) {
	t.Helper()
	r.nm = newNonce()
	if err := r.w.send(&message{Type: typeAuth, Version: version, Nonce: b64(r.nm)}); err != nil {
		t.Fatal(err)
	}
	m, err := r.w.next(time.Now().Add(patience))
	if err != nil || m.Type != typeChallenge {
		t.Fatalf("challenge: %+v %v", m, err)
	}
	if r.nh, err = decodeNonce(m.Nonce); err != nil || !checkProof(m.MAC, hubProof(secret, job, r.nm, r.nh)) {
		t.Fatalf("the hub's proof does not check: %+v %v", m, err)
	}
	r.w.seal(newSealer(secret, labelHubKey, job, r.nm, r.nh), newSealer(secret, labelMembeKey, job, r.nm, r.nh))
}

// hello says hello as id and returns the hub's answer.
func (r *rawMember) hello(t *testing.T, job string, secret []byte, id string) *message {
	t.Helper()
	if err := r.w.send(&message{Type: typeHello, ID: id, MAC: b64(memberProof(secret, job, r.nm, r.nh, id))}); err != nil {
		t.Fatal(err)
	}
	m, err := r.w.next(time.Now().Add(patience))
	if err != nil {
		t.Fatalf("answer to hello: %v", err)
	}
	return m
}
