package otel

import (
	"strings"
	"testing"
)

// clearOTelEnv makes a test independent of the developer's environment.
func clearOTelEnv(t *testing.T) {
	t.Helper()
	for _, v := range []string{"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
		"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_METRICS_EXPORTER",
		"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "K8S_JOB_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT"} {
		t.Setenv(v, "")
	}
	for _, sig := range []string{"", "TRACES_", "METRICS_"} {
		for _, k := range []string{"TIMEOUT", "COMPRESSION", "INSECURE", "CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			t.Setenv("OTEL_EXPORTER_OTLP_"+sig+k, "")
		}
	}
}

// The variables the OTLP exporters read themselves would be ignored when
// malformed (at most a log line once the job runs): each is a problem of
// its own, every one reported at once, for every signal's variant, and
// an endpoint's port must be one a collector can listen on.
func TestOTLPEnvironmentProblemsAtOnce(t *testing.T) {
	clearOTelEnv(t)
	bad := map[string]string{
		"OTEL_EXPORTER_OTLP_TIMEOUT":                    "abc",
		"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT":             "-5",
		"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT":            "10s",
		"OTEL_EXPORTER_OTLP_COMPRESSION":                "zstd",
		"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION":         "GZIP",
		"OTEL_EXPORTER_OTLP_METRICS_COMPRESSION":        "deflate",
		"OTEL_EXPORTER_OTLP_INSECURE":                   "maybe",
		"OTEL_EXPORTER_OTLP_TRACES_INSECURE":            "1",
		"OTEL_EXPORTER_OTLP_METRICS_INSECURE":           "yes",
		"OTEL_EXPORTER_OTLP_CERTIFICATE":                "/nonexistent/ca.pem",
		"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE":         "/nonexistent/traces-ca.pem",
		"OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE":        "/nonexistent/metrics-ca.pem",
		"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE":         "/nonexistent/client.pem",
		"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY":          "/nonexistent/key.pem",
		"OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "/nonexistent/m-client.pem",
		"OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY":         "/nonexistent/m-key.pem",
		"OTEL_EXPORTER_OTLP_METRICS_HEADERS":            "novalue",
		"OTEL_METRICS_EXPORTER":                         "bogus",
		"OTEL_TRACES_EXPORTER":                          "otlp,console",
		"OTEL_METRIC_EXPORT_INTERVAL":                   "1m",
	}
	for k, v := range bad {
		t.Setenv(k, v)
	}
	_, err := resolve(Config{Endpoint: "http://collector:99999"})
	if err == nil {
		t.Fatal("no problem found")
	}
	for _, want := range []string{
		`otlp endpoint "http://collector:99999": bad port`,
		`OTEL_EXPORTER_OTLP_TIMEOUT="abc"`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="-5"`, `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT="10s"`,
		`OTEL_EXPORTER_OTLP_COMPRESSION="zstd": want gzip or none`, `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION="GZIP"`,
		`OTEL_EXPORTER_OTLP_METRICS_COMPRESSION="deflate"`,
		`OTEL_EXPORTER_OTLP_INSECURE="maybe": want true or false`, `OTEL_EXPORTER_OTLP_TRACES_INSECURE="1"`,
		`OTEL_EXPORTER_OTLP_METRICS_INSECURE="yes"`,
		"OTEL_EXPORTER_OTLP_CERTIFICATE: open /nonexistent/ca.pem", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: open",
		"OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE: open",
		"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY must be set together",
		"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY must be set together",
		"OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY: open",
		"OTEL_EXPORTER_OTLP_METRICS_HEADERS", `OTEL_METRICS_EXPORTER="bogus"`, `OTEL_TRACES_EXPORTER="otlp,console"`,
		`OTEL_METRIC_EXPORT_INTERVAL="1m"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems do not say %q:\n%v", want, err)
		}
	}

	// An environment endpoint, for each signal.
	clearOTelEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:70000")
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "collector:0")
	_, err = resolve(Config{})
	for _, want := range []string{`OTEL_EXPORTER_OTLP_ENDPOINT: otlp endpoint "http://collector:70000": bad port`,
		`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: otlp endpoint "collector:0": bad port`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("problems do not say %q: %v", want, err)
		}
	}

	// What the specification allows passes.
	clearOTelEnv(t)
	for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10000", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
		"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_INSECURE": "TRUE",
		"OTEL_EXPORTER_OTLP_METRICS_INSECURE": "false", "OTEL_METRICS_EXPORTER": "otlp,prometheus",
		"OTEL_TRACES_EXPORTER": "none", "OTEL_METRIC_EXPORT_INTERVAL": "60000"} {
		t.Setenv(k, v)
	}
	if _, err := resolve(Config{Endpoint: "http://collector:4318"}); err != nil {
		t.Errorf("valid settings refused: %v", err)
	}
}

