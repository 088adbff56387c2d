package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// The chart ships its own copy of the gateway configuration (a chart
// reads no file outside itself); it must be the deployed one.
func TestGatewayChartConfigIsTheDeployedOne(t *testing.T) {
	want, err := os.ReadFile("otel-collector/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("helm/gaptrace/files/gateway-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("helm/gaptrace/files/gateway-config.yaml differs from otel-collector/config.yaml: copy it again")
	}
}

// gatewayConfig is the part of the collector configuration the tests read.
type gatewayConfig struct {
	Receivers  map[string]any `yaml:"receivers"`
	Processors struct {
		TailSampling struct {
			Policies []struct {
				Name string `yaml:"name"`
				Type string `yaml:"type"`
				OTTL struct {
					Span []string `yaml:"span"`
				} `yaml:"ottl_condition"`
				StatusCode struct {
					Codes []string `yaml:"status_codes"`
				} `yaml:"status_code"`
				Probabilistic struct {
					Percent string `yaml:"sampling_percentage"`
				} `yaml:"probabilistic"`
			} `yaml:"policies"`
		} `yaml:"tail_sampling"`
	} `yaml:"processors"`
	Connectors struct {
		SpanMetrics struct {
			Namespace string `yaml:"namespace"`
			Histogram struct {
				Unit string `yaml:"unit"`
			} `yaml:"histogram"`
		} `yaml:"spanmetrics"`
	} `yaml:"connectors"`
	Exporters map[string]map[string]any `yaml:"exporters"`
	Service   struct {
		Pipelines map[string]struct {
			Receivers  []string `yaml:"receivers"`
			Processors []string `yaml:"processors"`
			Exporters  []string `yaml:"exporters"`
		} `yaml:"pipelines"`
	} `yaml:"service"`
}

func loadGatewayConfig(t *testing.T) gatewayConfig {
	t.Helper()
	b, err := os.ReadFile("otel-collector/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c gatewayConfig
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("otel-collector/config.yaml: %v", err)
	}
	return c
}

// The sampling contract: long gaps, hangs and errors always kept, the rest
// at a rate from the environment; metrics never sampled.
func TestGatewaySamplingPolicies(t *testing.T) {
	c := loadGatewayConfig(t)
	var long, hang, errs, rate bool
	for _, p := range c.Processors.TailSampling.Policies {
		cond := strings.Join(p.OTTL.Span, " ")
		switch p.Type {
		case "ottl_condition":
			long = long || strings.Contains(cond, `name == "gpu.idle"`) && strings.Contains(cond, `attributes["gpu.gap.duration_ms"] >= ${env:KEEP_GAP_MS`)
			hang = hang || strings.Contains(cond, `name == "gpu.hang"`)
		case "status_code":
			errs = errs || slices.Contains(p.StatusCode.Codes, "ERROR")
		case "probabilistic":
			rate = rate || strings.HasPrefix(p.Probabilistic.Percent, "${env:SAMPLE_PERCENT")
		}
	}
	for what, ok := range map[string]bool{"long gap": long, "hang": hang, "error": errs, "ordinary steps at $SAMPLE_PERCENT": rate} {
		if !ok {
			t.Errorf("tail_sampling keeps no %s", what)
		}
	}
	for name, p := range c.Service.Pipelines {
		sampled := slices.Contains(p.Processors, "tail_sampling")
		if strings.HasPrefix(name, "metrics") && sampled {
			t.Errorf("pipeline %s samples metrics", name)
		}
		if slices.Contains(p.Exporters, "spanmetrics") && sampled {
			t.Errorf("pipeline %s feeds span metrics after sampling: they would count kept spans only", name)
		}
		if sampled && !slices.Contains(p.Exporters, "otlp/traces") {
			t.Errorf("sampled pipeline %s does not reach the trace backend", name)
		}
	}
	if m := c.Service.Pipelines["metrics"]; !slices.Contains(m.Receivers, "otlp") || !slices.Contains(m.Receivers, "spanmetrics") ||
		!slices.Contains(m.Exporters, "prometheus") {
		t.Errorf("metrics pipeline %+v: want the sidecars' (otlp) and span metrics out to prometheus", m)
	}
	if ep, _ := c.Exporters["prometheus"]["endpoint"].(string); !strings.HasSuffix(ep, ":8889}") {
		t.Errorf("prometheus exporter endpoint %q, want :8889 by default", ep)
	}
}

// spanMetricNames are the series the span metrics connector exports
// through the Prometheus exporter, from its configuration.
func spanMetricNames(t *testing.T) map[string]bool {
	c := loadGatewayConfig(t)
	sm := c.Connectors.SpanMetrics
	if sm.Namespace == "" || sm.Histogram.Unit != "s" {
		t.Fatalf("spanmetrics namespace %q unit %q", sm.Namespace, sm.Histogram.Unit)
	}
	ns := strings.ReplaceAll(sm.Namespace, ".", "_")
	names := map[string]bool{ns + "_calls_total": true}
	for _, s := range []string{"", "_bucket", "_sum", "_count"} {
		names[ns+"_duration_seconds"+s] = true
	}
	return names
}

