package otel

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultServiceName is the service.name used when neither the flag nor
// OTEL_SERVICE_NAME sets one.
const DefaultServiceName = "gaptrace"

// Protocols accepted in Config.Protocol and OTEL_EXPORTER_OTLP_PROTOCOL.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// Defaults for the bounded parts of the pipeline.
const (
	DefaultQueueSize    = 4096
	DefaultBatchSize    = 512
	DefaultBatchTimeout = 2 * time.Second
	// MaxOpsPerGap bounds host-operation spans under one gpu.idle span; the
	// rest are counted in gpu.gap.ops.omitted.
	MaxOpsPerGap = 32
)

// Environment variables read to find a job ID when Config.JobID is empty, in
// order. K8S_JOB_NAME is meant to be filled through the downward API from
// the pod label batch.kubernetes.io/job-name.
var jobIDEnv = []string{"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "K8S_JOB_NAME"}

// Environment variables read for Kubernetes resource attributes; the
// deployment manifests set them through the downward API. The first set
// variable of each list wins.
var k8sEnv = []struct {
	key  string
	vars []string
}{
	{"k8s.pod.name", []string{"K8S_POD_NAME", "POD_NAME"}},
	{"k8s.pod.uid", []string{"K8S_POD_UID", "POD_UID"}},
	{"k8s.namespace.name", []string{"K8S_NAMESPACE_NAME", "K8S_NAMESPACE", "POD_NAMESPACE"}},
	{"k8s.node.name", []string{"K8S_NODE_NAME", "NODE_NAME"}},
	{"k8s.container.name", []string{"K8S_CONTAINER_NAME"}},
	{"k8s.job.name", []string{"K8S_JOB_NAME"}},
}

// ResourceInfo describes the traced target; it becomes resource attributes.
type ResourceInfo struct {
	TargetPID     int
	TargetCmdline []string
	GPUName       string
	GPUUUID       string
	Host          string // "" → os.Hostname
}

// Config configures an Exporter. Zero values mean "default or environment".
type Config struct {
	// ServiceName: default "gaptrace"; OTEL_SERVICE_NAME wins over the
	// default, a non-empty value here wins over the environment.
	ServiceName string
	// Endpoint is the OTLP endpoint, a URL ("http://collector:4318",
	// "https://…") or host:port. "" and no OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
	// selects file mode.
	Endpoint string
	// Protocol is "grpc" or "http/protobuf"; "" → OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL,
	// else grpc for an endpoint on port 4317, else http/protobuf.
	Protocol string
	// Headers are merged over OTEL_EXPORTER_OTLP_(TRACES_)HEADERS (these win per key).
	Headers map[string]string
	// Insecure: nil → the endpoint's scheme, OTEL_EXPORTER_OTLP_(TRACES_)INSECURE,
	// or plaintext for a loopback host:port.
	Insecure *bool
	// TLS files; "" → the exporters read OTEL_EXPORTER_OTLP_CERTIFICATE,
	// _CLIENT_CERTIFICATE and _CLIENT_KEY themselves.
	CAFile, CertFile, KeyFile string
	// SpansFile is the JSON-lines spans file in file mode; "" writes no spans.
	SpansFile string
	// SpansMaxSize caps the spans file (0: no cap); beyond it the file is
	// rotated, keeping SpansKeep older files (path.1, path.2, …).
	SpansMaxSize int64
	SpansKeep    int
	// PrometheusAddr: "" off; ":9464" → 127.0.0.1:9464.
	PrometheusAddr string
	// JobID: "" → TORCHELASTIC_RUN_ID, SLURM_JOB_ID, K8S_JOB_NAME; still ""
	// → random trace IDs, one trace per step per process.
	JobID string
	// Rank of this process in the job; -1 unknown.
	Rank int
	// QueueSize bounds the finished spans waiting for export (default 4096).
	QueueSize int
	// BatchSize and BatchTimeout shape exports (defaults 512, 2s).
	BatchSize    int
	BatchTimeout time.Duration
	// MetricsInterval is the OTLP metrics push period (default
	// OTEL_METRIC_EXPORT_INTERVAL or 60s).
	MetricsInterval time.Duration
	// DeviceUUID names GPU index i for the gpu_uuid metric label; nil or
	// "" leaves the label off.
	DeviceUUID func(i int) string
	Resource   ResourceInfo
	Logger     *slog.Logger
}

// resolved is Config after defaults and the environment were applied.
type resolved struct {
	Config
	mode        string // "otlp" or "file"
	protocol    string
	endpointURL *url.URL // nil: let the exporters read the environment
	headers     map[string]string
	insecure    *bool
	tlsConfig   *tls.Config
	otlpMetrics bool
	otlpTraces  bool    // false: OTEL_TRACES_EXPORTER names no otlp (none), spans go only to the spans file
	sampleRatio float64 // fraction of steps (traces) kept, from OTEL_TRACES_SAMPLER
}

func envFirst(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}

// JobID is the job ID spans and metrics carry: cfg, else the first of
// TORCHELASTIC_RUN_ID, SLURM_JOB_ID and K8S_JOB_NAME set in gaptrace's
// environment ("" when none is).
func JobID(cfg string) string { return resolveJobID(cfg) }

// resolveJobID returns the job ID from the config or the environment.
func resolveJobID(cfg string) string {
	if cfg != "" {
		return cfg
	}
	return envFirst(jobIDEnv...)
}

// resolve applies defaults and the environment and validates, returning
// every problem at once.
func resolve(cfg Config) (*resolved, error) {
	r := &resolved{Config: cfg}
	errs := r.resolveLocal()
	envEndpoint := envFirst("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if r.Endpoint == "" && envEndpoint == "" {
		r.mode = "file"
		return r, errors.Join(errs...)
	}
	r.mode = "otlp"
	errs = append(errs, otlpEnvProblems(r.Endpoint != "")...)
	errs = append(errs, r.resolveEndpoint(envEndpoint)...)
	errs = append(errs, r.resolveHeaders()...)
	errs = append(errs, r.resolveTLS()...)
	r.resolveSignals()
	return r, errors.Join(errs...)
}

// resolveLocal applies the defaults and reads what every mode uses: the
// queue, the job's identity, the sampler and the Prometheus listener.
func (r *resolved) resolveLocal() []error {
	var errs []error
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	r.Logger = r.Logger.With("component", "otel")
	if r.QueueSize == 0 {
		r.QueueSize = DefaultQueueSize
	}
	if r.BatchSize == 0 {
		r.BatchSize = DefaultBatchSize
	}
	if r.BatchSize > r.QueueSize {
		r.BatchSize = r.QueueSize
	}
	if r.BatchTimeout == 0 {
		r.BatchTimeout = DefaultBatchTimeout
	}
	if r.QueueSize < 0 || r.BatchSize < 0 || r.BatchTimeout < 0 {
		errs = append(errs, errors.New("queue size, batch size and batch timeout must not be negative"))
	}
	if r.Rank < -1 {
		errs = append(errs, fmt.Errorf("rank %d: must be -1 (unknown) or a rank", r.Rank))
	}
	r.JobID = resolveJobID(r.JobID)
	ratio, err := sampleRatio(os.Getenv("OTEL_TRACES_SAMPLER"), os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		errs = append(errs, err)
	}
	r.sampleRatio = ratio

	if r.PrometheusAddr != "" {
		addr, err := promAddr(r.PrometheusAddr)
		if err != nil {
			errs = append(errs, err)
		}
		r.PrometheusAddr = addr
	}

	errs = append(errs, exporterEnvProblems()...)
	return errs
}

// resolveEndpoint picks the OTLP protocol and parses the endpoint, the
// flag's before the environment's.
func (r *resolved) resolveEndpoint(envEndpoint string) []error {
	var errs []error
	r.protocol = r.Protocol
	if r.protocol == "" {
		r.protocol = envFirst("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	ep := r.Endpoint
	if ep == "" {
		ep = envEndpoint
	}
	u, err := parseEndpoint(ep)
	if err != nil && r.Endpoint != "" {
		errs = append(errs, err) // an environment endpoint's is said by otlpEnvProblems
	}
	if r.protocol == "" {
		// The specification's default is http/protobuf, but an endpoint on
		// the well-known gRPC port is almost always meant as gRPC.
		r.protocol = ProtocolHTTPProtobuf
		if u != nil && u.Port() == "4317" {
			r.protocol = ProtocolGRPC
		}
	}
	switch r.protocol {
	case ProtocolGRPC, ProtocolHTTPProtobuf:
	case "http/json":
		errs = append(errs, errors.New("otlp protocol http/json is not supported, use grpc or http/protobuf"))
	default:
		errs = append(errs, fmt.Errorf("otlp protocol %q: want grpc or http/protobuf", r.protocol))
	}
	if r.Endpoint != "" {
		r.endpointURL = u
	}
	return errs
}

// resolveHeaders merges the environment's headers with the flags'.
func (r *resolved) resolveHeaders() []error {
	var errs []error
	// Passing headers to the exporter replaces the environment's, so merge.
	r.headers = map[string]string{}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		h, err := parseHeaders(os.Getenv(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v, err))
		}
		for k, val := range h {
			r.headers[k] = val
		}
	}
	for k, v := range r.Headers {
		r.headers[k] = v
	}
	return errs
}

// resolveTLS decides between plaintext and TLS and loads the TLS files.
func (r *resolved) resolveTLS() []error {
	var errs []error
	r.insecure = r.Insecure
	if r.insecure == nil && r.endpointURL != nil {
		// A flag endpoint: a URL's scheme decides; a bare loopback host:port
		// is plaintext (TLS to loopback is rare), other bare hosts honour
		// the environment and default to TLS.
		u := r.endpointURL
		if u.Scheme == "http" {
			r.insecure = ptr(true)
		} else if u.Scheme == "https" {
			r.insecure = ptr(false)
		} else if v := envFirst("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"); v != "" {
			b, _ := parseEnvBool(v) // a bad value is said by otlpEnvProblems
			r.insecure = ptr(b)
		} else {
			r.insecure = ptr(isLoopbackHost(u.Hostname()))
		}
	}
	if r.CAFile != "" || r.CertFile != "" || r.KeyFile != "" {
		tc, err := loadTLS(r.CAFile, r.CertFile, r.KeyFile)
		if err != nil {
			errs = append(errs, err)
		}
		r.tlsConfig = tc
		if r.insecure != nil && *r.insecure && tc != nil {
			errs = append(errs, errors.New("tls files given for an insecure (plaintext) otlp endpoint"))
		}
	}
	return errs
}

// resolveSignals decides which signals go over OTLP.
func (r *resolved) resolveSignals() {
	// Metrics follow the traces' endpoint unless OTEL_METRICS_EXPORTER says
	// otherwise; a traces-only endpoint variable does not imply a metrics
	// endpoint (the exporter would fall back to localhost).
	// OTEL_TRACES_EXPORTER=none likewise keeps spans off OTLP, so one
	// endpoint can take metrics only, as a traces-only backend (Jaeger,
	// Tempo) takes spans only with OTEL_METRICS_EXPORTER=none.
	me := strings.ToLower(envFirst("OTEL_METRICS_EXPORTER"))
	r.otlpMetrics = (me == "" || strings.Contains(me, "otlp")) &&
		(r.Endpoint != "" || envFirst("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "")
	te := strings.ToLower(envFirst("OTEL_TRACES_EXPORTER"))
	r.otlpTraces = te == "" || strings.Contains(te, "otlp")
}

func ptr[T any](v T) *T { return &v }

// parseEndpoint accepts a URL or a bare host:port and returns a URL whose
// Scheme is "" for the bare form.
func parseEndpoint(ep string) (*url.URL, error) {
	shown := RedactURL(ep) // errors are printed: no credentials in them
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return nil, fmt.Errorf("otlp endpoint %q: not a valid URL", shown)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return nil, fmt.Errorf("otlp endpoint %q: scheme must be http or https", shown)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("otlp endpoint %q: no host", shown)
		}
		if p := u.Port(); p != "" && !validPort(p) {
			return nil, fmt.Errorf("otlp endpoint %q: bad port (want 1 to 65535)", shown)
		}
		return u, nil
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return nil, fmt.Errorf("otlp endpoint %q: want a URL or host:port", shown)
	}
	if !validPort(port) {
		return nil, fmt.Errorf("otlp endpoint %q: bad port (want 1 to 65535)", shown)
	}
	return &url.URL{Host: net.JoinHostPort(host, port)}, nil
}

// validPort: a port a collector can listen on. url.Parse checks only that
// a URL's port is digits, so http://host:99999 parses.
func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return err == nil && n > 0
}

