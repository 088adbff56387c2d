package peers

import (
	"net"
	"testing"
	"time"
)

// FuzzDecode feeds the wire decoder arbitrary messages: an error or a
// message whose every field is within bounds, never a panic.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"t":"recs","from":"a","recs":[{"k":1,"p":7,"c":2748,"n":2,"r":1},{"k":2,"p":7,"c":2748,"q":9223372036854775807,"a":1}]}`))
	f.Add([]byte(`{"t":"welcome","id":"hub","peers":["a","b",""]}`))
	f.Add([]byte(`{"t":"pong","t1":-1,"t2":9223372036854775807}`))
	f.Add([]byte(`{"t":"auth","v":3,"n":"AAAA"}`))
	f.Add([]byte(`{"t":"challenge","n":"` + b64(make([]byte, nonceLen)) + `","mac":"x"}`))
	f.Add([]byte(`{"t":"hello","id":"x","mac":"` + b64(make([]byte, 32)) + `"}`))
	f.Add([]byte(`{"t":"recs","recs":[{"k":3,"p":1,"q":1,"a":-5,"b":4611686018427387904}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if m == nil {
			if err == nil {
				t.Fatal("no message and no error")
			}
			return
		}
		if err != nil {
			return // a batch with a bad record: dropped by the caller
		}
		if m.Type == "" || len(m.ID) > maxName || len(m.From) > maxName || len(m.Peers) > maxMembers || len(m.Recs) > maxBatch {
			t.Fatalf("accepted %+v", m)
		}
		for _, r := range m.Recs {
			if r.Check() != nil {
				t.Fatalf("accepted record %+v", r)
			}
		}
		_, _ = decodeNonce(m.Nonce)
		_ = checkProof(m.MAC, make([]byte, 32))
	})
}

// FuzzSealedRead feeds a sealed connection arbitrary lines: an error, or
// a message that opened, never a panic.
func FuzzSealedRead(f *testing.F) {
	nm, nh := make([]byte, nonceLen), make([]byte, nonceLen)
	out := newSealer(testSecret, labelMembeKey, "job", nm, nh)
	good := out.aead.Seal(nil, out.nonce(), []byte(`{"t":"ping","t1":5}`), nil)
	f.Add([]byte(b64(good) + "\n"))
	f.Add([]byte("not base64\n"))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, line []byte) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		go func() { _, _ = b.Write(line); b.Close() }()
		c := newConn(a)
		c.seal(newSealer(testSecret, labelMembeKey, "job", nm, nh), newSealer(testSecret, labelHubKey, "job", nm, nh))
		for range 4 {
			if _, err := c.next(time.Now().Add(time.Second)); err != nil {
				return
			}
		}
	})
}
