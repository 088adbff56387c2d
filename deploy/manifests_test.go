package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// checkHealthProbes: readiness and liveness are HTTP GETs of /metrics on
// the container's metrics port, and liveness gives the probes time to load.
func checkHealthProbes(t *testing.T, c corev1.Container) {
	t.Helper()
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/metrics" || p.HTTPGet.Port.StrVal != "metrics" {
			t.Errorf("%s probe %+v: want an HTTP GET of /metrics on the metrics port", what, p)
		}
	}
	if l := c.LivenessProbe; l != nil && (l.InitialDelaySeconds < 10 || l.FailureThreshold < 2) {
		t.Errorf("liveness %+v restarts a pod that is still loading its probes", l)
	}
	if !strings.Contains(strings.Join(c.Args, " "), "--prometheus") {
		t.Errorf("args %v: the probes need the metrics endpoint", c.Args)
	}
}

// chartValues reads the chart's values.yaml.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("helm/gaptrace/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestChartDefaultsMatchTheBinary: the chart's probe set and minimum gap
// are the binary's defaults, and its image tag is the chart's appVersion,
// pinned.
func TestChartDefaultsMatchTheBinary(t *testing.T) {
	v := chartValues(t)
	if v["probes"] != "auto" || v["minGap"] != "1ms" {
		t.Errorf("probes %v, minGap %v: want the binary's defaults auto and 1ms", v["probes"], v["minGap"])
	}
	if bin := os.Getenv("GAPTRACE_BIN"); bin != "" {
		var out bytes.Buffer
		cmd := exec.Command(bin, "attach", "-h")
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run()
		for flag, want := range map[string]string{"probes": "auto", "min-gap": "1ms"} {
			re := regexp.MustCompile(`(?s)  -` + flag + ` .*?\(default ([^)]*)\)`)
			if m := re.FindStringSubmatch(out.String()); len(m) < 2 || m[1] != want {
				t.Errorf("gaptrace attach --%s default %v, the chart's %s", flag, m, want)
			}
		}
	}
	b, err := os.ReadFile("helm/gaptrace/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	img := v["image"].(map[string]any)
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(chart.AppVersion) || img["tag"] != "" && img["tag"] != chart.AppVersion {
		t.Errorf("appVersion %q, image.tag %q: want a released version, the tag defaulting to it", chart.AppVersion, img["tag"])
	}
	for _, f := range []string{"kubernetes/daemonset.yaml", "kubernetes/sidecar.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`image: REGISTRY/gaptrace:(\S+)`).FindAllStringSubmatch(string(b), -1) {
			if m[1] != chart.AppVersion {
				t.Errorf("%s: gaptrace image tag %s, the chart's appVersion is %s", f, m[1], chart.AppVersion)
			}
		}
	}
	for _, f := range []string{"helm/gaptrace/README.md", "helm/gaptrace/templates/NOTES.txt", "helm/gaptrace/values.schema.json"} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s missing: %v", f, err)
		}
	}
}

// TestComposePinnedAndNoAnonymousAdmin: every pulled image names a version,
// and Grafana lets anonymous visitors look, never administer.
func TestComposePinnedAndNoAnonymousAdmin(t *testing.T) {
	for _, f := range []string{"compose.yaml", "tempo/compose.yaml"} {
		c := loadCompose(t, f)
		for name, s := range c.Services {
			if s.Build != nil {
				continue // built here
			}
			tag := ""
			if i := strings.LastIndex(s.Image, ":"); i > 0 {
				tag = s.Image[i+1:]
			}
			if tag == "" || tag == "latest" {
				t.Errorf("%s: service %s runs %q: pin a version", f, name, s.Image)
			}
		}
		for name, s := range c.Services {
			env := s.Environment
			if env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" && env["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
				t.Errorf("%s: %s gives anonymous visitors the role %q", f, name, env["GF_AUTH_ANONYMOUS_ORG_ROLE"])
			}
		}
	}
}

// TestHelmSchemaAndProbes renders the chart: a misspelt probe set or mode
// fails at install with the allowed values, the pod is probed on /metrics,
// the image is the pinned appVersion, and NOTES.txt renders.
func TestHelmSchemaAndProbes(t *testing.T) {
	out, stderr, ok := render(t)
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(objects(t, out)["DaemonSet"], &ds); err != nil {
		t.Fatal(err)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	checkHealthProbes(t, c)
	if c.Image != "registry.example/ml/gaptrace:0.1.0" {
		t.Errorf("image %s: want the repository at the chart's appVersion", c.Image)
	}
	if i := indexOf(c.Args, "--probes"); i < 0 || c.Args[i+1] != "auto" {
		t.Errorf("args %v: want --probes auto", c.Args)
	}
	out, stderr, ok = render(t, "prometheus.enabled=false")
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	var off appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(objects(t, out)["DaemonSet"], &off); err != nil {
		t.Fatal(err)
	}
	if c := off.Spec.Template.Spec.Containers[0]; c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Error("probes of a metrics endpoint that is off")
	}
	for _, tc := range []struct{ set, msg string }{
		{"probes=ful", "probes"},
		{"image.tag=latest", "tag"},
		{"prometheus.port=70000", "port"},
		{"minGap=fast", "minGap"},
	} {
		if _, stderr, ok := render(t, tc.set); ok || !strings.Contains(stderr, "values don't meet the specifications of the schema") || !strings.Contains(stderr, tc.msg) {
			t.Errorf("--set %s: ok=%v, stderr %q: want the schema to refuse it", tc.set, ok, stderr)
		}
	}
	// helm template leaves NOTES.txt out and helm install needs a cluster
	// even for a dry run: render it from a copy of the chart, as a named
	// template put in a ConfigMap.
	for _, tc := range []struct {
		sets []string
		want []string
	}{
		{nil, []string{"rollout status daemonset/gt", "Spans go to http://otel-collector.observability.svc:4317", "Metrics: port 9464"}},
		{[]string{"mode=sidecar", "match=train", "otlp.endpoint="}, []string{"ConfigMap gt-sidecar", "shareProcessNamespace: true"}},
	} {
		notes := renderNotes(t, tc.sets...)
		for _, w := range tc.want {
			if !strings.Contains(notes, w) {
				t.Errorf("NOTES.txt with %v lacks %q:\n%s", tc.sets, w, notes)
			}
		}
	}
}

// renderNotes renders the chart's NOTES.txt with --set values.
func renderNotes(t *testing.T, sets ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("helm/gaptrace")); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tpl := "{{- define \"test.notes\" -}}\n" + string(notes) + "\n{{- end -}}\n"
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include \"test.notes\" . | quote }}\n"
	if os.WriteFile(filepath.Join(dir, "templates", "_notes_test.tpl"), []byte(tpl), 0o644) != nil ||
		os.WriteFile(filepath.Join(dir, "templates", "notes-test.yaml"), []byte(cm), 0o644) != nil {
		t.Fatal("write the notes template")
	}
	args := []string{"template", "gt", dir, "--namespace", "gaptrace", "--set", "image.repository=registry.example/ml/gaptrace",
		"--show-only", "templates/notes-test.yaml"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+home, "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("render NOTES.txt: %v\n%s", err, errb.String())
	}
	var c corev1.ConfigMap
	if err := sigsyaml.UnmarshalStrict(out.Bytes(), &c); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return c.Data["notes"]
}

func indexOf(ss []string, s string) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return -1
}
