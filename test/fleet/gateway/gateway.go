// Package gateway runs the gaptrace gateway (build/otelcol, the
// OpenTelemetry Collector built from tools/otelcol) with
// deploy/otel-collector/config.yaml on fresh loopback ports, and reads its
// Prometheus endpoints. The end-to-end tests and the fleet load generator
// share it.
//
// The binary comes from $GAPTRACE_OTELCOL (set by `make test`) or
// build/otelcol under the repository root (`make otelcol`).
package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// ErrNoBinary says that no gateway binary was named and none was built.
var ErrNoBinary = testutil.ErrNoTool

// Binary returns the gateway binary: $GAPTRACE_OTELCOL, which must exist,
// or build/otelcol. Neither: an error wrapping ErrNoBinary that says how
// to build it.
func Binary() (string, error) {
	return testutil.ToolBinary("GAPTRACE_OTELCOL", "otelcol", "the Collector Builder on tools/otelcol")
}

// Config is the deployed gateway configuration, deploy/otel-collector/config.yaml.
func Config() (string, error) {
	root, err := testutil.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "otel-collector", "config.yaml"), nil
}

// Options are the environment the configuration reads besides the ports.
type Options struct {
	TracesEndpoint string // host:port of the trace backend's OTLP gRPC receiver
	SamplePercent  float64
	KeepGapMS      int
	DecisionWait   time.Duration
	Env            []string // more KEY=VALUE
}

// Gateway is one running gateway.
type Gateway struct {
	GRPCPort, HTTPPort, PromPort, TelemetryPort int

	cmd      *exec.Cmd
	logs     *testutil.LockedBuffer
	exited   chan struct{}
	stopOnce sync.Once
}

// Start runs the gateway on fresh loopback ports and waits, up to
// timeout, until its receivers accept and both metrics endpoints answer.
func Start(bin string, o Options, timeout time.Duration) (*Gateway, error) {
	cfg, err := Config()
	if err != nil {
		return nil, err
	}
	ports, err := testutil.FreePorts(4)
	if err != nil {
		return nil, err
	}
	g := &Gateway{GRPCPort: ports[0], HTTPPort: ports[1], PromPort: ports[2], TelemetryPort: ports[3],
		logs: &testutil.LockedBuffer{Limit: 4 << 20}, exited: make(chan struct{})}
	wait := o.DecisionWait
	if wait == 0 {
		wait = 2 * time.Second
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Env = append(os.Environ(),
		"TRACES_ENDPOINT="+o.TracesEndpoint,
		"OTLP_GRPC_ADDR=127.0.0.1:"+strconv.Itoa(g.GRPCPort),
		"OTLP_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(g.HTTPPort),
		"PROMETHEUS_ADDR=127.0.0.1:"+strconv.Itoa(g.PromPort),
		"TELEMETRY_ADDR_HOST=127.0.0.1",
		"TELEMETRY_PORT="+strconv.Itoa(g.TelemetryPort),
		"SAMPLE_PERCENT="+strconv.FormatFloat(o.SamplePercent, 'f', -1, 64),
		"KEEP_GAP_MS="+strconv.Itoa(o.KeepGapMS),
		"DECISION_WAIT="+wait.String(),
	)
	cmd.Env = append(cmd.Env, o.Env...)
	cmd.Stdout, cmd.Stderr = g.logs, g.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start gateway %s: %w", bin, err)
	}
	g.cmd = cmd
	go func() { _ = cmd.Wait(); close(g.exited) }()
	deadline := time.Now().Add(timeout)
	for !g.ready() {
		select {
		case <-g.exited:
			return nil, fmt.Errorf("gateway exited during start: %v\n%s", cmd.ProcessState, g.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			g.Stop()
			return nil, fmt.Errorf("gateway not ready after %s\n%s", timeout, g.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return g, nil
}

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func (g *Gateway) ready() bool {
	for _, p := range []int{g.GRPCPort, g.HTTPPort} {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p), time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	for _, u := range []string{g.PromURL(), g.TelemetryURL()} {
		if _, err := scrape(u); err != nil {
			return false
		}
	}
	return true
}

// Stop ends the gateway (SIGTERM, then SIGKILL after 10 s) and waits.
func (g *Gateway) Stop() {
	g.stopOnce.Do(func() {
		if g.cmd == nil || g.cmd.Process == nil {
			return
		}
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.exited:
		case <-time.After(10 * time.Second):
			_ = g.cmd.Process.Kill()
			<-g.exited
		}
	})
}

// PID is the gateway's process ID.
func (g *Gateway) PID() int { return g.cmd.Process.Pid }

// Logs returns what the gateway printed so far.
func (g *Gateway) Logs() string { return g.logs.String() }

// OTLPGRPCEndpoint is host:port of the OTLP gRPC receiver.
func (g *Gateway) OTLPGRPCEndpoint() string { return "127.0.0.1:" + strconv.Itoa(g.GRPCPort) }

// PromURL is the Prometheus exporter (sidecar and span metrics).
func (g *Gateway) PromURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(g.PromPort) + "/metrics"
}

// TelemetryURL is the gateway's own metrics (otelcol_*).
func (g *Gateway) TelemetryURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(g.TelemetryPort) + "/metrics"
}

// Sample is one series of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape reads a Prometheus text endpoint.
func Scrape(url string) ([]Sample, error) { return scrape(url) }

func scrape(url string) ([]Sample, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return ParseText(resp.Body)
}

// ParseText parses the Prometheus text format: name{l="v",...} value.
func ParseText(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseLine(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i < 0 {
		return s, errors.New("no value")
	} else {
		s.Name, rest = line[:i], line[i:]
	}
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for !strings.HasPrefix(rest, "}") {
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return s, errors.New("bad label")
			}
			name := strings.TrimLeft(rest[:eq], ",")
			rest = rest[eq+2:]
			var val strings.Builder
			i := 0
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
					switch rest[i] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[i])
					}
					continue
				}
				val.WriteByte(rest[i])
			}
			if i == len(rest) {
				return s, errors.New("unterminated label value")
			}
			s.Labels[name] = val.String()
			rest = strings.TrimPrefix(rest[i+1:], ",")
		}
		rest = rest[1:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, errors.New("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
}

// Sum adds the values of the series named name whose labels include every
// pair of match.
func Sum(samples []Sample, name string, match map[string]string) (float64, int) {
	total, n := 0.0, 0
next:
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		for k, v := range match {
			if s.Labels[k] != v {
				continue next
			}
		}
		total += s.Value
		n++
	}
	return total, n
}
