package peers

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
)

const (
	// version is the wire protocol's version; a hub refuses any other.
	version = 1
	// maxLine bounds one message; a longer line drops the connection.
	maxLine = 4 << 20
	// maxName bounds a job or sidecar ID.
	maxName = 256
)

// Message types.
const (
	typeHello   = "hello"   // member → hub: Job, ID, Version
	typeWelcome = "welcome" // hub → member: ID (the hub's), Peers (the other members)
	typeError   = "error"   // hub → member: Error; the hub closes the connection
	typePing    = "ping"    // member → hub: T1 (member clock)
	typePong    = "pong"    // hub → member: T1 echoed, T2 (hub clock)
	typeRecs    = "recs"    // either way: From, Recs
	typeJoined  = "joined"  // hub → member: ID of a new member
	typeLeft    = "left"    // hub → member: ID of a member gone
)

// message is one line on the wire; Type says which fields are set.
type message struct {
	Type    string                 `json:"t"`
	Job     string                 `json:"job,omitempty"`
	ID      string                 `json:"id,omitempty"`
	Version int                    `json:"v,omitempty"`
	Peers   []string               `json:"peers,omitempty"`
	Error   string                 `json:"err,omitempty"`
	T1      int64                  `json:"t1,omitempty"`
	T2      int64                  `json:"t2,omitempty"`
	From    string                 `json:"from,omitempty"`
	Recs    []correlate.PeerRecord `json:"recs,omitempty"`
}

// encode renders m as one line.
func encode(m *message) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("peers: encoding %s message: %v", m.Type, err)) // only plain fields
	}
	return append(b, '\n')
}

// writeLine writes one encoded message, giving up after writeTimeout.
func writeLine(c net.Conn, b []byte) error {
	if err := c.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return err
	}
	_, err := c.Write(b)
	return err
}

// reader reads messages from a connection, a line at a time.
type reader struct {
	c  net.Conn
	sc *bufio.Scanner
}

func newReader(c net.Conn) *reader {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine+1)
	return &reader{c: c, sc: sc}
}

// next reads the next message, waiting until deadline at most.
func (r *reader) next(deadline time.Time) (*message, error) {
	if err := r.c.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	if !r.sc.Scan() {
		err := r.sc.Err()
		switch {
		case err == nil:
			return nil, io.EOF
		case errors.Is(err, bufio.ErrTooLong):
			return nil, fmt.Errorf("message longer than %d bytes", maxLine)
		}
		return nil, err
	}
	m := new(message)
	if err := json.Unmarshal(r.sc.Bytes(), m); err != nil {
		return nil, fmt.Errorf("bad message: %w", err)
	}
	switch {
	case m.Type == "":
		return nil, errors.New("bad message: no type")
	case len(m.Recs) > maxBatch:
		return nil, fmt.Errorf("bad message: %d records, at most %d", len(m.Recs), maxBatch)
	}
	return m, nil
}
