package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

// Config says which exchange to take part in.
type Config struct {
	Addr string       // host:port of the job's exchange, e.g. "10.0.0.5:29601" (--peers)
	Job  string       // job ID (--job-id); sidecars of another job are refused
	ID   string       // this sidecar's name, unique in the job (e.g. hostname/pid)
	Log  *slog.Logger // nil: slog.Default()
	// Secret is the job's shared secret (LoadSecret): a sidecar proves it
	// holds it before it is heard, and a hub before it is joined.
	Secret []byte
}

// Batch is records from one other sidecar, times already in this host's
// clock.
type Batch struct {
	From string // the sending sidecar's ID
	Recs []correlate.PeerRecord
	// Left: sidecar From is gone (it closed its connection, or the hub
	// that relayed it was lost); Recs is empty. A sidecar that comes back
	// sends its communicators again.
	Left bool
}

// Stats describes an Exchange at one moment.
type Stats struct {
	Role string // "hub", "member" or "connecting"
	// Peers is the other sidecars reachable: for the hub its connected
	// members; for a member the other members the hub told of, plus the
	// hub itself; 0 while connecting.
	Peers int
	// Sent counts this sidecar's own records written to the network (for
	// the hub: handed to its members' connections, once per record), the
	// snapshots re-sent included; Received the records that came from
	// other sidecars; Dropped the records lost on the way: the outgoing
	// queue full, a slow Recv consumer, a member's connection backed up
	// (hub), a batch pending when a connection broke. Rejected counts
	// the records of batches refused as they came: a record out of range,
	// a sidecar over its rate.
	Sent, Received, Dropped, Rejected uint64
	OffsetNS                          int64 // member: estimated hub clock − this clock; hub: 0
	RTTNS                             int64 // best round trip of the offset estimate (0 for the hub)
}

// Roles, as Stats reports them.
const (
	roleHub        = "hub"
	roleMember     = "member"
	roleConnecting = "connecting"
)

const (
	queueLen       = 8192     // records waiting to be sent
	recvLen        = 256      // batches waiting in Recv
	linkQueueLen   = 1024     // messages waiting for one member's connection (hub)
	linkQueueBytes = 16 << 20 // and their size at most
	maxBatch       = 512      // records per message
	flushEvery     = 20 * time.Millisecond
	backoffMin     = 100 * time.Millisecond
	backoffMax     = 2 * time.Second
	refusedRetry   = 5 * time.Second
	dialTimeout    = time.Second
	proofTimeout   = 3 * time.Second // from connecting to proving the secret
	helloTimeout   = 10 * time.Second
	idleTimeout    = 30 * time.Second
	writeTimeout   = 10 * time.Second
	maxMembers     = 1024 // members of one hub
	// maxUnproven bounds the connections that have not proved the secret
	// yet; a new one past it closes the oldest, so that idle or slow
	// sockets never keep a sidecar of the job from joining.
	maxUnproven   = 64
	maxConns      = maxMembers + maxUnproven + 64 // connections a hub holds, handshakes included
	maxHelloPings = 4 * syncPings                 // pings a hub answers before hello
	// A member's records: at most recRate a second on average, bursts of
	// recBurst (a snapshot of every communicator); beyond, its batches
	// are rejected.
	recRate  = 20_000
	recBurst = maxSnapshot + 4*maxBatch
)

// Exchange is this sidecar's part in its job's peer exchange.
type Exchange struct {
	cfg  Config
	log  *slog.Logger
	out  chan correlate.PeerRecord
	recv chan Batch
	snap snapshot

	// Tunables, set before start; tests change them.
	now          func() int64 // this host's clock, Unix ns
	dialTimeout  time.Duration
	proofTimeout time.Duration
	helloTimeout time.Duration
	idleTimeout  time.Duration
	pingEvery    time.Duration
	refusedRetry time.Duration

	cancel context.CancelFunc
	done   chan struct{} // closed when every goroutine has stopped

	sent, received, dropped, rejected atomic.Uint64
	offset, rtt                       atomic.Int64 // member's clock estimate

	mu       sync.Mutex
	role     string
	hubPeers int             // hub: connected members
	known    map[string]bool // member: the other members
}

// Start validates cfg and starts taking part in the exchange at cfg.Addr:
// as its hub when the address can be bound here, else as a member. It
// returns at once; peers are found in the background until ctx ends or
// Close is called.
func Start(ctx context.Context, cfg Config) (*Exchange, error) {
	x, err := newExchange(cfg)
	if err != nil {
		return nil, err
	}
	x.start(ctx)
	return x, nil
}

