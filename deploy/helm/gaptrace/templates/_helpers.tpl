{{- define "gaptrace.name" -}}
{{- default .Chart.Name .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gaptrace.labels" -}}
app.kubernetes.io/name: gaptrace
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gaptrace.selector" -}}
app.kubernetes.io/name: gaptrace
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The gaptrace container: the same for both modes but for its targets. */}}
{{- define "gaptrace.container" -}}
name: gaptrace
image: {{ printf "%s:%s" (required "image.repository: no gaptrace image is published; build deploy/Dockerfile, push it, and set image.repository to it (see the README)" .Values.image.repository) .Values.image.tag | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args:
  - attach
{{- if eq .Values.mode "daemonset" }}
  - --gpu-procs
{{- end }}
{{- with .Values.match }}
  - --match
  - {{ . | quote }}
{{- end }}
  - --live
  - "off"
  - --probes
  - {{ .Values.probes | quote }}
  - --min-gap
  - {{ .Values.minGap | quote }}
{{- with .Values.jobID }}
  - --job-id
  - {{ . | quote }}
{{- end }}
{{- with .Values.peers }}
  - --peers
  - {{ . | quote }}
  - --peers-secret-file
  - /etc/gaptrace/peers/secret
{{- $_ := required "peersSecret: --peers needs the job's shared secret; create one with: kubectl create secret generic gaptrace-peers --from-literal=secret=\"$(head -c 32 /dev/urandom | base64)\" and set peersSecret=gaptrace-peers" $.Values.peersSecret }}
{{- end }}
{{- if .Values.prometheus.enabled }}
  - --prometheus
  - {{ printf "0.0.0.0:%v" .Values.prometheus.port | quote }}
{{- end }}
{{- range .Values.extraArgs }}
  - {{ . | quote }}
{{- end }}
{{- if .Values.prometheus.enabled }}
ports:
  - name: metrics
    containerPort: {{ .Values.prometheus.port }}
{{- end }}
env:
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: POD_UID
    valueFrom:
      fieldRef:
        fieldPath: metadata.uid
{{- with .Values.otlp.endpoint }}
  - name: OTEL_EXPORTER_OTLP_ENDPOINT
    value: {{ . | quote }}
  - name: OTEL_EXPORTER_OTLP_INSECURE
    value: {{ $.Values.otlp.insecure | quote }}
{{- end }}
{{- with .Values.otlp.protocol }}
  - name: OTEL_EXPORTER_OTLP_PROTOCOL
    value: {{ . | quote }}
{{- end }}
{{- with .Values.otlp.metricsExporter }}
  - name: OTEL_METRICS_EXPORTER
    value: {{ . | quote }}
{{- end }}
{{- with .Values.otlp.tracesExporter }}
  - name: OTEL_TRACES_EXPORTER
    value: {{ . | quote }}
{{- end }}
  - name: OTEL_SERVICE_NAME
    value: {{ .Values.otlp.serviceName | quote }}
  - name: OTEL_RESOURCE_ATTRIBUTES
    {{- /* A sidecar shares the trainer's pod, so the pod is the target's;
    a DaemonSet's own pod is not, and names only the node. */}}
    {{- $attrs := list "k8s.node.name=$(NODE_NAME)" }}
    {{- if eq .Values.mode "sidecar" }}
    {{- $attrs = concat $attrs (list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.uid=$(POD_UID)") }}
    {{- end }}
    {{- with .Values.otlp.resourceAttributes }}
    {{- $attrs = append $attrs . }}
    {{- end }}
    value: {{ join "," $attrs | quote }}
  - name: NVIDIA_VISIBLE_DEVICES
    value: {{ .Values.nvidia.visibleDevices | quote }}
  - name: NVIDIA_DRIVER_CAPABILITIES
    value: {{ .Values.nvidia.driverCapabilities | quote }}
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsUser: 0
  capabilities:
    drop: ["ALL"]
    add:
{{- range concat .Values.capabilities .Values.extraCapabilities }}
      - {{ . | quote }}
{{- end }}
  seccompProfile:
    type: Unconfined
resources:
{{ toYaml .Values.resources | indent 2 }}
volumeMounts:
  - name: tracefs
    mountPath: /sys/kernel/tracing
  - name: gaptrace-tmp
    mountPath: /tmp
{{- if .Values.peers }}
  - name: gaptrace-peers-secret
    mountPath: /etc/gaptrace/peers
    readOnly: true
{{- end }}
{{- end -}}

{{- define "gaptrace.volumes" -}}
- name: tracefs
  hostPath:
    path: /sys/kernel/tracing
    type: Directory
- name: gaptrace-tmp
  emptyDir: {}
{{- if .Values.peers }}
- name: gaptrace-peers-secret
  secret:
    secretName: {{ .Values.peersSecret | quote }}
    defaultMode: 0400
    items:
      - key: secret
        path: secret
{{- end }}
{{- end -}}

{{/* For a parent chart: the native-sidecar init container (Kubernetes
1.29+: restartPolicy Always keeps it running beside the trainer without
holding a Job open). */}}
{{- define "gaptrace.sidecarContainer" -}}
{{ include "gaptrace.container" . }}
restartPolicy: Always
{{- end -}}

{{- define "gaptrace.sidecarVolumes" -}}
{{ include "gaptrace.volumes" . }}
{{- end -}}
