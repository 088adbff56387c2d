package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

var requiredCaps = []corev1.Capability{"BPF", "PERFMON", "SYS_PTRACE", "SYS_RESOURCE"}

func decodeStrict(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// UnmarshalStrict rejects unknown and duplicate fields: a misspelt
	// key fails here instead of being ignored by the API server.
	if err := sigsyaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// checkGaptraceContainer asserts what every gaptrace container needs.
func checkGaptraceContainer(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("gaptrace container has no securityContext.capabilities")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("gaptrace container is privileged; it needs four capabilities, not everything")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	for _, cp := range requiredCaps {
		if !slices.Contains(sc.Capabilities.Add, cp) {
			t.Errorf("capability %s not added (have %v)", cp, sc.Capabilities.Add)
		}
	}
	if len(sc.Capabilities.Add) != len(requiredCaps) {
		t.Errorf("capabilities %v: want exactly %v", sc.Capabilities.Add, requiredCaps)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("capabilities.drop should be [ALL] so only the four remain")
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/sys/kernel/tracing" }) {
		t.Error("no /sys/kernel/tracing mount: tracepoints need the host's tracefs")
	}
	if len(c.Args) == 0 || c.Args[0] != "attach" {
		t.Errorf("args %v: want gaptrace attach ...", c.Args)
	}
	checkEnvOrder(t, c.Env)
	checkFlagsExist(t, c.Args)
}

// checkEnvOrder verifies that every $(VAR) reference names a variable
// defined earlier in the list: Kubernetes expands only those, and leaves
// the rest as literal text in resource attributes.
func checkEnvOrder(t *testing.T, env []corev1.EnvVar) {
	t.Helper()
	ref := regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`)
	seen := map[string]bool{}
	for _, e := range env {
		for _, m := range ref.FindAllStringSubmatch(e.Value, -1) {
			if !seen[m[1]] {
				t.Errorf("env %s refers to $(%s) before it is defined", e.Name, m[1])
			}
		}
		seen[e.Name] = true
	}
}

// checkFlagsExist runs the built binary's help for the subcommand and
// checks every flag in args is one it knows. Needs GAPTRACE_BIN (make test
// sets it).
func checkFlagsExist(t *testing.T, args []string) {
	t.Helper()
	bin := os.Getenv("GAPTRACE_BIN")
	if bin == "" {
		t.Log("GAPTRACE_BIN not set: flags in the manifest not checked against the binary")
		return
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, args[0], "-h")
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -h exits 0; the output is what matters
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name := strings.SplitN(strings.TrimPrefix(a, "--"), "=", 2)[0]
		if !strings.Contains(out.String(), "  -"+name+" ") && !strings.Contains(out.String(), "  -"+name+"\n") {
			t.Errorf("flag --%s is not a flag of 'gaptrace %s':\n%s", name, args[0], out.String())
		}
	}
}

func envVar(env []corev1.EnvVar, name string) *corev1.EnvVar {
	for i := range env {
		if env[i].Name == name {
			return &env[i]
		}
	}
	return nil
}

func checkFieldRef(t *testing.T, env []corev1.EnvVar, name, path string) {
	t.Helper()
	e := envVar(env, name)
	if e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
		t.Errorf("env %s: want downward API fieldRef %s, got %+v", name, path, e)
	}
}

func checkTracefsVolume(t *testing.T, vols []corev1.Volume) {
	t.Helper()
	for _, v := range vols {
		if v.Name == "tracefs" {
			if v.HostPath == nil || v.HostPath.Path != "/sys/kernel/tracing" {
				t.Errorf("tracefs volume %+v: want hostPath /sys/kernel/tracing", v)
			}
			return
		}
	}
	t.Error("no tracefs volume")
}

func TestSidecarJob(t *testing.T) {
	var job batchv1.Job
	decodeStrict(t, "kubernetes/sidecar.yaml", &job)
	if job.APIVersion != "batch/v1" || job.Kind != "Job" {
		t.Fatalf("%s/%s, want batch/v1 Job", job.APIVersion, job.Kind)
	}
	spec := job.Spec.Template.Spec
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace {
		t.Error("shareProcessNamespace must be true: gaptrace has to see the trainer's processes")
	}
	if spec.HostPID {
		t.Error("the sidecar must not use hostPID")
	}
	// A native sidecar: an init container that keeps running, so the Job
	// completes when the trainer does.
	var gt *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "gaptrace" {
			gt = &spec.InitContainers[i]
		}
	}
	if gt == nil {
		t.Fatal("no gaptrace init container")
	}
	if gt.RestartPolicy == nil || *gt.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("gaptrace must be a native sidecar (restartPolicy: Always)")
	}
	checkGaptraceContainer(t, *gt)
	if !slices.Contains(gt.Args, "--match") {
		t.Errorf("args %v: the sidecar finds the trainer with --match", gt.Args)
	}
	checkFieldRef(t, gt.Env, "POD_NAME", "metadata.name")
	checkFieldRef(t, gt.Env, "POD_NAMESPACE", "metadata.namespace")
	checkFieldRef(t, gt.Env, "NODE_NAME", "spec.nodeName")
	if e := envVar(gt.Env, "OTEL_EXPORTER_OTLP_ENDPOINT"); e == nil || e.Value == "" && e.ValueFrom == nil {
		t.Error("OTEL_EXPORTER_OTLP_ENDPOINT not set")
	}
	ra := envVar(gt.Env, "OTEL_RESOURCE_ATTRIBUTES")
	if ra == nil {
		t.Fatal("OTEL_RESOURCE_ATTRIBUTES not set")
	}
	for _, kv := range []string{"k8s.pod.name=$(POD_NAME)", "k8s.namespace.name=$(POD_NAMESPACE)", "k8s.node.name=$(NODE_NAME)"} {
		if !strings.Contains(ra.Value, kv) {
			t.Errorf("OTEL_RESOURCE_ATTRIBUTES %q lacks %s", ra.Value, kv)
		}
	}
	checkTracefsVolume(t, spec.Volumes)
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "trainer" {
		t.Fatalf("containers %v: want the trainer", spec.Containers)
	}
	// Pod identity on every gap: the pod's UID to match the trainer's
	// cgroup, the traced container's own name.
	checkFieldRef(t, gt.Env, "POD_UID", "metadata.uid")
	if e := envVar(gt.Env, "K8S_CONTAINER_NAME"); e == nil || e.Value != spec.Containers[0].Name {
		t.Errorf("K8S_CONTAINER_NAME %v, want the traced container's name %q", e, spec.Containers[0].Name)
	}
	if _, ok := spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; !ok {
		t.Error("trainer requests no GPU")
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever && spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		t.Errorf("restartPolicy %q is not valid for a Job", spec.RestartPolicy)
	}
}

func TestDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	decodeStrict(t, "kubernetes/daemonset.yaml", &ds)
	if ds.APIVersion != "apps/v1" || ds.Kind != "DaemonSet" {
		t.Fatalf("%s/%s, want apps/v1 DaemonSet", ds.APIVersion, ds.Kind)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("hostPID must be true: the DaemonSet discovers GPU processes of every pod")
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != ds.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Error("selector does not match the template labels")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	checkGaptraceContainer(t, c)
	if !slices.Contains(c.Args, "--gpu-procs") {
		t.Errorf("args %v: want --gpu-procs to discover GPU processes", c.Args)
	}
	checkFieldRef(t, c.Env, "NODE_NAME", "spec.nodeName")
	if e := envVar(c.Env, "OTEL_EXPORTER_OTLP_ENDPOINT"); e == nil {
		t.Error("OTEL_EXPORTER_OTLP_ENDPOINT not set")
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "nvidia.com/gpu" }) {
		t.Error("no toleration for nvidia.com/gpu taints: it would not run on GPU nodes")
	}
	checkTracefsVolume(t, spec.Volumes)
}

// composeFile is the part of the compose specification our files use;
// KnownFields rejects anything else, so a misspelt key fails the test.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   []string          `yaml:"depends_on"`
	PID         string            `yaml:"pid"`
	CapAdd      []string          `yaml:"cap_add"`
	Privileged  bool              `yaml:"privileged"`
	SecurityOpt []string          `yaml:"security_opt"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
	Target     string `yaml:"target"`
}

func loadCompose(t *testing.T, path string) composeFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var c composeFile
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func checkComposeDemo(t *testing.T, c composeFile, backend string, stages map[string]bool) {
	t.Helper()
	for _, name := range []string{backend, "trainer", "gaptrace"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("no %s service", name)
		}
	}
	gt, tr := c.Services["gaptrace"], c.Services["trainer"]
	if gt.Privileged {
		t.Error("gaptrace service is privileged")
	}
	if gt.PID != "service:trainer" {
		t.Errorf("gaptrace pid %q: want service:trainer to see the trainer's processes", gt.PID)
	}
	for _, cp := range requiredCaps {
		if !slices.Contains(gt.CapAdd, string(cp)) {
			t.Errorf("gaptrace cap_add lacks %s", cp)
		}
	}
	if !slices.Contains(gt.Volumes, "/sys/kernel/tracing:/sys/kernel/tracing") {
		t.Error("gaptrace does not mount the host's tracefs")
	}
	ep := gt.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
	if !strings.Contains(ep, "//"+backend+":") {
		t.Errorf("OTLP endpoint %q does not point at the %s service", ep, backend)
	}
	if !slices.Contains(gt.DependsOn, backend) || !slices.Contains(gt.DependsOn, "trainer") {
		t.Errorf("gaptrace depends_on %v", gt.DependsOn)
	}
	for svc, s := range map[string]composeService{"gaptrace": gt, "trainer": tr} {
		if s.Build == nil || !stages[s.Build.Target] {
			t.Errorf("%s builds target %+v, not a stage of the Dockerfile %v", svc, s.Build, stages)
		}
	}
	// The simulated GPU's state directory is shared, or the simulated
	// NVML in gaptrace would see an idle GPU.
	if gt.Environment["SIMGPU_DIR"] == "" || gt.Environment["SIMGPU_DIR"] != tr.Environment["SIMGPU_DIR"] {
		t.Errorf("SIMGPU_DIR differs: gaptrace %q trainer %q", gt.Environment["SIMGPU_DIR"], tr.Environment["SIMGPU_DIR"])
	}
	for _, s := range []composeService{gt, tr} {
		for _, v := range s.Volumes {
			src := strings.SplitN(v, ":", 2)[0]
			if !strings.HasPrefix(src, "/") && !strings.HasPrefix(src, ".") {
				if _, ok := c.Volumes[src]; !ok {
					t.Errorf("named volume %s not declared", src)
				}
			}
		}
	}
}

