package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// helmBin is the helm binary built from tools/helm (make helm), or
// $GAPTRACE_HELM. Helm is a tool here, never a dependency of gaptrace.
func helmBin(t *testing.T) string {
	t.Helper()
	p := os.Getenv("GAPTRACE_HELM")
	if p == "" {
		p, _ = filepath.Abs("../build/helm")
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no helm binary at %s: run 'make helm' (or set GAPTRACE_HELM) to render the chart", p)
	}
	return p
}

// An install that names no image fails and says how to get one.
func TestHelmNeedsAnImage(t *testing.T) {
	var errb bytes.Buffer
	cmd := exec.Command(helmBin(t), "template", "gt", "helm/gaptrace")
	cmd.Stderr = &errb
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if err := cmd.Run(); err == nil || !strings.Contains(errb.String(), "build deploy/Dockerfile, push it") {
		t.Errorf("helm template without image.repository: %v, %q", err, errb.String())
	}
}

// render runs helm template on the chart with --set values and returns
// stdout, stderr and whether it succeeded.
func render(t *testing.T, sets ...string) (string, string, bool) {
	t.Helper()
	// No image is published: every install names the one it pushed.
	args := []string{"template", "gt", "helm/gaptrace", "--namespace", "gaptrace", "--set", "image.repository=registry.example/ml/gaptrace"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	// helm keeps its cache and config under HOME; keep them out of the
	// user's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+home, "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	err := cmd.Run()
	return out.String(), errb.String(), err == nil
}

// objects splits a rendered stream into documents and strictly decodes
// each into its typed API object by kind.
func objects(t *testing.T, stream string) map[string][]byte {
	t.Helper()
	docs := map[string][]byte{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(stream, -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rendered document is not YAML: %v\n%s", err, doc)
		}
		var into any
		switch meta.APIVersion + "/" + meta.Kind {
		case "apps/v1/DaemonSet":
			into = &appsv1.DaemonSet{}
		case "v1/Service":
			into = &corev1.Service{}
		case "v1/ConfigMap":
			into = &corev1.ConfigMap{}
		default:
			t.Fatalf("unexpected object %s %s", meta.APIVersion, meta.Kind)
		}
		if err := sigsyaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s: %v\n%s", meta.Kind, err, doc)
		}
		if _, dup := docs[meta.Kind]; dup {
			t.Fatalf("two %s objects rendered", meta.Kind)
		}
		docs[meta.Kind] = []byte(doc)
	}
	return docs
}

func TestHelmDaemonSet(t *testing.T) {
	out, stderr, ok := render(t)
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	docs := objects(t, out)
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(docs["DaemonSet"], &ds); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("hostPID must be true: a node's gaptrace sees every pod's processes")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	checkGaptraceContainer(t, c)
	checkTracefsVolume(t, spec.Volumes)
	if !slices.Contains(c.Args, "--gpu-procs") {
		t.Errorf("args %v: a DaemonSet traces every CUDA process (--gpu-procs)", c.Args)
	}
	for env, path := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name",
		"POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid"} {
		checkFieldRef(t, c.Env, env, path)
	}
	if e := envVar(c.Env, "OTEL_RESOURCE_ATTRIBUTES"); e == nil || e.Value != "k8s.node.name=$(NODE_NAME)" {
		t.Errorf("OTEL_RESOURCE_ATTRIBUTES %+v: a DaemonSet's own pod is not the target's, only the node belongs there", e)
	}
	if ds.Spec.Selector == nil || !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not match the pod labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}
	var svc corev1.Service
	if err := sigsyaml.UnmarshalStrict(docs["Service"], &svc); err != nil {
		t.Fatal(err)
	}
	if !labelsMatch(svc.Spec.Selector, ds.Spec.Template.Labels) || len(svc.Spec.Ports) != 1 ||
		svc.Spec.Ports[0].TargetPort.StrVal != "metrics" || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "metrics" && p.ContainerPort == svc.Spec.Ports[0].Port
	}) {
		t.Errorf("metrics Service %+v does not reach the container's metrics port %+v", svc.Spec, c.Ports)
	}
	if i := slices.Index(c.Args, "--prometheus"); i < 0 || c.Args[i+1] != "0.0.0.0:9464" {
		t.Errorf("args %v: want --prometheus 0.0.0.0:9464", c.Args)
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestHelmSidecarSnippet(t *testing.T) {
	out, stderr, ok := render(t, "mode=sidecar", `match=python.*train\\.py` /* --set unescapes once */, "otlp.metricsExporter=none",
		"otlp.resourceAttributes=team=ml", "jobID=resnet-42", "peers=resnet-42-worker-0:29601")
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	docs := objects(t, out)
	if _, ok := docs["DaemonSet"]; ok {
		t.Error("sidecar mode rendered a DaemonSet")
	}
	var cm corev1.ConfigMap
	if err := sigsyaml.UnmarshalStrict(docs["ConfigMap"], &cm); err != nil {
		t.Fatal(err)
	}
	var c corev1.Container
	if err := sigsyaml.UnmarshalStrict([]byte(cm.Data["container.yaml"]), &c); err != nil {
		t.Fatalf("container.yaml: %v\n%s", err, cm.Data["container.yaml"])
	}
	var vols []corev1.Volume
	if err := sigsyaml.UnmarshalStrict([]byte(cm.Data["volumes.yaml"]), &vols); err != nil {
		t.Fatalf("volumes.yaml: %v\n%s", err, cm.Data["volumes.yaml"])
	}
	checkGaptraceContainer(t, c)
	checkTracefsVolume(t, vols)
	for _, m := range c.VolumeMounts {
		if !slices.ContainsFunc(vols, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("mount %s has no volume in volumes.yaml", m.Name)
		}
	}
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("the sidecar snippet is a native sidecar (init container with restartPolicy: Always)")
	}
	if slices.Contains(c.Args, "--gpu-procs") {
		t.Error("a sidecar traces its pod's trainer (--match), not every CUDA process")
	}
	if i := slices.Index(c.Args, "--match"); i < 0 || c.Args[i+1] != `python.*train\.py` {
		t.Errorf("args %v: want --match python.*train\\.py", c.Args)
	}
	if i := slices.Index(c.Args, "--job-id"); i < 0 || c.Args[i+1] != "resnet-42" {
		t.Errorf("args %v: want --job-id resnet-42", c.Args)
	}
	if i := slices.Index(c.Args, "--peers"); i < 0 || c.Args[i+1] != "resnet-42-worker-0:29601" {
		t.Errorf("args %v: want --peers resnet-42-worker-0:29601", c.Args)
	}
	for env, want := range map[string]string{
		"OTEL_METRICS_EXPORTER":    "none",
		"OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=$(NODE_NAME),k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.uid=$(POD_UID),team=ml",
	} {
		if e := envVar(c.Env, env); e == nil || e.Value != want {
			t.Errorf("env %s = %+v, want %q", env, e, want)
		}
	}
}

