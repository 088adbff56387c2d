package main

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	collpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// sink is the trace backend the gateway exports to: an OTLP gRPC server
// that counts what it receives.
type sink struct {
	collpb.UnimplementedTraceServiceServer
	srv   *grpc.Server
	ln    net.Listener
	spans atomic.Int64

	mu     sync.Mutex
	traces map[[16]byte]bool
}

func newSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{ln: ln, srv: grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20)), traces: map[[16]byte]bool{}}
	collpb.RegisterTraceServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *sink) addr() string { return s.ln.Addr().String() }

func (s *sink) Export(_ context.Context, req *collpb.ExportTraceServiceRequest) (*collpb.ExportTraceServiceResponse, error) {
	n := 0
	s.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			n += len(ss.Spans)
			for _, sp := range ss.Spans {
				var id [16]byte
				copy(id[:], sp.TraceId)
				s.traces[id] = true
			}
		}
	}
	s.mu.Unlock()
	s.spans.Add(int64(n))
	return &collpb.ExportTraceServiceResponse{}, nil
}

func (s *sink) counts() (spans int64, traces int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spans.Load(), len(s.traces)
}

func (s *sink) stop() { s.srv.Stop() }