// processWide are the sidecar counters recorded without the metric labels
// (no job, rank or GPU): a job's view can only show them for all jobs.
var processWide = map[string]bool{"gaptrace_events_dropped_total": true, "gaptrace_spans_dropped_total": true,
	"gaptrace_gaps_dropped_total": true}

func TestGrafanaJobDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/gaptrace-job.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Query      json.RawMessage `json:"query"`
				Datasource datasource      `json:"datasource"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/gaptrace-job.json: %v", err)
	}
	if d.UID == "" || d.UID == "gaptrace" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard uid %q title %q, %d panels: want its own uid", d.UID, d.Title, len(d.Panels))
	}
	known := exportedMetrics(t)
	for m := range spanMetricNames(t) {
		known[m] = true
	}
	var dsVar, jobVar bool
	for _, v := range d.Templating.List {
		switch v.Name {
		case "datasource":
			dsVar = v.Type == "datasource" && string(v.Query) == `"prometheus"`
		case "job":
			var q struct {
				Query string `json:"query"`
			}
			_ = json.Unmarshal(v.Query, &q)
			jobVar = v.Datasource.UID == "${datasource}" && q.Query == "label_values(gaptrace_steps_total, gaptrace_job_id)"
		}
	}
	if !dsVar || !jobVar {
		t.Errorf("variables: datasource (type datasource, prometheus) %v, job (label_values of gaptrace_job_id) %v", dsVar, jobVar)
	}
	var byCause, byNode, stepPerRank, idlePerRank, straggler bool
	for _, p := range allPanels(d.Panels) {
		if p.Type == "row" {
			continue
		}
		where := "panel " + p.Title
		if p.Datasource != (datasource{Type: "prometheus", UID: "${datasource}"}) {
			t.Errorf("%s: datasource %+v, want prometheus ${datasource}", where, p.Datasource)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != (datasource{Type: "prometheus", UID: "${datasource}"}) {
				t.Errorf("%s: target datasource %+v", where, tg.Datasource)
			}
			ms := promQLMetrics(tg.Expr)
			if len(ms) == 0 {
				t.Errorf("%s: query %q names no metric", where, tg.Expr)
			}
			for _, m := range ms {
				if !known[m] {
					t.Errorf("%s: %s is neither a gaptrace metric nor a span metric of the gateway", where, m)
				}
			}
			// Every selector is narrowed to the chosen job, but the
			// sidecars' process-wide loss counters, which carry no job.
			for _, sel := range regexp.MustCompile(`gaptrace_\w+(\{[^}]*\})?`).FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(sel[1], `gaptrace_job_id=~"$job"`) && !processWide[strings.TrimSuffix(sel[0], sel[1])] {
					t.Errorf("%s: %s is not narrowed to the job", where, sel[0])
				}
			}
			e := tg.Expr
			byCause = byCause || strings.Contains(e, "sum by (cause)") && strings.Contains(e, "gaptrace_gpu_idle_seconds_total")
			byNode = byNode || strings.Contains(e, "host_name") && strings.Contains(e, `span_name="gpu.idle"`)
			stepPerRank = stepPerRank || strings.Contains(e, "by (rank)") && strings.Contains(e, "gaptrace_step_duration_seconds")
			idlePerRank = idlePerRank || strings.Contains(e, "by (rank)") && strings.Contains(e, "gaptrace_gpu_idle_seconds_total")
			straggler = straggler || strings.Contains(e, `cause="comm"`) && strings.Contains(e, "scalar(max(")
		}
	}
	for what, ok := range map[string]bool{"idle by cause": byCause, "idle by node": byNode, "step time per rank": stepPerRank,
		"idle per rank": idlePerRank, "peer-relative straggler": straggler} {
		if !ok {
			t.Errorf("job dashboard has no %s panel", what)
		}
	}
	// Provisioned beside the node dashboard.
	c := loadCompose(t, "tempo/compose.yaml")
	if !slices.Contains(c.Services["grafana"].Volumes, "../grafana/gaptrace-job.json:/var/lib/grafana/dashboards/gaptrace-job.json:ro") {
		t.Errorf("tempo/compose.yaml does not mount the job dashboard where dashboards.yaml loads from")
	}
	prov, err := os.ReadFile("grafana/dashboards.yaml")
	if err != nil || !strings.Contains(string(prov), "gaptrace-job.json") {
		t.Errorf("grafana/dashboards.yaml does not name the job dashboard: %v", err)
	}
}

// gatewayObjects renders the chart and decodes each object by kind and name.
func gatewayObjects(t *testing.T, sets ...string) map[string][]byte {
	t.Helper()
	out, stderr, ok := render(t, sets...)
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	docs := map[string][]byte{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(out, -1) {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rendered document is not YAML: %v\n%s", err, doc)
		}
		if meta.Kind != "" {
			docs[meta.Kind+"/"+meta.Metadata.Name] = []byte(doc)
		}
	}
	return docs
}

func TestHelmGateway(t *testing.T) {
	docs := gatewayObjects(t, "gateway.enabled=true", "gateway.tracesEndpoint=tempo.observability.svc:4317",
		"gateway.samplePercent=5", "gateway.keepGapMS=250")
	var dep appsv1.Deployment
	var svc corev1.Service
	var cm corev1.ConfigMap
	var ds appsv1.DaemonSet
	for obj, into := range map[string]any{"Deployment/gt-gateway": &dep, "Service/gt-gateway": &svc,
		"ConfigMap/gt-gateway": &cm, "DaemonSet/gt": &ds} {
		if err := sigsyaml.UnmarshalStrict(docs[obj], into); err != nil {
			t.Fatalf("%s: %v\n%s", obj, err, docs[obj])
		}
	}
	want, _ := os.ReadFile("otel-collector/config.yaml")
	if cm.Data["config.yaml"] != string(want) {
		t.Error("the gateway ConfigMap does not hold otel-collector/config.yaml")
	}
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 1 || *dep.Spec.Replicas != 1 {
		t.Fatalf("%d containers, replicas %v", len(spec.Containers), dep.Spec.Replicas)
	}
	c := spec.Containers[0]
	if !labelsMatch(dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) || !labelsMatch(svc.Spec.Selector, dep.Spec.Template.Labels) {
		t.Errorf("selectors %v / %v do not match the gateway pod %v", dep.Spec.Selector.MatchLabels, svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	if labelsMatch(svc.Spec.Selector, ds.Spec.Template.Labels) {
		t.Error("the gateway Service also selects the sidecars")
	}
	if len(spec.Volumes) != 1 || spec.Volumes[0].ConfigMap == nil || spec.Volumes[0].ConfigMap.Name != cm.Name ||
		len(c.VolumeMounts) != 1 || !slices.Contains(c.Args, "--config="+c.VolumeMounts[0].MountPath+"/config.yaml") {
		t.Errorf("the container does not run the ConfigMap's config: args %v mounts %+v volumes %+v", c.Args, c.VolumeMounts, spec.Volumes)
	}
	for env, want := range map[string]string{"TRACES_ENDPOINT": "tempo.observability.svc:4317", "SAMPLE_PERCENT": "5", "KEEP_GAP_MS": "250"} {
		if e := envVar(c.Env, env); e == nil || e.Value != want {
			t.Errorf("gateway env %s = %+v, want %q", env, e, want)
		}
	}
	for _, name := range []string{"otlp-grpc", "otlp-http", "metrics"} {
		i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == name })
		if i < 0 || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
			return p.Name == svc.Spec.Ports[i].TargetPort.StrVal
		}) {
			t.Errorf("Service port %s does not reach a container port (%+v)", name, c.Ports)
		}
	}
	if i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "otlp-grpc" }); i < 0 || c.Ports[i].ContainerPort != 4317 {
		t.Errorf("container ports %+v: want otlp-grpc 4317", c.Ports)
	}
	// The sidecars send to the gateway's Service.
	sc := ds.Spec.Template.Spec.Containers[0]
	if e := envVar(sc.Env, "OTEL_EXPORTER_OTLP_ENDPOINT"); e == nil || e.Value != "http://"+svc.Name+"."+svc.Namespace+".svc:4317" {
		t.Errorf("sidecar OTEL_EXPORTER_OTLP_ENDPOINT %+v, want the gateway Service %s.%s", e, svc.Name, svc.Namespace)
	}

	// Off by default: no gateway, the sidecars send to otlp.endpoint.
	off := gatewayObjects(t)
	for k := range off {
		if strings.Contains(k, "gateway") {
			t.Errorf("gateway.enabled=false rendered %s", k)
		}
	}
	var ds0 appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(off["DaemonSet/gt"], &ds0); err != nil {
		t.Fatal(err)
	}
	if e := envVar(ds0.Spec.Template.Spec.Containers[0].Env, "OTEL_EXPORTER_OTLP_ENDPOINT"); e == nil || e.Value != "http://otel-collector.observability.svc:4317" {
		t.Errorf("without the gateway, OTEL_EXPORTER_OTLP_ENDPOINT %+v, want otlp.endpoint", e)
	}

	for _, tc := range []struct {
		sets []string
		msg  string
	}{
		{[]string{"gateway.enabled=true"}, "gateway.tracesEndpoint: the trace backend's OTLP gRPC host:port"},
		{[]string{"gateway.enabled=true", "gateway.tracesEndpoint=t:4317", "gateway.replicas=3"}, "gateway.replicas: tail sampling needs every span"},
	} {
		if _, stderr, ok := render(t, tc.sets...); ok || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: ok=%v stderr %q, want an error with %q", tc.sets, ok, stderr, tc.msg)
		}
	}
}
