// Package jaegertest starts a real Jaeger (v2, all-in-one, in-memory) on
// loopback ports for gaptrace's tests and queries it over its HTTP API.
//
// The binary comes from $GAPTRACE_JAEGER (set by `make test`) or
// build/jaeger under the repository root (`make jaeger`). A missing binary is
// a test failure, not a skip: CI builds it, and a skipped end-to-end test
// would hide a broken pipeline. Only the quick tier (-short, make unit)
// skips Jaeger tests. Each Start picks fresh ports and the process
// dies with the test (t.Cleanup), so tests may run in parallel.
package jaegertest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// Binary returns the Jaeger binary to run or an error that says how to get it.
func Binary() (string, error) {
	return testutil.ToolBinary("GAPTRACE_JAEGER", "jaeger", "builds Jaeger v1.76 from tools/jaeger/go.mod")
}

// Jaeger is one running all-in-one instance.
type Jaeger struct {
	OTLPGRPCPort, OTLPHTTPPort, QueryPort int

	cmd      *exec.Cmd
	logs     *testutil.LockedBuffer
	exited   chan struct{}
	stopOnce sync.Once
}

// Start runs Jaeger and waits until it is healthy and its query API answers.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	testutil.SkipShort(t, "Jaeger")
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := testutil.FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	j := &Jaeger{OTLPGRPCPort: ports[0], OTLPHTTPPort: ports[1], QueryPort: ports[2],
		logs: &testutil.LockedBuffer{Limit: 4 << 20}, exited: make(chan struct{})}
	health := ports[4]
	cmd := exec.Command(bin, "--config", filepath.Join(root, "test", "e2e", "testdata", "jaeger.yaml"))
	cmd.Env = append(os.Environ(),
		"GAPTRACE_E2E_OTLP_GRPC_PORT="+strconv.Itoa(ports[0]),
		"GAPTRACE_E2E_OTLP_HTTP_PORT="+strconv.Itoa(ports[1]),
		"GAPTRACE_E2E_QUERY_PORT="+strconv.Itoa(ports[2]),
		"GAPTRACE_E2E_QUERY_GRPC_PORT="+strconv.Itoa(ports[3]),
		"GAPTRACE_E2E_HEALTH_PORT="+strconv.Itoa(health),
		// Jaeger's own tracing would dial localhost:4317, which may be a
		// developer's real collector.
		"OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none",
	)
	cmd.Stdout, cmd.Stderr = j.logs, j.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start jaeger %s: %v", bin, err)
	}
	j.cmd = cmd
	go func() { _ = cmd.Wait(); close(j.exited) }()
	t.Cleanup(j.Stop)

	started := time.Now()
	deadline := started.Add(60 * time.Second)
	for {
		select {
		case <-j.exited:
			t.Fatalf("jaeger exited during start: %v\n%s", cmd.ProcessState, j.logs.String())
		default:
		}
		if j.ready(health) {
			t.Logf("jaeger %s ready in %s: otlp grpc %s, otlp http %s, query %s", bin,
				time.Since(started).Round(time.Millisecond), j.OTLPGRPCEndpoint(), j.OTLPHTTPURL(), j.QueryURL())
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not ready after 60s\n%s", j.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpClient keeps no idle connections: Jaeger's health-check extension
// waits for open connections at shutdown, which would stall Stop.
var httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func (j *Jaeger) ready(healthPort int) bool {
	c := httpClient
	for _, u := range []string{
		fmt.Sprintf("http://127.0.0.1:%d/status", healthPort),
		j.QueryURL() + "/api/services",
	} {
		resp, err := c.Get(u)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	// The receivers bind after the extensions; make sure they accept.
	for _, p := range []int{j.OTLPGRPCPort, j.OTLPHTTPPort} {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p), time.Second)
		if err != nil {
			return false
		}
		conn.Close()
	}
	return true
}

// Stop kills Jaeger (SIGKILL) and waits for it to exit; safe to call
// twice. Storage is in memory, so there is nothing to shut down cleanly, and
// once its query API has answered, Jaeger v1.76 takes 10 s to honour
// SIGTERM. For the outage tests a kill is also the harsher case: a
// collector that vanishes without closing its connections.
func (j *Jaeger) Stop() {
	j.stopOnce.Do(func() {
		if j.cmd == nil || j.cmd.Process == nil {
			return
		}
		_ = j.cmd.Process.Kill()
		<-j.exited
	})
}

// Logs returns what Jaeger printed so far.
func (j *Jaeger) Logs() string { return j.logs.String() }

// OTLPGRPCEndpoint is host:port of the OTLP gRPC receiver.
func (j *Jaeger) OTLPGRPCEndpoint() string { return "127.0.0.1:" + strconv.Itoa(j.OTLPGRPCPort) }

// OTLPHTTPURL is the base URL of the OTLP HTTP receiver.
func (j *Jaeger) OTLPHTTPURL() string { return "http://127.0.0.1:" + strconv.Itoa(j.OTLPHTTPPort) }

// QueryURL is the base URL of the query API and UI.
func (j *Jaeger) QueryURL() string { return "http://127.0.0.1:" + strconv.Itoa(j.QueryPort) }

// Trace is one trace as /api/traces returns it.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span of a Trace. Times are microseconds.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"`
	Duration      int64       `json:"duration"`
	Tags          []KeyValue  `json:"tags"`
	Logs          []Log       `json:"logs"`
	ProcessID     string      `json:"processID"`
	Warnings      []string    `json:"warnings"`
}