func TestHelmValuesAndErrors(t *testing.T) {
	out, stderr, ok := render(t, "extraCapabilities={SYS_ADMIN}", "prometheus.enabled=false")
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	docs := objects(t, out)
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(docs["DaemonSet"], &ds); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if add := c.SecurityContext.Capabilities.Add; !slices.Contains(add, "SYS_ADMIN") || !slices.Contains(add, "BPF") {
		t.Errorf("capabilities %v: want the four plus SYS_ADMIN", add)
	}
	if slices.Contains(c.Args, "--prometheus") || len(c.Ports) != 0 || docs["Service"] != nil {
		t.Errorf("prometheus.enabled=false still serves metrics: args %v ports %v", c.Args, c.Ports)
	}
	for _, tc := range []struct {
		sets []string
		msg  string
	}{
		{[]string{"mode=everywhere"}, `mode "everywhere": want daemonset or sidecar`},
		{[]string{"mode=sidecar"}, "mode sidecar: set match"},
	} {
		if _, stderr, ok := render(t, tc.sets...); ok || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: ok=%v stderr %q, want an error with %q", tc.sets, ok, stderr, tc.msg)
		}
	}
}

// With peers set, the chart needs peersSecret (the refusal says how to
// make one) and mounts that Secret read-only, mode 0400, for
// --peers-secret-file.
func TestHelmPeersSecret(t *testing.T) {
	if _, stderr, ok := render(t, "peers=10.0.0.5:29601", "jobID=j"); ok || !strings.Contains(stderr, "kubectl create secret generic") {
		t.Errorf("peers without peersSecret: ok=%v stderr %q, want a refusal saying how to make one", ok, stderr)
	}
	out, stderr, ok := render(t, "peers=10.0.0.5:29601", "jobID=j", "peersSecret=gaptrace-peers")
	if !ok {
		t.Fatalf("helm template: %s", stderr)
	}
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(objects(t, out)["DaemonSet"], &ds); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if i := slices.Index(c.Args, "--peers-secret-file"); i < 0 || c.Args[i+1] != "/etc/gaptrace/peers/secret" {
		t.Errorf("args %v: want --peers-secret-file /etc/gaptrace/peers/secret", c.Args)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "gaptrace-peers-secret" && m.MountPath == "/etc/gaptrace/peers" && m.ReadOnly
	}) {
		t.Errorf("mounts %+v: want the secret read-only at /etc/gaptrace/peers", c.VolumeMounts)
	}
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "gaptrace-peers-secret" })
	if i < 0 || spec.Volumes[i].Secret == nil || spec.Volumes[i].Secret.SecretName != "gaptrace-peers" ||
		spec.Volumes[i].Secret.DefaultMode == nil || *spec.Volumes[i].Secret.DefaultMode != 0o400 {
		t.Errorf("volumes %+v: want Secret gaptrace-peers, mode 0400", spec.Volumes)
	}
}
