package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/otel"
)

// exportedMetrics scrapes gaptrace's own Prometheus endpoint, in process,
// after feeding it a gap, a step and a summary so that every instrument
// has a point, and returns the metric names the text holds (histograms
// with their _bucket, _sum and _count series).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	ctx := context.Background()
	x, err := otel.New(ctx, otel.Config{PrometheusAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := x.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	now := time.Now().UnixNano()
	g := correlate.Gap{PID: 1, TID: 1, Step: 0, Start: now, End: now + 5e6, Duration: 5e6, Cause: correlate.CauseIORead}
	x.Gap(g)
	x.Step(correlate.StepResult{Step: correlate.Step{PID: 1, Number: 0, Start: now - 1e7, End: now + 2e7, IdleNS: 5e6, IdleRatio: 0.2,
		ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 5e6}, Gaps: 1}, GapList: []correlate.Gap{g}})
	x.DroppedEvents(3)
	x.Summary(correlate.Summary{Steps: 1, Gaps: 1, ByCause: map[correlate.Cause]int64{correlate.CauseIORead: 5e6}}, 3)

	resp, err := http.Get("http://" + x.PrometheusAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+s] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) < 5 {
		t.Fatalf("scraped only %v", names)
	}
	return names
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"` // an object for a query variable, the plugin id for a datasource one
			Datasource datasource      `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int        `json:"id"`
	Title       string     `json:"title"`
	Type        string     `json:"type"`
	Datasource  datasource `json:"datasource"`
	Panels      []panel    `json:"panels"` // rows
	Targets     []target   `json:"targets"`
	FieldConfig struct {
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options string `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string          `json:"id"`
				Value json.RawMessage `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
}

type target struct {
	Datasource datasource `json:"datasource"`
	Expr       string     `json:"expr"`
	Query      string     `json:"query"`
	QueryType  string     `json:"queryType"`
}

// promQLMetrics returns the metric names a PromQL expression selects. It
// removes what cannot be a metric name — strings, label matchers, ranges,
// grouping clauses, Grafana variables, numbers and durations — and keeps the identifiers that are
// not function calls or keywords.
func promQLMetrics(expr string) []string {
	s := expr
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`"(?:[^"\\]|\\.)*"`),
		regexp.MustCompile(`\{[^}]*\}`),
		regexp.MustCompile(`\[[^\]]*\]`),
		regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
		regexp.MustCompile(`\$\w+`),
		regexp.MustCompile(`\b\d[\w.]*`), // numbers and durations (0.95, 5m)
	} {
		s = re.ReplaceAllString(s, " ")
	}
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
	var out []string
	for _, m := range regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`).FindAllString(s, -1) {
		if strings.HasSuffix(m, "(") || keywords[strings.ToLower(m)] {
			continue
		}
		out = append(out, m)
	}
	return out
}

func TestPromQLMetrics(t *testing.T) {
	got := promQLMetrics(`histogram_quantile(0.95, sum by (le, cause) (rate(gaptrace_gap_duration_seconds_bucket{job=~"$job",x="a{b}"}[$__rate_interval]))) / on(instance) group_left(gpu) target_info and bogus_total offset 5m`)
	want := []string{"gaptrace_gap_duration_seconds_bucket", "target_info", "bogus_total"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/gaptrace.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/gaptrace.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard without uid, title or panels: %+v", d)
	}
	exported := exportedMetrics(t)
	// No datasource uid is hard-coded: each type is picked through a
	// variable (datasource for Prometheus, tempo for Tempo), so the
	// dashboard imports into any Grafana; the provisioned datasources
	// offer one of each type.
	varUID := map[string]string{"prometheus": "${datasource}", "tempo": "${tempo}"}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			var plugin string
			if err := json.Unmarshal(v.Query, &plugin); err != nil {
				t.Errorf("datasource variable %s: query %s is not a plugin id", v.Name, v.Query)
			}
			vars[v.Name] = plugin
		}
	}
	if vars["datasource"] != "prometheus" || vars["tempo"] != "tempo" {
		t.Errorf("datasource variables %v: want datasource (prometheus) and tempo (tempo)", vars)
	}
	provisioned := provisionedDatasourceTypes(t)
	for typ := range varUID {
		if !provisioned[typ] {
			t.Errorf("no %s datasource provisioned for the compose demo (%v)", typ, provisioned)
		}
	}

	check := func(where, expr string) {
		ms := promQLMetrics(expr)
		if len(ms) == 0 {
			t.Errorf("%s: query %q names no metric", where, expr)
		}
		for _, m := range ms {
			if !exported[m] {
				t.Errorf("%s: query %q uses %s, which gaptrace does not export (it exports %v)", where, expr, m, keys(exported))
			}
		}
	}
	var sawPerCause, sawStep, sawDropped, sawStepLink, sawFiles, sawPeers bool
	for _, p := range allPanels(d.Panels) {
		where := "panel " + p.Title
		if p.Type != "row" && varUID[p.Datasource.Type] != p.Datasource.UID {
			t.Errorf("%s: datasource %+v, want its type's variable (%v)", where, p.Datasource, varUID)
		}
		for _, tg := range p.Targets {
			if varUID[tg.Datasource.Type] != tg.Datasource.UID {
				t.Errorf("%s: target datasource %+v, want its type's variable", where, tg.Datasource)
			}
			switch tg.Datasource.Type {
			case "prometheus":
				check(where, tg.Expr)
				sawPerCause = sawPerCause || strings.Contains(tg.Expr, "gaptrace_gpu_idle_seconds_total") && strings.Contains(tg.Expr, "cause")
				sawStep = sawStep || strings.Contains(tg.Expr, "gaptrace_step_duration_seconds")
				sawDropped = sawDropped || strings.Contains(tg.Expr, "gaptrace_events_dropped_total")
			case "tempo":
				if tg.QueryType != "traceql" || !strings.HasPrefix(strings.TrimSpace(tg.Query), "{") {
					t.Errorf("%s: tempo target %+v is not a TraceQL query", where, tg)
				}
				sawFiles = sawFiles || strings.Contains(tg.Query, "span.file.path")
				sawPeers = sawPeers || strings.Contains(tg.Query, "span.network.peer.address")
				if strings.Contains(tg.Query, `"train.step"`) {
					sawStepLink = sawStepLink || hasTraceLink(p)
				}
			default:
				t.Errorf("%s: target datasource %+v", where, tg.Datasource)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Datasource.Type == "prometheus" {
			if v.Datasource.UID != varUID["prometheus"] {
				t.Errorf("variable %s: datasource %+v, want ${datasource}", v.Name, v.Datasource)
			}
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query %s", v.Name, v.Query)
			}
			check("variable "+v.Name, strings.NewReplacer("label_values(", "", ", job)", "", ", instance)", "").Replace(q.Query))
		}
	}
	for what, ok := range map[string]bool{"idle by cause": sawPerCause, "step time": sawStep, "dropped events": sawDropped,
		"step → Tempo trace link": sawStepLink, "top files": sawFiles, "top peers": sawPeers} {
		if !ok {
			t.Errorf("dashboard has no %s panel", what)
		}
	}
}

// hasTraceLink reports whether a panel links its trace ID column to the
// Tempo datasource.
func hasTraceLink(p panel) bool {
	for _, o := range p.FieldConfig.Overrides {
		if o.Matcher.Options != "traceID" {
			continue
		}
		for _, pr := range o.Properties {
			var links []struct {
				Internal struct {
					DatasourceUID string `json:"datasourceUid"`
					Query         struct {
						Query string `json:"query"`
					} `json:"query"`
				} `json:"internal"`
			}
			if pr.ID == "links" && json.Unmarshal(pr.Value, &links) == nil {
				for _, l := range links {
					if l.Internal.DatasourceUID == "${tempo}" && strings.Contains(l.Internal.Query.Query, "${__value.raw}") {
						return true
					}
				}
			}
		}
	}
	return false
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// provisionedDatasourceTypes lists the types of the datasources the Tempo
// compose provisions.
func provisionedDatasourceTypes(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("tempo/grafana-datasources.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Datasources []struct {
			Type string `yaml:"type"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{}
	for _, d := range cfg.Datasources {
		types[d.Type] = true
	}
	return types
}