func newExchange(cfg Config) (*Exchange, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Exchange{
		cfg:          cfg,
		log:          cfg.Log,
		out:          make(chan correlate.PeerRecord, queueLen),
		recv:         make(chan Batch, recvLen),
		now:          func() int64 { return time.Now().UnixNano() },
		dialTimeout:  dialTimeout,
		proofTimeout: proofTimeout,
		helloTimeout: helloTimeout,
		idleTimeout:  idleTimeout,
		pingEvery:    pingEvery,
		refusedRetry: refusedRetry,
		done:         make(chan struct{}),
		role:         roleConnecting,
	}, nil
}

func checkConfig(cfg *Config) error {
	if err := checkAddr(cfg.Addr); err != nil {
		return err
	}
	switch {
	case cfg.Job == "":
		return errors.New("--job-id: required with --peers")
	case len(cfg.Job) > maxName:
		return fmt.Errorf("--job-id: longer than %d bytes", maxName)
	case cfg.ID == "":
		return errors.New("--peers: empty sidecar ID")
	case len(cfg.ID) > maxName:
		return fmt.Errorf("--peers: sidecar ID %q longer than %d bytes", cfg.ID, maxName)
	case len(cfg.Secret) < minSecret:
		return fmt.Errorf("--peers: a shared secret of at least %d bytes is required (--peers-secret-file); %s", minSecret, SecretHint)
	}
	return nil
}

func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--peers %q: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("--peers %q: no host (want host:port, e.g. 10.0.0.5:29601)", addr)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("--peers %q: port %q is not a number from 1 to 65535", addr, port)
	}
	return nil
}

func (x *Exchange) start(ctx context.Context) {
	ctx, x.cancel = context.WithCancel(ctx)
	go x.run(ctx)
}

// Send queues r for the other sidecars. It never blocks: when the queue is
// full r is dropped and counted in Stats.Dropped. PeerComm and PeerGone
// records also update the snapshot re-sent to sidecars that join later.
func (x *Exchange) Send(r correlate.PeerRecord) {
	x.snap.note(&r)
	select {
	case x.out <- r:
	default:
		x.dropped.Add(1)
	}
}

// Recv returns the batches received from the other sidecars. It is closed
// once the Exchange has stopped.
func (x *Exchange) Recv() <-chan Batch { return x.recv }

// Stats returns the exchange's state and counters; it is safe to call from
// any goroutine.
func (x *Exchange) Stats() Stats {
	x.mu.Lock()
	s := Stats{Role: x.role}
	switch x.role {
	case roleHub:
		s.Peers = x.hubPeers
	case roleMember:
		s.Peers = len(x.known) + 1
	}
	x.mu.Unlock()
	s.Sent, s.Received, s.Dropped, s.Rejected = x.sent.Load(), x.received.Load(), x.dropped.Load(), x.rejected.Load()
	if s.Role == roleMember {
		s.OffsetNS, s.RTTNS = x.offset.Load(), x.rtt.Load()
	}
	return s
}

// Close stops the exchange: it closes the listener and every connection
// and returns once all its goroutines have stopped, Recv closed.
func (x *Exchange) Close() error {
	x.cancel()
	<-x.done
	return nil
}

// run takes a role, again each time the one held is lost, until ctx ends.
func (x *Exchange) run(ctx context.Context) {
	defer close(x.done)
	defer close(x.recv)
	var back backoff
	var refusal string // the last refusal logged
	for ctx.Err() == nil {
		ln, err := new(net.ListenConfig).Listen(ctx, "tcp", x.cfg.Addr)
		if err == nil {
			if err := x.serve(ctx, ln); err != nil {
				x.log.Warn("peer exchange: stopped serving at "+x.cfg.Addr, "err", err)
				sleep(ctx, back.next())
			} else {
				back.reset()
			}
			continue
		}
		x.log.Debug("peer exchange: cannot serve here", "addr", x.cfg.Addr, "err", err)
		joined, err := x.join(ctx)
		var ref *refusedError
		var pe *proofError
		switch {
		case ctx.Err() != nil:
		case joined:
			x.log.Warn("peer exchange: lost hub at "+x.cfg.Addr, "err", err)
			back.reset()
			refusal = ""
		case errors.As(err, &pe):
			if refusal != pe.Error() {
				x.log.Error("peer exchange: "+pe.Error(), "job", x.cfg.Job)
				refusal = pe.Error()
			}
			sleep(ctx, x.refusedRetry)
		case errors.As(err, &ref):
			if ref.reason != refusal {
				x.log.Error("peer exchange: refused by hub at "+x.cfg.Addr, "job", x.cfg.Job, "id", x.cfg.ID,
					"reason", ref.reason)
				refusal = ref.reason
			} else {
				x.log.Debug("peer exchange: refused by hub again", "addr", x.cfg.Addr, "reason", ref.reason)
			}
			sleep(ctx, x.refusedRetry)
		default:
			d := back.next()
			x.log.Debug("peer exchange: cannot join hub", "addr", x.cfg.Addr, "err", err, "retry", d)
			sleep(ctx, d)
		}
	}
}

