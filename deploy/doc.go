// Package deploy holds gaptrace's deployment files — the container image
// (Dockerfile), Kubernetes manifests (kubernetes/), the Helm chart (helm/,
// with the gateway behind gateway.enabled), compose files with Jaeger
// (compose.yaml) and Tempo (tempo/), the gateway's collector
// configuration (otel-collector/) and the Grafana dashboards (grafana/:
// one node, one job) — and the tests that keep them
// honest without a cluster or a Docker engine: manifests are decoded
// strictly into the typed Kubernetes API objects, compose files into the
// subset of the compose schema they use, and the Dockerfile's build stage
// is checked against the commands CI runs.
package deploy
