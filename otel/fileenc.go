package otel

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// appendFileSpan appends s as one line of the spans file: byte for byte
// what encoding/json writes for toFileSpan(s) with Resource set to the
// already encoded res (TestFileSpanEncoding holds it to that). The spans
// file gets every step's spans, hundreds a second on a fast loop, and
// encoding/json's reflection and sorted maps were most of the sidecar's
// export cost; this writes straight from the span's attributes. o keeps
// the order attributes are written in, per sequence of keys.
func appendFileSpan(b []byte, s sdktrace.ReadOnlySpan, service string, res []byte, o *attrOrders) ([]byte, error) {
	sc := s.SpanContext()
	b = append(b, `{"trace_id":"`...)
	tid := sc.TraceID()
	b = hex.AppendEncode(b, tid[:])
	b = append(b, `","span_id":"`...)
	sid := sc.SpanID()
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '"')
	if p := s.Parent(); p.IsValid() {
		b = append(b, `,"parent_span_id":"`...)
		psid := p.SpanID()
		b = hex.AppendEncode(b, psid[:])
		b = append(b, '"')
	}
	b = append(b, `,"name":`...)
	b = appendJSONString(b, s.Name())
	b = append(b, `,"start_unix_nano":`...)
	b = strconv.AppendInt(b, s.StartTime().UnixNano(), 10)
	b = append(b, `,"end_unix_nano":`...)
	b = strconv.AppendInt(b, s.EndTime().UnixNano(), 10)
	var err error
	if attrs := s.Attributes(); len(attrs) > 0 {
		b = append(b, `,"attributes":`...)
		if b, err = appendAttrObject(b, attrs, o); err != nil {
			return b, err
		}
	}
	if evs := s.Events(); len(evs) > 0 {
		b = append(b, `,"events":[`...)
		for i, e := range evs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"name":`...)
			b = appendJSONString(b, e.Name)
			b = append(b, `,"time_unix_nano":`...)
			b = strconv.AppendInt(b, e.Time.UnixNano(), 10)
			if len(e.Attributes) > 0 {
				b = append(b, `,"attributes":`...)
				if b, err = appendAttrObject(b, e.Attributes, o); err != nil {
					return b, err
				}
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"service":`...)
	b = appendJSONString(b, service)
	if len(res) > 0 {
		b = append(b, `,"resource":`...)
		b = append(b, res...)
	}
	return append(b, '}', '\n'), nil
}

// appendAttrObject writes attrs as encoding/json writes attrMap(attrs):
// keys sorted, a repeated key's last value.
func appendAttrObject(b []byte, attrs []attribute.KeyValue, o *attrOrders) ([]byte, error) {
	b = append(b, '{')
	for n, i := range o.of(attrs) {
		if n > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, string(attrs[i].Key))
		b = append(b, ':')
		var err error
		if b, err = appendAttrValue(b, attrs[i].Value); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}

// attrOrders remembers the order attributes are written in for the
// sequences of keys spans come with. Spans of one kind (a step, a gap of
// one cause, a host operation) carry the same keys in the same order, and
// sorting each span's ~25 attributes anew was most of the file encoder's
// CPU; a sequence seen before is recognized by comparing its keys (the
// same constant strings, so mostly by pointer).
type attrOrders struct {
	seqs []attrOrder
	next int // the entry replaced next once seqs is full
}

type attrOrder struct {
	keys []attribute.Key
	idx  []int // into the sequence, by key, a repeated key's last only
}

// attrOrdersMax bounds the sequences remembered.
const attrOrdersMax = 64

// of returns the indices of attrs to write, in order.
func (o *attrOrders) of(attrs []attribute.KeyValue) []int {
	for i := range o.seqs {
		if sameKeys(o.seqs[i].keys, attrs) {
			return o.seqs[i].idx
		}
	}
	keys := make([]attribute.Key, len(attrs))
	idx := make([]int, len(attrs))
	for i, kv := range attrs {
		keys[i], idx[i] = kv.Key, i
	}
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(keys[x], keys[y]) })
	kept := idx[:0]
	for n, i := range idx {
		if n+1 < len(idx) && keys[idx[n+1]] == keys[i] {
			continue // a later value replaces this one, as in a map
		}
		kept = append(kept, i)
	}
	e := attrOrder{keys: keys, idx: kept}
	if len(o.seqs) < attrOrdersMax {
		o.seqs = append(o.seqs, e)
	} else {
		o.seqs[o.next] = e
		o.next = (o.next + 1) % attrOrdersMax
	}
	return kept
}

func sameKeys(keys []attribute.Key, attrs []attribute.KeyValue) bool {
	if len(keys) != len(attrs) {
		return false
	}
	for i := range keys {
		if keys[i] != attrs[i].Key {
			return false
		}
	}
	return true
}

func appendAttrValue(b []byte, v attribute.Value) ([]byte, error) {
	var err error
	switch v.Type() {
	case attribute.BOOL:
		b = strconv.AppendBool(b, v.AsBool())
	case attribute.INT64:
		b = strconv.AppendInt(b, v.AsInt64(), 10)
	case attribute.FLOAT64:
		b, err = appendJSONFloat(b, v.AsFloat64())
	case attribute.STRING:
		b = appendJSONString(b, v.AsString())
	case attribute.BOOLSLICE:
		b = appendJSONArray(b, v.AsBoolSlice(), func(b []byte, x bool) ([]byte, error) { return strconv.AppendBool(b, x), nil }, &err)
	case attribute.INT64SLICE:
		b = appendJSONArray(b, v.AsInt64Slice(), func(b []byte, x int64) ([]byte, error) { return strconv.AppendInt(b, x, 10), nil }, &err)
	case attribute.FLOAT64SLICE:
		b = appendJSONArray(b, v.AsFloat64Slice(), appendJSONFloat, &err)
	case attribute.STRINGSLICE:
		b = appendJSONArray(b, v.AsStringSlice(), func(b []byte, x string) ([]byte, error) { return appendJSONString(b, x), nil }, &err)
	default:
		b = append(b, "null"...) // attribute.INVALID: AsInterface is nil
	}
	return b, err
}

func appendJSONArray[T any](b []byte, xs []T, f func([]byte, T) ([]byte, error), err *error) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		var e error
		if b, e = f(b, x); e != nil && *err == nil {
			*err = e
		}
	}
	return append(b, ']')
}

// appendJSONFloat formats f as encoding/json does (ES6 number formatting)
// and, like it, refuses NaN and infinities.
func appendJSONFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, fmt.Errorf("json: unsupported value: %s", strconv.FormatFloat(f, 'g', -1, 64))
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 → e-9, as encoding/json writes it.
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

// appendJSONString quotes s as encoding/json does with HTML escaping on
// (its Encoder's default): <, > and & as \u00XX, invalid UTF-8 as \ufffd,
// U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