// exporterEnvProblems checks the variables that choose exporters. An
// unknown value would otherwise select nothing, silently.
func exporterEnvProblems() []error {
	var errs []error
	for _, v := range []struct {
		name    string
		allowed []string
		what    string
	}{
		{"OTEL_TRACES_EXPORTER", []string{"otlp", "none"}, "gaptrace exports spans over otlp (or to the spans file)"},
		{"OTEL_METRICS_EXPORTER", []string{"otlp", "prometheus", "none"}, "gaptrace exports metrics over otlp, or serves them for Prometheus at --prometheus"},
	} {
		val := envFirst(v.name)
		if val == "" {
			continue
		}
		for _, e := range strings.Split(val, ",") {
			if !slices.Contains(v.allowed, strings.ToLower(strings.TrimSpace(e))) {
				errs = append(errs, fmt.Errorf("%s=%q: %s: want %s", v.name, val, v.what, strings.Join(v.allowed, ", ")))
				break
			}
		}
	}
	return errs
}

// otlpEnvProblems checks the standard variables the OTLP exporters read
// themselves, for every signal (OTEL_EXPORTER_OTLP_*, _TRACES_*,
// _METRICS_*). The exporters ignore a malformed value (at most a log line
// once the job runs): a timeout of "abc", a compression they do not know
// (gzip and none are the specification's), an INSECURE that is not
// true or false (read as false), a certificate file that cannot be read.
// Endpoints in the environment are checked unless flagEndpoint (which
// replaces them) is set.
func otlpEnvProblems(flagEndpoint bool) []error {
	var errs []error
	bad := func(name, v, want string) {
		errs = append(errs, fmt.Errorf("%s=%q: %s", name, v, want))
	}
	for _, sig := range []string{"", "TRACES_", "METRICS_"} {
		name := func(k string) string { return "OTEL_EXPORTER_OTLP_" + sig + k }
		if v := envFirst(name("ENDPOINT")); v != "" && !flagEndpoint {
			if _, err := parseEndpoint(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name("ENDPOINT"), err))
			}
		}
		if v := envFirst(name("TIMEOUT")); v != "" {
			if ms, err := strconv.Atoi(v); err != nil || ms <= 0 {
				bad(name("TIMEOUT"), v, "want a positive number of milliseconds (e.g. 10000)")
			}
		}
		if v := envFirst(name("COMPRESSION")); v != "" && v != "gzip" && v != "none" {
			bad(name("COMPRESSION"), v, "want gzip or none")
		}
		if v := envFirst(name("INSECURE")); v != "" {
			if _, err := parseEnvBool(v); err != nil {
				bad(name("INSECURE"), v, err.Error())
			}
		}
		if v := envFirst(name("CERTIFICATE")); v != "" {
			if pem, err := os.ReadFile(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name("CERTIFICATE"), err))
			} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				bad(name("CERTIFICATE"), v, "no PEM certificate in the file")
			}
		}
		cert, key := envFirst(name("CLIENT_CERTIFICATE")), envFirst(name("CLIENT_KEY"))
		switch {
		case (cert == "") != (key == ""):
			errs = append(errs, fmt.Errorf("%s and %s must be set together", name("CLIENT_CERTIFICATE"), name("CLIENT_KEY")))
		case cert != "":
			if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
				errs = append(errs, fmt.Errorf("%s, %s: %w", name("CLIENT_CERTIFICATE"), name("CLIENT_KEY"), err))
			}
		}
	}
	// The base and traces headers are parsed where they are merged.
	if _, err := parseHeaders(os.Getenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS")); err != nil {
		errs = append(errs, fmt.Errorf("OTEL_EXPORTER_OTLP_METRICS_HEADERS: %w", err))
	}
	for _, name := range []string{"OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT"} {
		if v := envFirst(name); v != "" {
			if ms, err := strconv.Atoi(v); err != nil || ms <= 0 {
				bad(name, v, "want a positive number of milliseconds")
			}
		}
	}
	return errs
}

