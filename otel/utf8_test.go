package otel_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	colmetric "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// decodingCollector keeps every span request it could decode, as a real
// collector does; a request that does not decode is what loses a batch.
type decodingCollector struct {
	coltrace.UnimplementedTraceServiceServer
	mu   sync.Mutex
	reqs []*coltrace.ExportTraceServiceRequest
	bad  int
}

func (c *decodingCollector) Export(_ context.Context, r *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, r)
	return &coltrace.ExportTraceServiceResponse{}, nil
}

func (c *decodingCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/traces" {
		w.WriteHeader(http.StatusOK)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		c.mu.Lock()
		c.bad++
		c.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.Export(r.Context(), &req) //nolint:errcheck // never fails
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// strings returns every attribute string value received (resource, spans,
// events) and the span count.
func (c *decodingCollector) strings() ([]string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	n := 0
	add := func(kvs []*commonpb.KeyValue) {
		for _, kv := range kvs {
			out = append(out, kv.Key, kv.GetValue().GetStringValue())
		}
	}
	for _, r := range c.reqs {
		for _, rs := range r.ResourceSpans {
			add(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					n++
					add(s.Attributes)
					for _, e := range s.Events {
						add(e.Attributes)
					}
				}
			}
		}
	}
	return out, n
}

// A file name and a command line that are not UTF-8 must not cost a
// single span, over either protocol.
func TestInvalidUTF8NeverDropsABatch(t *testing.T) {
	for _, proto := range []string{otel.ProtocolGRPC, otel.ProtocolHTTPProtobuf} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team=caf\xe9")
			col := &decodingCollector{}
			var endpoint string
			if proto == otel.ProtocolGRPC {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := grpc.NewServer()
				coltrace.RegisterTraceServiceServer(srv, col)
				served := make(chan error, 1)
				go func() { served <- srv.Serve(ln) }()
				defer func() {
					srv.Stop()
					// Serve returns nil once stopped; anything else broke the collector.
					if err := <-served; err != nil {
						t.Errorf("grpc collector: %v", err)
					}
				}()
				endpoint = "http://" + ln.Addr().String()
			} else {
				srv := httptest.NewServer(col)
				defer srv.Close()
				endpoint = srv.URL
			}
			t.Setenv("OTEL_METRICS_EXPORTER", "none")
			x, err := otel.New(context.Background(), otel.Config{Endpoint: endpoint, Protocol: proto, Rank: -1,
				BatchTimeout: 20 * time.Millisecond,
				Resource:     otel.ResourceInfo{TargetPID: 7, TargetCmdline: []string{"/opt/tr\xffin", "--data=/d/\xfe"}}})
			if err != nil {
				t.Fatal(err)
			}
			sy := synth{pid: 7, t0: time.Now().UnixNano()}
			total := 0
			for n := range int64(8) {
				st, gaps := sy.step(n)
				for i := range gaps {
					for j := range gaps[i].Evidence.Files {
						gaps[i].Evidence.Files[j].Path = "/data/\xff\xfe\x1b]0;x\x07shard"
					}
					for j := range gaps[i].Ops {
						gaps[i].Ops[j].Attrs = map[string]string{"file.path": "/data/\xc3(bad"}
					}
					total += 1 + len(gaps[i].Ops)
				}
				deliver(x, st, gaps...)
				total++
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := x.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			st := x.Stats()
			strs, got := col.strings()
			if st.SpansDropped != 0 || st.ExportErrors != 0 || got != total || col.bad != 0 {
				t.Fatalf("collector decoded %d of %d spans (undecodable requests %d), stats %+v", got, total, col.bad, st)
			}
			joined := strings.Join(strs, "\n")
			for _, s := range strs {
				if !utf8.ValidString(s) {
					t.Errorf("invalid UTF-8 reached the collector: %q", s)
				}
			}
			for _, want := range []string{`/opt/tr\xffin --data=/d/\xfe`, `/data/\xc3(bad`, `caf\xe9`} {
				if !strings.Contains(joined, want) {
					t.Errorf("%q not received (the bad bytes should be written out, not lost)", want)
				}
			}
		})
	}
}

