package peers

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

const (
	// version is the wire protocol's version; a hub refuses any other.
	// 2: authenticated and sealed. 3: process state records (PeerProc),
	// which a version 2 sidecar would take for bad records, dropping the
	// batches that hold them: the two refuse each other instead.
	version = 3
	// maxName bounds a job or sidecar ID.
	maxName = 256
)

// Message types.
const (
	typeAuth      = "auth"      // member → hub, open: Version, Nonce (the member's)
	typeChallenge = "challenge" // hub → member, open: Nonce (the hub's), MAC (the hub's proof)
	typeHello     = "hello"     // member → hub: ID, MAC (the member's proof)
	typeWelcome   = "welcome"   // hub → member: ID (the hub's), Peers (the other members)
	typeError     = "error"     // hub → member: Error; the hub closes the connection
	typePing      = "ping"      // member → hub: T1 (member clock)
	typePong      = "pong"      // hub → member: T1 echoed, T2 (hub clock)
	typeRecs      = "recs"      // either way: From, Recs
	typeJoined    = "joined"    // hub → member: ID of a new member
	typeLeft      = "left"      // hub → member: ID of a member gone
)

// message is one line on the wire; Type says which fields are set.
type message struct {
	Type    string                 `json:"t"`
	ID      string                 `json:"id,omitempty"`
	Version int                    `json:"v,omitempty"`
	Nonce   string                 `json:"n,omitempty"`
	MAC     string                 `json:"mac,omitempty"`
	Peers   []string               `json:"peers,omitempty"`
	Error   string                 `json:"err,omitempty"`
	T1      int64                  `json:"t1,omitempty"`
	T2      int64                  `json:"t2,omitempty"`
	From    string                 `json:"from,omitempty"`
	Recs    []correlate.PeerRecord `json:"recs,omitempty"`
}

// encode renders m as one message's plain bytes.
func encode(m *message) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("peers: encoding %s message: %v", m.Type, err)) // only plain fields
	}
	return b
}

// errBadRecords: a batch holding a record out of range. The connection
// stays; the batch is dropped and counted.
var errBadRecords = errors.New("bad records")

// decode parses one message and checks every field it carries: names and
// lists within bounds, clock readings and records within range. A batch
// with a bad record comes back with errBadRecords.
func decode(b []byte) (*message, error) {
	m := new(message)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("bad message: %w", err)
	}
	switch {
	case m.Type == "":
		return nil, errors.New("bad message: no type")
	case len(m.ID) > maxName || len(m.From) > maxName || len(m.Error) > maxName:
		return nil, fmt.Errorf("bad message: a name longer than %d bytes", maxName)
	case len(m.Peers) > maxMembers:
		return nil, fmt.Errorf("bad message: %d members, at most %d", len(m.Peers), maxMembers)
	case len(m.Recs) > maxBatch:
		return nil, fmt.Errorf("bad message: %d records, at most %d", len(m.Recs), maxBatch)
	case m.T1 < 0 || m.T2 < 0 || m.T1 > maxClock || m.T2 > maxClock:
		return nil, errors.New("bad message: clock reading out of range")
	}
	for _, p := range m.Peers {
		if p == "" || len(p) > maxName {
			return nil, errors.New("bad message: bad member ID")
		}
	}
	for i := range m.Recs {
		if err := m.Recs[i].Check(); err != nil {
			return m, fmt.Errorf("%w: %w", errBadRecords, err)
		}
	}
	return m, nil
}

// maxClock bounds a clock reading (Unix ns, year 2116): offsets between
// two readings cannot overflow.
const maxClock = int64(1) << 62

// next reads and decodes the next message.
func (c *conn) next(deadline time.Time) (*message, error) {
	b, err := c.read(deadline)
	if err != nil {
		return nil, err
	}
	return decode(b)
}

// send encodes and writes m.
func (c *conn) send(m *message) error { return c.write(encode(m)) }