// Reference links a span to its parent.
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is a tag.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Log is a span event.
type Log struct {
	Timestamp int64      `json:"timestamp"`
	Fields    []KeyValue `json:"fields"`
}

// Process is a span's emitting process (the OTel resource).
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Tag returns a span tag's value.
func (s *Span) Tag(key string) (any, bool) { return findKV(s.Tags, key) }

// TagString returns a tag formatted as a string ("" when absent).
func (s *Span) TagString(key string) string {
	v, ok := s.Tag(key)
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// ParentID returns the CHILD_OF parent's span ID ("" for a root).
func (s *Span) ParentID() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// EndTime is StartTime+Duration in microseconds.
func (s *Span) EndTime() int64 { return s.StartTime + s.Duration }

func findKV(kvs []KeyValue, key string) (any, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// ProcessTag returns a resource attribute of the span's process.
func (t *Trace) ProcessTag(s *Span, key string) (any, bool) {
	p, ok := t.Processes[s.ProcessID]
	if !ok {
		return nil, false
	}
	if key == "service.name" {
		return p.ServiceName, true
	}
	return findKV(p.Tags, key)
}

// ByName returns the spans with an operation name.
func (t *Trace) ByName(name string) []*Span {
	var out []*Span
	for i := range t.Spans {
		if t.Spans[i].OperationName == name {
			out = append(out, &t.Spans[i])
		}
	}
	return out
}

// ByNamePrefix returns the spans whose operation name starts with prefix.
func (t *Trace) ByNamePrefix(prefix string) []*Span {
	var out []*Span
	for i := range t.Spans {
		if strings.HasPrefix(t.Spans[i].OperationName, prefix) {
			out = append(out, &t.Spans[i])
		}
	}
	return out
}

// Span returns the span with an ID.
func (t *Trace) Span(id string) *Span {
	for i := range t.Spans {
		if t.Spans[i].SpanID == id {
			return &t.Spans[i]
		}
	}
	return nil
}

type tracesResponse struct {
	Data   []Trace           `json:"data"`
	Errors []json.RawMessage `json:"errors"`
}

func (j *Jaeger) get(path string, q url.Values) ([]Trace, error) {
	u := j.QueryURL() + path
	if q != nil {
		u += "?" + q.Encode()
	}
	resp, err := httpClient.Get(u)
	if err != nil {
		return nil, fmt.Errorf("query jaeger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(bufio.NewReader(io.LimitReader(resp.Body, 4096)))
		return nil, fmt.Errorf("query jaeger %s: %s: %s", u, resp.Status, b)
	}
	var tr tracesResponse
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		return nil, fmt.Errorf("decode jaeger answer: %w", err)
	}
	if len(tr.Errors) > 0 {
		return tr.Data, fmt.Errorf("jaeger reported errors: %s", tr.Errors[0])
	}
	return tr.Data, nil
}

// Traces returns up to limit traces of a service from the last hour.
func (j *Jaeger) Traces(service string, limit int) ([]Trace, error) {
	return j.get("/api/traces", url.Values{"service": {service}, "limit": {strconv.Itoa(limit)}, "lookback": {"1h"}})
}

// Trace returns one trace by ID (hex); nil when Jaeger does not know it.
func (j *Jaeger) Trace(id string) (*Trace, error) {
	ts, err := j.get("/api/traces/"+id, nil)
	if err != nil || len(ts) == 0 {
		return nil, err
	}
	return &ts[0], nil
}

// WaitTraces polls until cond accepts the service's traces or the timeout
// passes; it returns the last traces seen and whether cond held.
func (j *Jaeger) WaitTraces(service string, limit int, timeout time.Duration, cond func([]Trace) bool) ([]Trace, error) {
	deadline := time.Now().Add(timeout)
	var last []Trace
	var lastErr error
	for {
		ts, err := j.Traces(service, limit)
		if err == nil {
			last = ts
			if cond(ts) {
				return ts, nil
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			if lastErr == nil {
				lastErr = errors.New("condition not met")
			}
			return last, fmt.Errorf("waited %s for traces of %s: %w", timeout, service, lastErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// CountSpans counts spans with an operation name over traces.
func CountSpans(ts []Trace, name string) int {
	n := 0
	for i := range ts {
		n += len(ts[i].ByName(name))
	}
	return n
}
