package otel

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

// Derived IDs let sidecars of one job agree on a step's trace without
// talking to each other: every input that identifies a span is hashed with a
// domain tag, so the root, the rank spans and unrelated jobs never collide
// except by SHA-256 accident.

func derive(tag string, job string, nums ...int64) [32]byte {
	h := sha256.New()
	h.Write([]byte("gaptrace/" + tag + "\x00"))
	h.Write([]byte(job))
	var b [8]byte
	for _, n := range nums {
		binary.BigEndian.PutUint64(b[:], uint64(n))
		h.Write(b[:])
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// StepTraceID is the trace ID of step's trace in job.
func StepTraceID(job string, step int64) trace.TraceID {
	d := derive("trace", job, step)
	var id trace.TraceID
	copy(id[:], d[:16])
	if !id.IsValid() {
		id[15] = 1
	}
	return id
}

// StepRootSpanID is the span ID of the train.step root of step in job.
func StepRootSpanID(job string, step int64) trace.SpanID {
	return spanIDFrom(derive("root", job, step))
}

// rankSpanID is the span ID of the "rank <N>" span. The device is part of
// the key so that one process driving several GPUs still gets distinct spans.
func rankSpanID(job string, step int64, rank, device int) trace.SpanID {
	return spanIDFrom(derive("rank", job, step, int64(rank), int64(device)))
}

func spanIDFrom(d [32]byte) trace.SpanID {
	var id trace.SpanID
	copy(id[:], d[:8])
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// fixedIDs are the IDs a job's shared span takes (direct.go): the step's
// root and each rank's span, derived above.
type fixedIDs struct {
	trace trace.TraceID
	span  trace.SpanID
}

// idGenerator is the SDK's IDGenerator and the direct spans' (direct.go):
// random IDs from the runtime's per-thread ChaCha8 source (no lock on the
// hot path, unlike the SDK's default generator).
type idGenerator struct{}

func (idGenerator) NewIDs(context.Context) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.BigEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}
