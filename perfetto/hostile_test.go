package perfetto

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// Microseconds are written exactly at the ends of int64: math.MinInt64
// came out as "--9223372036854775.-808".
func TestMicrosecondsExtremes(t *testing.T) {
	for ns, want := range map[int64]string{
		math.MinInt64:             "-9223372036854775.808",
		math.MaxInt64:             "9223372036854775.807",
		-1:                        "-0.001",
		-1000:                     "-1",
		0:                         "0",
		1_700_000_000_123_456_789: "1700000000123456.789",
	} {
		if got := string(us(ns)); got != want {
			t.Errorf("us(%d) = %s, want %s", ns, got, want)
		}
		var f float64
		if err := json.Unmarshal([]byte(us(ns)), &f); err != nil {
			t.Errorf("us(%d) = %s: not a JSON number: %v", ns, us(ns), err)
		}
	}
}

// A gaps file with times at the ends of int64 converts to valid JSON: the
// gaps out of range are left out and counted, the good one kept.
func TestConvertInt64Extremes(t *testing.T) {
	in := `{"pid":1,"tid":1,"device":0,"step":0,"kind":"idle","start_unix_nano":-9223372036854775808,"end_unix_nano":9223372036854775807,"duration_ns":0,"cause":"io.read"}
{"pid":1,"tid":1,"device":0,"step":0,"kind":"idle","start_unix_nano":1700000000000000000,"end_unix_nano":1700000000001000000,"duration_ns":1000000,"cause":"io.read"}
{"pid":1,"tid":1,"device":-5,"step":0,"kind":"idle","start_unix_nano":1700000000000000000,"end_unix_nano":1700000000001000000,"duration_ns":1000000,"cause":"io.read"}
`
	var out bytes.Buffer
	w := New(&out, Options{})
	format, skipped, err := ConvertCount(strings.NewReader(in), w)
	if err != nil || format != FormatGaps || skipped != 2 {
		t.Fatalf("convert: %q, %d skipped, %v; want gaps, 2 skipped", format, skipped, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var f File
	if err := json.Unmarshal(out.Bytes(), &f); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.Bytes())
	}
	if g, _ := w.Counts(); g != 1 {
		t.Errorf("%d gaps written, want 1", g)
	}
}

// A line over MaxLine is an error that says so, read in bounded memory.
func TestConvertLongLine(t *testing.T) {
	in := `{"cause":"x","start_unix_nano":1,"a":"` + strings.Repeat("a", 2*MaxLine) + "\"}\n"
	_, _, err := ConvertCount(strings.NewReader(in), New(&bytes.Buffer{}, Options{}))
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("err %v, want a line too long", err)
	}
}

// FuzzConvert feeds the gaps and spans line decoders arbitrary input: an
// error or a trace, never a panic, and the trace is JSON.
func FuzzConvert(f *testing.F) {
	f.Add(`{"pid":1,"tid":2,"device":0,"step":3,"kind":"stall","start_unix_nano":10,"end_unix_nano":20,"duration_ns":10,"cause":"comm","ops":[{"name":"read","tid":2,"start":11,"end":12}],"evidence":{"collective":{"op":"all_reduce","rank":1}}}`)
	f.Add(`{"trace_id":"a","span_id":"b","name":"gpu.idle","start_unix_nano":5,"end_unix_nano":9,"attributes":{"process.pid":1,"gaptrace.rank":0,"gpu.device":1e300,"gpu.gap.duration_ms":-1}}
{"trace_id":"a","span_id":"c","parent_span_id":"b","name":"io.read","start_unix_nano":6,"end_unix_nano":7,"attributes":{"thread.id":3}}
{"trace_id":"a","span_id":"d","name":"train.step","start_unix_nano":1,"end_unix_nano":20,"attributes":{"gpu.step.number":1,"gpu.step.duration_ms":19,"gpu.device":-3}}`)
	f.Add(`{"cause":"x","start_unix_nano":-9223372036854775808,"end_unix_nano":-9223372036854775808}`)
	f.Add("\n\n{")
	f.Fuzz(func(t *testing.T, in string) {
		var out bytes.Buffer
		w := New(&out, Options{})
		if _, _, err := ConvertCount(strings.NewReader(in), w); err != nil {
			return
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		var file File
		if err := json.Unmarshal(out.Bytes(), &file); err != nil {
			t.Fatalf("trace is not JSON: %v\n%s", err, out.Bytes())
		}
	})
}
