package peers

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"
)

// Mutual authentication. Both sides hold the job's secret K. The member
// sends a fresh nonce Nm; the hub answers with its own Nh and
// HMAC(K, "hub", job, Nm, Nh): a hub that does not hold K (someone else's
// listener on the port) cannot produce it, and the member leaves. From
// then on each direction is sealed with AES-256-GCM under a key drawn from
// K and both nonces, with a message counter as the GCM nonce: a message
// that does not open (a sidecar without K, of another job, a replayed or
// reordered message) drops the connection without an answer. The member's
// hello carries HMAC(K, "member", job, Nh, Nm, id) as well. Fresh nonces
// on both sides make every connection's keys new, so nothing recorded
// from one connection opens on another.

const nonceLen = 32

// Labels that keep the MACs and keys of each role and direction apart.
const (
	labelHub      = "gaptrace-peers/2 hub proof"
	labelMember   = "gaptrace-peers/2 member proof"
	labelHubKey   = "gaptrace-peers/2 key hub>member"
	labelMembeKey = "gaptrace-peers/2 key member>hub"
)

// mac is HMAC-SHA256 under key over the length-prefixed parts.
func mac(key []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range append([][]byte{[]byte(label)}, parts...) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

func hubProof(secret []byte, job string, nm, nh []byte) []byte {
	return mac(secret, labelHub, []byte(job), nm, nh)
}

func memberProof(secret []byte, job string, nm, nh []byte, id string) []byte {
	return mac(secret, labelMember, []byte(job), nh, nm, []byte(id))
}

// checkProof compares a received proof with the expected one in constant
// time.
func checkProof(got string, want []byte) bool {
	b, err := base64.StdEncoding.DecodeString(got)
	return err == nil && hmac.Equal(b, want)
}

func newNonce() []byte {
	b := make([]byte, nonceLen)
	if _, err := rand.Read(b); err != nil {
		panic("peers: no randomness: " + err.Error()) // crypto/rand does not fail on Linux
	}
	return b
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// decodeNonce reads a peer's nonce.
func decodeNonce(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != nonceLen {
		return nil, errors.New("bad nonce")
	}
	return b, nil
}

// sealer seals one direction of a connection.
type sealer struct {
	aead cipher.AEAD
	n    uint64 // messages so far: the next GCM nonce
}

func newSealer(secret []byte, label string, job string, nm, nh []byte) *sealer {
	key := mac(secret, label, []byte(job), nm, nh)
	block, err := aes.NewCipher(key) // 32 bytes: AES-256
	if err != nil {
		panic("peers: " + err.Error())
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic("peers: " + err.Error())
	}
	return &sealer{aead: aead}
}

func (s *sealer) nonce() []byte {
	var n [12]byte
	binary.BigEndian.PutUint64(n[4:], s.n)
	s.n++
	return n[:]
}

// Line limits: before a sidecar proved the secret it sends one short
// line; after, a message is at most a batch of records or the member
// list, sealed and base64-encoded.
const (
	maxOpenLine = 1 << 10
	maxLine     = 1 << 20
)

// conn is one connection's framing: newline-delimited messages, sealed
// once both sides have their keys. Reads are one goroutine's, writes one
// other's at a time.
type conn struct {
	c     net.Conn
	br    *bufio.Reader
	limit int
	in    *sealer
	out   *sealer
}

func newConn(c net.Conn) *conn {
	return &conn{c: c, br: bufio.NewReaderSize(c, 4<<10), limit: maxOpenLine}
}

// seal switches the connection to sealed messages both ways.
func (c *conn) seal(in, out *sealer) {
	c.in, c.out, c.limit = in, out, maxLine
}

// readLine reads one line without its newline, at most c.limit bytes,
// waiting until deadline at most.
func (c *conn) readLine(deadline time.Time) ([]byte, error) {
	if err := c.c.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	var buf []byte
	for {
		frag, err := c.br.ReadSlice('\n')
		if len(buf)+len(frag) > c.limit+1 {
			return nil, fmt.Errorf("message longer than %d bytes", c.limit)
		}
		buf = append(buf, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:len(buf)-1], nil
	}
}

// errUnsealed: a message that does not open under this connection's key.
var errUnsealed = errors.New("a message not sealed with the job's secret")

// read returns the next message's plain bytes.
func (c *conn) read(deadline time.Time) ([]byte, error) {
	b, err := c.readLine(deadline)
	if err != nil || c.in == nil {
		return b, err
	}
	sealed := make([]byte, base64.StdEncoding.DecodedLen(len(b)))
	n, err := base64.StdEncoding.Decode(sealed, b)
	if err != nil {
		return nil, errUnsealed
	}
	plain, err := c.in.aead.Open(sealed[:0], c.in.nonce(), sealed[:n], nil)
	if err != nil {
		return nil, errUnsealed
	}
	return plain, nil
}

// write writes one message's plain bytes, sealed once keys are set,
// giving up after writeTimeout.
func (c *conn) write(plain []byte) error {
	var line []byte
	if c.out != nil {
		sealed := c.out.aead.Seal(nil, c.out.nonce(), plain, nil)
		line = make([]byte, base64.StdEncoding.EncodedLen(len(sealed))+1)
		base64.StdEncoding.Encode(line, sealed)
	} else {
		line = append(append(make([]byte, 0, len(plain)+1), plain...), '\n')
	}
	line[len(line)-1] = '\n'
	if err := c.c.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return err
	}
	_, err := c.c.Write(line)
	return err
}
