# gaptrace — why was the GPU idle?
SHELL := /bin/bash
GO ?= go
BIN := bin/gaptrace
SIMGPU_DIR := build/simgpu
JAEGER := build/jaeger
HELM := build/helm
export CGO_ENABLED := 1
# go-nvml binds every NVML entry point, deprecated ones too; gcc's
# deprecation warnings about them are not ours to fix.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# netgo, osusergo: the pure-Go resolver and user lookup (what a static
# sidecar wants, and two fewer cgo packages to compile). -s -w: no symbol
# table or DWARF (panics still print function names and lines).
GO_BUILD_FLAGS := -trimpath -tags netgo,osusergo -ldflags "-s -w -X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)"

# go build -v names each package it compiles. On a terminal that becomes one
# line that keeps changing, so a first build (every dependency from source:
# about 1.5 min on 2 cores) shows that it moves; elsewhere a line every 100
# packages (a heartbeat in CI logs) and the count at the end. Anything else
# go build says (errors, downloads) passes through.
GO_PROGRESS = awk -v tty="$$tty" ' \
	/^[[:alnum:]_.\/-]+$$/ { n++; if (tty) printf "\r\033[K  compiling %4d  %s", n, substr($$0, 1, 70); else if (n % 100 == 0) printf "  compiled %d packages so far\n", n; fflush(); next } \
	{ if (tty && n) printf "\r\033[K"; print; fflush() } \
	END { if (tty && n) printf "\r\033[K"; if (n) printf "  compiled %d package%s\n", n, (n > 1 ? "s" : "") }'

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

build: ## Build bin/gaptrace (no clang needed: BPF objects are committed)
	@mkdir -p bin
	@echo "go build -o $(BIN) ./cmd/sidecar"
	@set -o pipefail; tty=; [ -t 1 ] && tty=1; $(GO) build -v $(GO_BUILD_FLAGS) -o $(BIN) ./cmd/sidecar 2>&1 | $(GO_PROGRESS)

generate: ## Regenerate BPF objects with bpf2go (needs clang, llvm, libbpf-dev)
	$(GO) generate ./tracer/...

