package record

import (
	"bytes"
	"compress/gzip"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

func gzipped(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A recording holding the sequence numbers that wrapped a mirror's ring
// replays without a panic: those calls are skipped and counted.
func TestRecordingHostilePeerReplays(t *testing.T) {
	rec := `{"header":{"probes":"full"}}
{"peer":{"from":"evil","recs":[{"k":1,"p":7,"c":2748,"n":2,"r":1}]}}
{"peer":{"from":"evil","recs":[{"k":2,"p":7,"c":2748,"r":0,"q":9223372036854775807,"a":1000}]}}
{"peer":{"from":"evil","recs":[{"k":2,"p":7,"c":2748,"r":0,"q":-9223372036854775807,"a":2000}]}}
{"advance":5000}
`
	r, err := NewReader(bytes.NewReader(gzipped(t, rec)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.Header().Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	ReplaySeq(cfg, correlate.Tee{}, r.Calls())
	if r.Err() != nil || r.Skipped() != 2 {
		t.Errorf("err %v, %d calls skipped, want none and 2", r.Err(), r.Skipped())
	}
}

// A line of a GiB (a small gzip of one long string) is read through in
// bounded memory, skipped and counted; the calls around it replay.
func TestRecordingLongLineBounded(t *testing.T) {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	// Writes to a bytes.Buffer through gzip do not fail.
	_, _ = io.WriteString(zw, "{\"header\":{\"probes\":\"full\"}}\n{\"advance\":5}\n{\"peer\":{\"from\":\"")
	chunk := strings.Repeat("a", 1<<20)
	for range 256 { // 256 MiB: enough to show the bound, quick to inflate
		_, _ = io.WriteString(zw, chunk)
	}
	_, _ = io.WriteString(zw, "\"}}\n{\"advance\":7}\n")
	_ = zw.Close()
	r, err := NewReader(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var adv []int64
	var before, after runtimeMem
	before.read()
	for c := range r.Calls() {
		adv = append(adv, c.Advance)
	}
	after.read()
	if len(adv) != 2 || adv[0] != 5 || adv[1] != 7 || r.Skipped() != 1 || r.Err() != nil {
		t.Fatalf("calls %v, %d skipped, err %v; want advances 5 and 7, 1 skipped", adv, r.Skipped(), r.Err())
	}
	if grew := after.total - before.total; grew > 64<<20 {
		t.Errorf("reading a 256 MiB line allocated %d MiB, want it bounded by the line cap", grew>>20)
	}
}

// FuzzRecording feeds the recording decoder and the engine arbitrary
// lines: never a panic, whatever a recording holds.
func FuzzRecording(f *testing.F) {
	f.Add(`{"header":{"probes":"full"}}
{"ev":{"Kind":19,"PID":1,"TID":1,"Start":10,"End":10,"Comm":5,"Count":2,"PeerRank":0}}
{"ev":{"Kind":8,"PID":1,"TID":1,"Start":20,"End":20,"Comm":5,"Op":1,"Count":4}}
{"advance":100}`)
	f.Add(`{"peer":{"from":"x","recs":[{"k":1,"p":7,"c":2748,"n":2,"r":1},{"k":2,"p":7,"c":2748,"q":9223372036854775807,"a":1}]}}`)
	f.Add(`{"peer":{"from":"x","recs":[{"k":3,"p":7,"c":2748,"q":-1,"a":1,"b":-1}]}}` + "\n" + `{"close":9}`)
	f.Add(`{"rank":{"pid":1,"rank":-7,"size":-1}}` + "\n" + `{"device":{"pid":1,"device":-1}}`)
	f.Add(`{"win":{"Device":0,"Start":` + "9223372036854775807" + `,"End":1}}`)
	f.Add("{\"advance\":1}\n\n\n{")
	f.Fuzz(func(t *testing.T, rec string) {
		r, err := NewReader(bytes.NewReader(gzipped(t, rec)))
		if err != nil {
			t.Fatal(err)
		}
		cfg := r.Header().Config()
		cfg.Logger = slog.New(slog.DiscardHandler)
		n := 0
		for c := range r.Calls() {
			if err := Check(&c); err != nil {
				t.Fatalf("returned a call that fails its check: %v", err)
			}
			n++
		}
		r2, _ := NewReader(bytes.NewReader(gzipped(t, rec)))
		ReplaySeq(cfg, correlate.Tee{}, r2.Calls())
	})
}

type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.total = s.TotalAlloc
}