// resolveCase is one configuration and environment resolve is given, and
// either a check of the result or the error it must report.
type resolveCase struct {
	name  string
	env   map[string]string
	cfg   Config
	check func(t *testing.T, r *resolved)
	err   string
}

// TestResolve covers the export mode, the endpoint, protocol, TLS and
// headers, and validation.
func TestResolve(t *testing.T) {
	runResolveCases(t, []resolveCase{
		{name: "no endpoint is file mode", check: func(t *testing.T, r *resolved) {
			if r.mode != "file" || r.QueueSize != DefaultQueueSize || r.JobID != "" {
				t.Errorf("mode %q queue %d job %q", r.mode, r.QueueSize, r.JobID)
			}
		}},
		{name: "env endpoint alone turns export on", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			check: func(t *testing.T, r *resolved) {
				if r.mode != "otlp" || r.protocol != ProtocolHTTPProtobuf || r.endpointURL != nil || !r.otlpMetrics {
					t.Errorf("mode %q protocol %q url %v metrics %v", r.mode, r.protocol, r.endpointURL, r.otlpMetrics)
				}
			}},
		{name: "traces endpoint with grpc protocol", env: map[string]string{
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			check: func(t *testing.T, r *resolved) {
				if r.mode != "otlp" || r.protocol != ProtocolGRPC || r.otlpMetrics {
					t.Errorf("mode %q protocol %q metrics %v (a traces-only endpoint must not imply metrics)", r.mode, r.protocol, r.otlpMetrics)
				}
			}},
		{name: "flag protocol wins over env", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			cfg: Config{Endpoint: "http://c:4318", Protocol: ProtocolHTTPProtobuf},
			check: func(t *testing.T, r *resolved) {
				if r.protocol != ProtocolHTTPProtobuf || r.endpointURL.Host != "c:4318" || !*r.insecure {
					t.Errorf("protocol %q url %v insecure %v", r.protocol, r.endpointURL, *r.insecure)
				}
			}},
		{name: "port 4317 without protocol is grpc", cfg: Config{Endpoint: "127.0.0.1:4317"},
			check: func(t *testing.T, r *resolved) {
				if r.protocol != ProtocolGRPC || !*r.insecure {
					t.Errorf("protocol %q insecure %v: loopback host:port should be plaintext grpc", r.protocol, *r.insecure)
				}
			}},
		{name: "remote host:port defaults to tls", cfg: Config{Endpoint: "collector.example:4318"},
			check: func(t *testing.T, r *resolved) {
				if *r.insecure {
					t.Error("remote bare endpoint must default to TLS")
				}
			}},
		{name: "env insecure for bare host", env: map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true"},
			cfg: Config{Endpoint: "collector.example:4317"},
			check: func(t *testing.T, r *resolved) {
				if !*r.insecure {
					t.Error("OTEL_EXPORTER_OTLP_INSECURE=true ignored")
				}
			}},
		{name: "headers merge, flag wins per key", env: map[string]string{
			"OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=x%20y", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2"},
			cfg: Config{Endpoint: "http://c:4318", Headers: map[string]string{"c": "3", "a": "flag"}},
			check: func(t *testing.T, r *resolved) {
				if r.headers["a"] != "flag" || r.headers["b"] != "2" || r.headers["c"] != "3" || len(r.headers) != 3 {
					t.Errorf("headers %v", r.headers)
				}
			}},
		{name: "metrics exporter none", env: map[string]string{"OTEL_METRICS_EXPORTER": "none"}, cfg: Config{Endpoint: "http://c:4318"},
			check: func(t *testing.T, r *resolved) {
				if r.otlpMetrics {
					t.Error("OTEL_METRICS_EXPORTER=none ignored")
				}
			}},
		{name: "every problem at once", cfg: Config{Endpoint: "ftp://x", Protocol: "carrier-pigeon", Rank: -3, PrometheusAddr: "a:b:c"},
			err: "scheme"},
	})
}

// TestResolveJobAndSampling covers the job ID, the Prometheus listener and
// the sampler, which every mode uses.
func TestResolveJobAndSampling(t *testing.T) {
	runResolveCases(t, []resolveCase{
		{name: "job id from torchelastic before slurm", env: map[string]string{"TORCHELASTIC_RUN_ID": "te-1", "SLURM_JOB_ID": "77"},
			check: func(t *testing.T, r *resolved) {
				if r.JobID != "te-1" {
					t.Errorf("job %q", r.JobID)
				}
			}},
		{name: "flag job id wins", env: map[string]string{"SLURM_JOB_ID": "77"}, cfg: Config{JobID: "mine"},
			check: func(t *testing.T, r *resolved) {
				if r.JobID != "mine" {
					t.Errorf("job %q", r.JobID)
				}
			}},
		{name: "k8s job name", env: map[string]string{"K8S_JOB_NAME": "train-llm"},
			check: func(t *testing.T, r *resolved) {
				if r.JobID != "train-llm" {
					t.Errorf("job %q", r.JobID)
				}
			}},
		{name: "prometheus port only is loopback", cfg: Config{PrometheusAddr: ":9464"},
			check: func(t *testing.T, r *resolved) {
				if r.PrometheusAddr != "127.0.0.1:9464" {
					t.Errorf("addr %q", r.PrometheusAddr)
				}
			}},
		{name: "prometheus bare port", cfg: Config{PrometheusAddr: "9464"},
			check: func(t *testing.T, r *resolved) {
				if r.PrometheusAddr != "127.0.0.1:9464" {
					t.Errorf("addr %q", r.PrometheusAddr)
				}
			}},
		{name: "trace id ratio sampling", env: map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
			check: func(t *testing.T, r *resolved) {
				if r.sampleRatio != 0.25 {
					t.Errorf("ratio %v", r.sampleRatio)
				}
			}},
		{name: "default samples everything", check: func(t *testing.T, r *resolved) {
			if r.sampleRatio != 1 {
				t.Errorf("ratio %v", r.sampleRatio)
			}
		}},
	})
}

func runResolveCases(t *testing.T, tests []resolveCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearOTelEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r, err := resolve(tc.cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				// Validation reports every problem, not the first.
				for _, want := range []string{"carrier-pigeon", "rank -3", "prometheus"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not mention %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
}

func TestSignalURLPath(t *testing.T) {
	for base, want := range map[string]string{"": "/v1/traces", "/": "/v1/traces", "/otlp": "/otlp/v1/traces", "/otlp/": "/otlp/v1/traces"} {
		if got := signalURLPath(base, "traces"); got != want {
			t.Errorf("signalURLPath(%q) = %q, want %q", base, got, want)
		}
	}
}

func TestDerivedIDs(t *testing.T) {
	a, b := StepTraceID("job-a", 7), StepTraceID("job-a", 7)
	if a != b || !a.IsValid() {
		t.Fatalf("trace IDs not deterministic: %s %s", a, b)
	}
	if StepTraceID("job-a", 8) == a || StepTraceID("job-b", 7) == a {
		t.Error("trace IDs collide across steps or jobs")
	}
	root := StepRootSpanID("job-a", 7)
	seen := map[string]bool{root.String(): true}
	for rank := range 4 {
		for dev := range 2 {
			id := rankSpanID("job-a", 7, rank, dev).String()
			if seen[id] {
				t.Fatalf("span ID %s repeats", id)
			}
			seen[id] = true
		}
	}
}