// parseEnvBool reads a boolean as the OTLP exporters do (true or false,
// any case), refusing what they would silently read as false.
func parseEnvBool(v string) (bool, error) {
	switch {
	case strings.EqualFold(v, "true"):
		return true, nil
	case strings.EqualFold(v, "false"):
		return false, nil
	}
	return false, errors.New("want true or false")
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// signalURLPath returns the HTTP path for one signal under a base endpoint
// path, as the specification does for OTEL_EXPORTER_OTLP_ENDPOINT.
func signalURLPath(base, signal string) string {
	return strings.TrimRight(base, "/") + "/v1/" + signal
}

// parseHeaders parses the W3C-baggage-like "k1=v1,k2=v2" form of
// OTEL_EXPORTER_OTLP_HEADERS; values are URL-decoded.
func parseHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	var errs []error
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			errs = append(errs, fmt.Errorf("header %q: want key=value", strings.TrimSpace(kv)))
			continue
		}
		dv, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("header %q: %w", k, err))
			continue
		}
		out[k] = dv
	}
	return out, errors.Join(errs...)
}

// promAddr puts a bare ":port" on loopback: metrics are not exposed to the
// network unless the user names an interface.
func promAddr(a string) (string, error) {
	if !strings.Contains(a, ":") {
		a = ":" + a
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("prometheus address %q: %w", a, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("prometheus address %q: bad port", a)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

func loadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read otlp ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("otlp ca file %s: no certificates", caFile)
		}
		tc.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("otlp client certificate and key must be given together")
	}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load otlp client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}

// sampleRatio maps the standard sampler variables onto the one sampling
// gaptrace can do consistently: by trace ID. Every span of a step shares
// the step's trace ID (across ranks too, in job mode), so a trace-ID
// decision keeps or drops whole steps on every rank alike; parent-based
// variants therefore mean the same here. Metrics are never sampled.
func sampleRatio(sampler, arg string) (float64, error) {
	switch strings.ToLower(strings.TrimSpace(sampler)) {
	case "", "always_on", "parentbased_always_on":
		return 1, nil
	case "always_off", "parentbased_always_off":
		return 0, nil
	case "traceidratio", "parentbased_traceidratio":
		if strings.TrimSpace(arg) == "" {
			return 1, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(arg), 64)
		if err != nil || f < 0 || f > 1 {
			return 1, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio in [0, 1]", arg)
		}
		return f, nil
	default:
		return 1, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: gaptrace supports always_on, always_off and (parentbased_)traceidratio", sampler)
	}
}