// TestGrafanaProvisioning checks that the Tempo compose mounts the
// dashboard, its provider and the datasources where Grafana looks, that
// Prometheus scrapes the port gaptrace serves, and that gaptrace sends no
// OTLP metrics to Tempo (which takes traces only).
func TestGrafanaProvisioning(t *testing.T) {
	c := loadCompose(t, "tempo/compose.yaml")
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service")
	}
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	b, err := os.ReadFile("grafana/dashboards.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &prov); err != nil || len(prov.Providers) == 0 {
		t.Fatalf("grafana/dashboards.yaml: %v %+v", err, prov)
	}
	mounts := map[string]string{}
	for _, v := range g.Volumes {
		p := strings.Split(v, ":")
		if _, err := os.Stat("tempo/" + p[0]); err != nil {
			t.Errorf("grafana mounts %s, which does not exist: %v", p[0], err)
		}
		mounts[p[1]] = p[0]
	}
	want := map[string]string{
		"/etc/grafana/provisioning/dashboards/gaptrace.yaml":  "../grafana/dashboards.yaml",
		"/etc/grafana/provisioning/datasources/gaptrace.yaml": "./grafana-datasources.yaml",
		prov.Providers[0].Options.Path + "/gaptrace.json":     "../grafana/gaptrace.json",
	}
	for dst, src := range want {
		if mounts[dst] != src {
			t.Errorf("grafana mounts %q at %s, want %q", mounts[dst], dst, src)
		}
	}
	gt := c.Services["gaptrace"]
	i := slices.Index(gt.Command, "--prometheus")
	if i < 0 || i+1 >= len(gt.Command) || !strings.HasSuffix(gt.Command[i+1], ":9464") {
		t.Errorf("gaptrace command %v does not serve Prometheus on :9464", gt.Command)
	}
	for file, svc := range map[string]composeService{"tempo/compose.yaml": gt, "compose.yaml": loadCompose(t, "compose.yaml").Services["gaptrace"]} {
		if svc.Environment["OTEL_METRICS_EXPORTER"] != "none" {
			t.Errorf("%s: gaptrace would push OTLP metrics to a traces-only backend: set OTEL_METRICS_EXPORTER=none", file)
		}
	}
	f, err := os.Open("tempo/prometheus.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pb, _ := io.ReadAll(f)
	var pc struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(pb, &pc); err != nil || len(pc.ScrapeConfigs) == 0 || len(pc.ScrapeConfigs[0].StaticConfigs) == 0 ||
		!slices.Contains(pc.ScrapeConfigs[0].StaticConfigs[0].Targets, "gaptrace:9464") {
		t.Errorf("prometheus.yaml does not scrape gaptrace:9464: %v %+v", err, pc)
	}
}