BPF_SRC := $(filter-out bpf/vmlinux.h,$(wildcard bpf/*.c bpf/*.h))
fmt-bpf: ## Format bpf/*.c and bpf/*.h with clang-format (.clang-format)
	clang-format -i $(BPF_SRC)

simgpu: ## Build the simulated GPU (libcuda, libnccl, libnvidia-ml, simtrain) into build/simgpu
	$(MAKE) -C testdata/simgpu OUT=$(abspath $(SIMGPU_DIR))

# Jaeger and Helm are built once, for the tests; their first builds are
# the longest part of a first 'make test' (~15 and ~3.3 min on 2 cores),
# so each says so before it starts and shows its progress as build does.
jaeger: $(JAEGER) ## Build Jaeger v1.76 from its own module file (first build ~15 min on 2 cores)
$(JAEGER): tools/jaeger/go.mod
	@mkdir -p build
	@echo "building Jaeger v1.76 for the end-to-end tests (once; ~15 min on 2 cores)"
	@set -o pipefail; tty=; [ -t 1 ] && tty=1; cd tools/jaeger && $(GO) build -v -o $(abspath $(JAEGER)) github.com/jaegertracing/jaeger/cmd/jaeger 2>&1 | $(GO_PROGRESS)

helm: $(HELM) ## Build Helm v3.22 from its own module file, to render deploy/helm in tests (~3.3 min)
$(HELM): tools/helm/go.mod
	@mkdir -p build
	@echo "building Helm v3.22 to render deploy/helm in the tests (once; ~3.3 min on 2 cores)"
	@set -o pipefail; tty=; [ -t 1 ] && tty=1; cd tools/helm && $(GO) build -v -o $(abspath $(HELM)) helm.sh/helm/v3/cmd/helm 2>&1 | $(GO_PROGRESS)

# The gateway: an OpenTelemetry Collector built by the Collector Builder
# (ocb, a tool of tools/otelcol/go.mod) from tools/otelcol/builder-config.yaml.
# Its generated sources go to build/otelcol-src.
OTELCOL := build/otelcol
otelcol: $(OTELCOL) ## Build the gateway (OpenTelemetry Collector) with ocb (first build ~4 min)
$(OTELCOL): tools/otelcol/go.mod tools/otelcol/builder-config.yaml
	@mkdir -p build
	cd tools/otelcol && $(GO) tool builder --config builder-config.yaml --ldflags "-s -w"
	mv build/otelcol-src/otelcol $(OTELCOL)
# make test runs the gateway end to end (test/fleet).
test: otelcol
test: export GAPTRACE_OTELCOL := $(abspath $(OTELCOL))
.PHONY: otelcol
# Not in CI: 16 sidecars' recorded spans into one gateway; spans/s per
# gateway core, RSS, drops, what sampling kept. FLEET_FLAGS passes more
# flags (e.g. -rate 20000 -duration 60s -sample 1).
FLEET_FLAGS ?=
fleet: otelcol ## Load one gateway with 16 sidecars' recorded spans (spans/s per core, RSS, drops)
	$(GO) run ./test/fleet -otelcol $(abspath $(OTELCOL)) $(FLEET_FLAGS)
.PHONY: fleet

# -p 1: one test binary at a time. The accuracy and end-to-end tiers time
# real traced runs; sharing two cores with another package's tests turns
# scheduling noise into measurement noise.
test: build simgpu jaeger helm ## Run every test (root; first run ~42 min on 2 cores, then ~23 min; quick check: make unit)
	GAPTRACE_BIN=$(abspath $(BIN)) GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) GAPTRACE_JAEGER=$(abspath $(JAEGER)) GAPTRACE_HELM=$(abspath $(HELM)) \
		tools/gotest-retry.sh -p 1 -count=1 -timeout 40m ./... ./testdata/simgpu/

# The quick tier: every test that needs no root, no Jaeger and no simulated
# GPU build; those skip under -short, saying which tier runs them.
unit: ## Quick tests, no root/Jaeger/simulated GPU (go test -short ./...)
	$(GO) test -short -count=1 ./...

# Not in CI: a long run that shows leaks and slow paths. SOAK=10m shortens it.
SOAK ?= 1h
soak: build simgpu ## gaptrace on simtrain at top launch rate for SOAK=1h: RSS, CPU
	SOAK=$(SOAK) GAPTRACE_BIN=$(abspath $(BIN)) GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) tools/soak.sh

# Not in CI: tracing's cost on a launch-bound simtrain, untraced vs each
# probe set in interleaved pairs, medians with bootstrap 95% intervals.
# BENCH_FLAGS passes more flags (e.g. -reps 40 -steps 20000).
BENCH_FLAGS ?=
bench: build simgpu ## Overhead table: untraced, null, lite, auto, full on simtrain (root)
	$(GO) run ./test/bench -gaptrace $(abspath $(BIN)) -simgpu $(abspath $(SIMGPU_DIR)) $(BENCH_FLAGS)

accuracy: build simgpu ## Print the attribution accuracy table on simtrain scenarios
	GAPTRACE_BIN=$(abspath $(BIN)) GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) \
		$(GO) test -count=1 -timeout 20m -run TestAccuracy -v ./test/accuracy

demo: simgpu build ## Trace the simulated trainer with a mix of stalls (no GPU needed)
	GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) $(BIN) demo

# golangci-lint (v2, .golangci.yml) from its own module file, like Jaeger:
# its dependencies stay out of go.mod. LINT_PKGS narrows a run.
GOLANGCI := build/golangci-lint
LINT_PKGS ?= ./...
$(GOLANGCI): tools/golangci/go.mod
	@mkdir -p build
	cd tools/golangci && $(GO) build -o $(abspath $(GOLANGCI)) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

lint: $(GOLANGCI) ## gofmt + go vet + golangci-lint (first build ~2 min)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GOLANGCI) run --allow-parallel-runners $(LINT_PKGS)

clean: ## Remove build outputs
	rm -rf bin build

.PHONY: help build generate fmt-bpf simgpu jaeger helm test unit soak bench accuracy demo lint clean