func TestValidUTF8(t *testing.T) {
	for in, want := range map[string]string{"ok/é": "ok/é", "a\xffb": `a\xffb`, "\xe2\x82": `\xe2\x82`} {
		if got := otel.ValidUTF8(in); got != want {
			t.Errorf("ValidUTF8(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:s3cret@collector:4318/otlp?api_key=k": "https://collector:4318/otlp",
		"http://collector:4317":                             "http://collector:4317",
		"collector:4317":                                    "collector:4317",
		"user:pw@collector:4317":                            "collector:4317",
	} {
		if got := otel.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A collector that refuses connections for a while, then comes back on
// the same port: spans ended meanwhile arrive after all.
func TestCollectorDownThenBack(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	x, err := otel.New(context.Background(), otel.Config{Endpoint: "http://" + addr, Protocol: otel.ProtocolHTTPProtobuf,
		Rank: -1, BatchTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sy := synth{pid: 3, t0: time.Now().UnixNano()}
	total := emit(x, sy, 0, 6)
	deadline := time.Now().Add(10 * time.Second)
	for x.Stats().ExportErrors == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if x.Stats().ExportErrors == 0 {
		t.Fatal("no export failed against a refusing collector")
	}
	col := &decodingCollector{}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	srv := &http.Server{Handler: col}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("collector: %v", err)
		}
	}()
	total += emit(x, sy, 6, 4)
	for time.Now().Before(deadline.Add(30 * time.Second)) {
		if _, n := col.strings(); n >= total {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := x.Shutdown(ctx); err != nil {
		t.Errorf("shutdown after the collector came back: %v", err)
	}
	if _, n := col.strings(); n != total || x.Stats().SpansDropped != 0 {
		t.Errorf("collector got %d of %d spans after coming back; stats %+v", n, total, x.Stats())
	}
}

// metricsCollector keeps every metrics request it could decode.
type metricsCollector struct {
	colmetric.UnimplementedMetricsServiceServer
	mu   sync.Mutex
	reqs []*colmetric.ExportMetricsServiceRequest
	bad  int
}

func (c *metricsCollector) Export(_ context.Context, r *colmetric.ExportMetricsServiceRequest) (*colmetric.ExportMetricsServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, r)
	return &colmetric.ExportMetricsServiceResponse{}, nil
}

func (c *metricsCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/metrics" {
		w.WriteHeader(http.StatusOK)
		return
	}
	var req colmetric.ExportMetricsServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		c.mu.Lock()
		c.bad++
		c.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.Export(r.Context(), &req) //nolint:errcheck // never fails
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// strings returns every resource and data point attribute as key=value,
// and the number of data points.
func (c *metricsCollector) strings() ([]string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	n := 0
	add := func(kvs []*commonpb.KeyValue) {
		for _, kv := range kvs {
			out = append(out, kv.Key+"="+kv.GetValue().GetStringValue())
		}
	}
	for _, r := range c.reqs {
		for _, rm := range r.ResourceMetrics {
			add(rm.GetResource().GetAttributes())
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					for _, dp := range m.GetSum().GetDataPoints() {
						n++
						add(dp.Attributes)
					}
					for _, dp := range m.GetHistogram().GetDataPoints() {
						n++
						add(dp.Attributes)
					}
					for _, dp := range m.GetGauge().GetDataPoints() {
						n++
						add(dp.Attributes)
					}
				}
			}
		}
	}
	return out, n
}

// A container, pod, namespace, job or command line that is not UTF-8 must
// not cost a metrics export (OTLP, either protocol) nor a Prometheus scrape.
func TestInvalidUTF8NeverDropsAMetricExport(t *testing.T) {
	for _, proto := range []string{otel.ProtocolGRPC, otel.ProtocolHTTPProtobuf} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_TRACES_EXPORTER", "none")
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team=caf\xe9")
			col := &metricsCollector{}
			var endpoint string
			if proto == otel.ProtocolGRPC {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := grpc.NewServer()
				colmetric.RegisterMetricsServiceServer(srv, col)
				served := make(chan error, 1)
				go func() { served <- srv.Serve(ln) }()
				defer func() {
					srv.Stop()
					if err := <-served; err != nil {
						t.Errorf("grpc collector: %v", err)
					}
				}()
				endpoint = "http://" + ln.Addr().String()
			} else {
				srv := httptest.NewServer(col)
				defer srv.Close()
				endpoint = srv.URL
			}
			x, err := otel.New(context.Background(), otel.Config{Endpoint: endpoint, Protocol: proto, Rank: -1,
				JobID: "job-\xff", PrometheusAddr: "127.0.0.1:0", MetricsInterval: time.Hour,
				DeviceUUID: func(int) string { return "GPU-\xfe" },
				Resource:   otel.ResourceInfo{TargetPID: 7, TargetCmdline: []string{"/opt/tr\xffin", "--data=/d/\xfe"}}})
			if err != nil {
				t.Fatal(err)
			}
			w := &correlate.Workload{ContainerID: "ctr-\xff", PodName: "pod-\xfe", PodNamespace: "ns-\xc3(", ContainerName: "c\xff"}
			sy := synth{pid: 7, t0: time.Now().UnixNano()}
			for n := range int64(4) {
				st, gaps := sy.step(n)
				st.Workload = w
				for i := range gaps {
					gaps[i].Workload = w
				}
				deliver(x, st, gaps...)
			}

			resp, err := http.Get("http://" + x.PrometheusAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !utf8.Valid(body) {
				t.Errorf("the Prometheus exposition is not UTF-8:\n%s", body)
			}
			for _, want := range []string{`k8s_pod_name="pod-\\xfe"`, `container_id="ctr-\\xff"`, `job="job-\\xff"`,
				`process_command_line="/opt/tr\\xffin --data=/d/\\xfe"`} {
				if !strings.Contains(string(body), want) {
					t.Errorf("%s not in the exposition:\n%s", want, body)
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := x.Shutdown(ctx); err != nil {
				t.Errorf("shutdown (the final metrics export): %v", err)
			}
			strs, points := col.strings()
			if points == 0 || col.bad != 0 {
				t.Fatalf("collector decoded %d data points (undecodable requests %d)", points, col.bad)
			}
			joined := strings.Join(strs, "\n")
			for _, s := range strs {
				if !utf8.ValidString(s) {
					t.Errorf("invalid UTF-8 reached the collector: %q", s)
				}
			}
			for _, want := range []string{`k8s_pod_name=pod-\xfe`, `container_id=ctr-\xff`, `k8s_namespace_name=ns-\xc3(`,
				`gpu_uuid=GPU-\xfe`, `process.command_line=/opt/tr\xffin --data=/d/\xfe`, `team=caf\xe9`} {
				if !strings.Contains(joined, want) {
					t.Errorf("%q not received (the bad bytes should be written out, not lost):\n%s", want, joined)
				}
			}
		})
	}
}