// dockerStages returns the named stages of the Dockerfile and its lines.
func dockerStages(t *testing.T) (map[string]bool, []string) {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	stages := map[string]bool{}
	from := regexp.MustCompile(`(?i)^FROM\s+\S+\s+AS\s+(\S+)`)
	for _, l := range lines {
		if m := from.FindStringSubmatch(l); m != nil {
			stages[m[1]] = true
		}
	}
	return stages, lines
}

func TestCompose(t *testing.T) {
	stages, _ := dockerStages(t)
	checkComposeDemo(t, loadCompose(t, "compose.yaml"), "jaeger", stages)
}

func TestTempo(t *testing.T) {
	stages, _ := dockerStages(t)
	c := loadCompose(t, "tempo/compose.yaml")
	checkComposeDemo(t, c, "tempo", stages)
	b, err := os.ReadFile("tempo/tempo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Distributor struct {
			Receivers struct {
				OTLP struct {
					Protocols map[string]struct {
						Endpoint string `yaml:"endpoint"`
					} `yaml:"protocols"`
				} `yaml:"otlp"`
			} `yaml:"receivers"`
		} `yaml:"distributor"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	grpc, ok := cfg.Distributor.Receivers.OTLP.Protocols["grpc"]
	if !ok || !strings.HasSuffix(grpc.Endpoint, ":4317") {
		t.Errorf("tempo has no OTLP gRPC receiver on 4317: %+v", cfg.Distributor.Receivers.OTLP)
	}
	if ep := c.Services["gaptrace"].Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]; !strings.HasSuffix(ep, ":4317") {
		t.Errorf("gaptrace sends to %q, tempo listens on 4317", ep)
	}
}

func TestDockerfile(t *testing.T) {
	stages, lines := dockerStages(t)
	for _, s := range []string{"build", "simtrain", "runtime"} {
		if !stages[s] {
			t.Errorf("no %s stage", s)
		}
	}
	var froms []string
	var runs []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "FROM "):
			froms = append(froms, l)
		case strings.HasPrefix(l, "RUN "):
			runs = append(runs, strings.TrimPrefix(l, "RUN "))
		}
	}
	// The default target (the last stage) is the small runtime image.
	if last := froms[len(froms)-1]; !strings.HasSuffix(last, "AS runtime") || !strings.Contains(last, "-slim") && !strings.Contains(last, "distroless") {
		t.Errorf("last stage %q: want the slim runtime stage as the default target", last)
	}
	// The build stage runs the same make targets as CI.
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"make build", "make simgpu"} {
		if !slices.ContainsFunc(runs, func(r string) bool { return strings.Contains(r, want) }) {
			t.Errorf("Dockerfile does not run %q", want)
		}
		if !strings.Contains(string(ci), want) {
			t.Errorf(".ci/run does not run %q: the image's build is no longer what CI checks", want)
		}
	}
	// The Go version of the build image is the one go.mod asks for.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("no go directive in go.mod")
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "ARG GO_VERSION="+string(m[1])) }) {
		t.Errorf("ARG GO_VERSION does not match go.mod's go %s", m[1])
	}
	// Runtime copies only the binary.
	var inRuntime bool
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			inRuntime = strings.HasSuffix(strings.TrimSpace(l), "AS runtime")
		}
		if inRuntime && strings.HasPrefix(l, "COPY ") && !strings.Contains(l, "/src/bin/gaptrace ") {
			t.Errorf("runtime stage copies more than the binary: %s", l)
		}
	}
}

// The DaemonSet serves Prometheus on its pod's own address (not
// 0.0.0.0), and networkpolicy.yaml lets only Prometheus reach that port
// of the DaemonSet's pods.
func TestPrometheusBoundAndFenced(t *testing.T) {
	var ds appsv1.DaemonSet
	decodeStrict(t, "kubernetes/daemonset.yaml", &ds)
	c := ds.Spec.Template.Spec.Containers[0]
	if i := slices.Index(c.Args, "--prometheus"); i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != "$(POD_IP):9464" {
		t.Errorf("args %v: want --prometheus $(POD_IP):9464", c.Args)
	}
	checkFieldRef(t, c.Env, "POD_IP", "status.podIP")
	var np networkingv1.NetworkPolicy
	decodeStrict(t, "kubernetes/networkpolicy.yaml", &np)
	if np.Namespace != ds.Namespace || !labelsMatchAll(np.Spec.PodSelector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("the NetworkPolicy selects %v in %q, not the DaemonSet's pods %v in %q",
			np.Spec.PodSelector.MatchLabels, np.Namespace, ds.Spec.Template.Labels, ds.Namespace)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) == 0 || len(np.Spec.Ingress[0].Ports) != 1 ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9464 {
		t.Errorf("ingress %+v: want one rule, from named peers only, to port 9464", np.Spec.Ingress)
	}
}

func labelsMatchAll(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}
