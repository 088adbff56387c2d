# gaptrace — why was the GPU idle?
SHELL := /bin/bash
GO ?= go
BIN := bin/gaptrace
SIMGPU_DIR := build/simgpu
JAEGER := build/jaeger
export CGO_ENABLED := 1

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

build: ## Build bin/gaptrace (no clang needed: BPF objects are committed)
	@mkdir -p bin
	$(GO) build -trimpath -ldflags "-X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)" -o $(BIN) ./cmd/sidecar

generate: ## Regenerate BPF objects with bpf2go (needs clang, llvm, libbpf-dev)
	$(GO) generate ./tracer/...

simgpu: ## Build the simulated GPU (libcuda, libnccl, libnvidia-ml, simtrain) into build/simgpu
	$(MAKE) -C testdata/simgpu OUT=$(abspath $(SIMGPU_DIR))

jaeger: $(JAEGER) ## Build Jaeger v1.76 from its own module file (first build ~5 min)
$(JAEGER): tools/jaeger/go.mod
	@mkdir -p build
	cd tools/jaeger && $(GO) build -o $(abspath $(JAEGER)) github.com/jaegertracing/jaeger/cmd/jaeger

# -p 1: one test binary at a time. The accuracy and end-to-end tiers time
# real traced runs; sharing two cores with another package's tests turns
# scheduling noise into measurement noise.
test: build simgpu jaeger ## Run every test (as root for the eBPF tiers)
	GAPTRACE_BIN=$(abspath $(BIN)) GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) GAPTRACE_JAEGER=$(abspath $(JAEGER)) \
		$(GO) test -p 1 -count=1 -timeout 40m ./... ./testdata/simgpu/

accuracy: build simgpu ## Print the attribution accuracy table on simtrain scenarios
	GAPTRACE_BIN=$(abspath $(BIN)) GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) \
		$(GO) test -count=1 -timeout 20m -run TestAccuracy -v ./test/accuracy

demo: build simgpu ## Trace the simulated trainer with a mix of stalls (no GPU needed)
	GAPTRACE_SIMGPU=$(abspath $(SIMGPU_DIR)) $(BIN) demo

lint: ## gofmt + go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...

clean: ## Remove build outputs
	rm -rf bin build

.PHONY: help build generate simgpu jaeger test accuracy demo lint clean
