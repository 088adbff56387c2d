package cli

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// writeGz writes content gzip-compressed to a new file of dir.
func writeGz(t *testing.T, dir, name string, write func(w io.Writer)) string {
	t.Helper()
	p := filepath.Join(dir, name)
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	write(zw)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A recording holding a communicator and then sequence numbers 2^63-1 and
// -2^63+1 (they wrapped a mirror's ring: a panic) replays, the two calls
// skipped and said so.
func TestReplayHostileRecording(t *testing.T) {
	rec := writeGz(t, t.TempDir(), "evil.rec.gz", func(w io.Writer) {
		_, _ = io.WriteString(w, `{"header":{"probes":"full"}}
{"peer":{"from":"evil","recs":[{"k":1,"p":7,"c":2748,"n":2,"r":1}]}}
{"peer":{"from":"evil","recs":[{"k":2,"p":7,"c":2748,"r":0,"q":9223372036854775807,"a":1000}]}}
{"peer":{"from":"evil","recs":[{"k":2,"p":7,"c":2748,"r":0,"q":-9223372036854775807,"a":2000}]}}
{"advance":1700000000000000000}
`)
	})
	h := newHarness(t)
	if code := h.main(context.Background(), "replay", rec); code != ExitOK {
		t.Fatalf("replay: exit %d\n%s", code, h.stderr)
	}
	if !strings.Contains(h.stderr.String(), "2 calls skipped") {
		t.Errorf("stderr does not say the calls were skipped:\n%s", h.stderr)
	}
}

// A 1 MB recording holding a 1 GiB string replays in bounded memory: the
// line is read through and skipped, the calls around it replayed.
func TestReplayHugeLineBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("inflates 1 GiB")
	}
	rec := writeGz(t, t.TempDir(), "big.rec.gz", func(w io.Writer) {
		_, _ = io.WriteString(w, "{\"header\":{\"probes\":\"full\"}}\n{\"advance\":1700000000000000000}\n{\"peer\":{\"from\":\"")
		chunk := strings.Repeat("a", 1<<20)
		for range 1024 {
			_, _ = io.WriteString(w, chunk)
		}
		_, _ = io.WriteString(w, "\"}}\n{\"advance\":1700000001000000000}\n")
	})
	h := newHarness(t)
	var before, after heapPeak
	before.read()
	code := h.main(context.Background(), "replay", rec)
	after.read()
	if code != ExitOK || !strings.Contains(h.stderr.String(), "1 calls skipped") {
		t.Fatalf("replay: exit %d\n%s", code, h.stderr)
	}
	if grew := after.total - before.total; grew > 256<<20 {
		t.Errorf("replaying a 1 GiB line allocated %d MiB, want it bounded by the line cap", grew>>20)
	}
}

// convert of a gaps file with int64 extremes writes valid JSON (it wrote
// "--9223372036854775.-808"), the gaps out of range left out and counted.
func TestConvertInt64Extremes(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "gaps.jsonl")
	if err := os.WriteFile(in, []byte(`{"pid":1,"tid":1,"device":0,"step":0,"kind":"idle","start_unix_nano":-9223372036854775808,"end_unix_nano":9223372036854775807,"duration_ns":-9223372036854775808,"cause":"io.read"}
{"pid":1,"tid":1,"device":0,"step":0,"kind":"idle","start_unix_nano":1700000000000000000,"end_unix_nano":1700000000001000000,"duration_ns":1000000,"cause":"io.read"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "trace.json")
	h := newHarness(t)
	if code := h.main(context.Background(), "convert", "--from", in, "--perfetto-out", out); code != ExitOK {
		t.Fatalf("convert: exit %d\n%s", code, h.stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil || bytes.Contains(b, []byte("--")) {
		t.Fatalf("trace is not valid JSON (%v):\n%s", err, b)
	}
	if !strings.Contains(h.stderr.String(), "1 lines left out") {
		t.Errorf("stderr does not count the gap left out:\n%s", h.stderr)
	}
}

type heapPeak struct{ total uint64 }

func (m *heapPeak) read() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.total = s.TotalAlloc
}

// --spans-out none and OTEL_TRACES_EXPORTER=none write no spans file (the
// default ./gaptrace-spans.jsonl was written all the same); an explicit
// --spans-out still wins over the variable; /dev/null is accepted.
func TestSpansOutNone(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "flag none", args: []string{"--spans-out", "none"}, want: ""},
		{name: "env none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: ""},
		{name: "env none, flag file", args: []string{"--spans-out", "s.jsonl"}, env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: "s.jsonl"},
		{name: "dev null", args: []string{"--spans-out", "/dev/null"}, want: "/dev/null"},
		{name: "default", want: "gaptrace-spans.jsonl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for k, v := range tc.env {
				h.env[k] = v
			}
			args := append(append([]string{"run", "--live", "off"}, tc.args...), "--", "true")
			if code := h.main(context.Background(), args...); code != 0 {
				t.Fatalf("exit %d: %s", code, h.stderr)
			}
			if h.pipe.pc.Spans != tc.want {
				t.Errorf("spans file %q, want %q", h.pipe.pc.Spans, tc.want)
			}
		})
	}
}