// knownIDs is the other members a member knows of, sorted.
func (x *Exchange) knownIDs() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Sorted(maps.Keys(x.known))
}

// setRole records the role taken; peers and clock estimate start afresh.
func (x *Exchange) setRole(role string, known []string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.role, x.hubPeers, x.known = role, 0, nil
	if role == roleMember {
		x.known = make(map[string]bool, len(known))
		for _, id := range known {
			x.known[id] = true
		}
	} else {
		x.offset.Store(0)
		x.rtt.Store(0)
	}
}

// leave tells Recv that sidecar id is gone. Rare and not to be lost, it
// waits a while for a slow consumer.
func (x *Exchange) leave(ctx context.Context, id string) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case x.recv <- Batch{From: id, Left: true}:
	case <-t.C:
		x.log.Debug("peer exchange: the engine did not take a sidecar's leaving", "id", id)
	case <-ctx.Done():
	}
}

// deliver hands records of sidecar from to Recv, dropping them when the
// consumer is behind.
func (x *Exchange) deliver(from string, recs []correlate.PeerRecord) {
	if len(recs) == 0 {
		return
	}
	x.received.Add(uint64(len(recs)))
	select {
	case x.recv <- Batch{From: from, Recs: recs}:
	default:
		x.dropped.Add(uint64(len(recs)))
	}
}

// refusedError is a hub's refusal of this sidecar.
type refusedError struct{ reason string }

func (e *refusedError) Error() string { return "refused by hub: " + e.reason }

// proofError: what listens at the exchange's address did not prove the
// job's secret.
type proofError struct{ addr string }

func (e *proofError) Error() string {
	return "the server at " + e.addr + " did not prove the peers secret of this job: not joining it " +
		"(another job's exchange, another secret, or another program on the port: use a port below 1024, which only root can bind)"
}

// bucket is a token bucket: rate tokens a second, at most burst held.
type bucket struct {
	tokens float64
	last   time.Time
}

// take spends n tokens if there are that many.
func (b *bucket) take(n int, now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = recBurst
	} else {
		b.tokens = min(recBurst, b.tokens+now.Sub(b.last).Seconds()*recRate)
	}
	b.last = now
	if b.tokens < float64(n) {
		return false
	}
	b.tokens -= float64(n)
	return true
}

// backoff spaces out attempts to join a hub: from backoffMin, doubling up to
// backoffMax, with some jitter so that sidecars do not retry in step.
type backoff struct{ d time.Duration }

func (b *backoff) next() time.Duration {
	b.d = min(max(2*b.d, backoffMin), backoffMax)
	return b.d - rand.N(b.d/5)
}

func (b *backoff) reset() { b.d = 0 }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// batch gathers outgoing records into messages: full at maxBatch records,
// due flushEvery after its first record.
type batch struct {
	recs []correlate.PeerRecord
	due  *time.Timer
}

func newBatch() *batch {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &batch{due: t}
}

// add appends r and reports whether the batch is full.
func (b *batch) add(r correlate.PeerRecord) bool {
	if len(b.recs) == 0 {
		b.due.Reset(flushEvery)
	}
	b.recs = append(b.recs, r)
	return len(b.recs) >= maxBatch
}

// take returns the pending records, valid until the next add.
func (b *batch) take() []correlate.PeerRecord {
	b.due.Stop()
	recs := b.recs
	b.recs = b.recs[:0]
	return recs
}

// chunks splits recs into messages' worth.
func chunks(recs []correlate.PeerRecord) [][]correlate.PeerRecord {
	var cs [][]correlate.PeerRecord
	for len(recs) > 0 {
		n := min(len(recs), maxBatch)
		cs = append(cs, recs[:n:n])
		recs = recs[n:]
	}
	return cs
}
