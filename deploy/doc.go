// Package deploy holds gaptrace's deployment files — the container image
// (Dockerfile), Kubernetes manifests (kubernetes/), the Helm chart
// (helm/gaptrace, with its values schema, NOTES.txt and the gateway behind
// gateway.enabled), compose files with Jaeger (compose.yaml) and Tempo
// (tempo/), the gateway's collector configuration (otel-collector/) and the
// Grafana dashboards (grafana/: one node, one job) — and the tests that keep
// them honest without a cluster or a Docker engine: manifests and rendered
// charts are decoded strictly into the typed Kubernetes API objects
// (namespace, health probes, capabilities, the binary's defaults and flags),
// compose files into the subset of the compose schema they use (pinned
// images, no anonymous Grafana admin), the dashboards' queries against the
// metrics gaptrace and the gateway serve and their datasources against their
// variables, and the Dockerfile's build stage against the commands CI runs.
package deploy
