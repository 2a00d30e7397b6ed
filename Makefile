# The commands the README names. Everything is installed into .venv by these rules.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Helm's engine (helm-sdkpy, Python >= 3.12) in an environment of its own: make helm-lint, make e2e (below).
HELM_VENV := .venv-helm
HELM_STAMP := $(HELM_VENV)/.installed-stamp
# `make run` needs only what running needs: the package and its runtime dependencies, not the test tools.
RUN_STAMP := $(VENV)/.run-stamp
# The device plugin and registration APIs: the grpc-go kubelet stand-in (make interop) is built from these too.
KUBELET_PROTO := protos/deviceplugin/v1beta1/api.proto protos/pluginregistration/v1/api.proto
PROTO := $(KUBELET_PROTO) protos/podresources/v1/api.proto
# The DRA kubelet plugin's APIs (ascend_agent.kubelet.dra); not part of the grpc-go device plugin stand-in.
DRA_PROTO := protos/dra/v1/api.proto protos/dra/v1beta1/api.proto protos/dra-health/v1/api.proto protos/dra-health/v1alpha1/api.proto
# Three workers (pytest-xdist) on two cores: the suite's tests mostly wait on the agent processes they start
# (1,635 tests: 3 min 18 s, against 4 min 47 s with two workers).
PYTEST_FLAGS ?= -q -n 3

.PHONY: install run run-dra test prometheus-tools lint proto bench docs soak interop interop-packages e2e e2e-build e2e-matrix cluster bench-cluster bench-scale image image-test clean helm-lint helm-render helm-schema release

# The interpreter is checked before .venv is made: on an older Python, pip's resolver searches for minutes
# before it gives up. $(error) in the recipe stops only the targets that need .venv, with one line.
PYTHON_MIN := 3.11
_python_version = $(shell $(PYTHON) -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
_python_ok = $(shell $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < ($(subst .,$(comma),$(PYTHON_MIN))))' 2>/dev/null && echo yes)
comma := ,
# The agent's runner uses -OO (no docstrings in memory) where this bytecode is installed (ascend_agent/runner.py).
COMPILE_OO = $(BIN)/python -OO -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

$(STAMP): pyproject.toml
	$(if $(_python_ok),,$(error ascend-agent needs Python $(PYTHON_MIN) or newer but $(PYTHON) is $(or $(_python_version),not found); pick another with make PYTHON=python$(PYTHON_MIN)))
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	$(COMPILE_OO)
	touch $(STAMP) $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml
	$(if $(_python_ok),,$(error ascend-agent needs Python $(PYTHON_MIN) or newer but $(PYTHON) is $(or $(_python_version),not found); pick another with make PYTHON=python$(PYTHON_MIN)))
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	$(COMPILE_OO)
	touch $(RUN_STAMP)

install: $(STAMP)

run: $(RUN_STAMP)
	PATH="$(abspath $(BIN)):$$PATH" examples/run-local.sh

# The agent as a DRA driver against the tests' API emulator and DRA kubelet stand-in (docs/dra.md).
run-dra: $(STAMP)
	$(BIN)/python examples/dra/run-local.py

# mypy cannot follow setuptools' package-dir mapping (backends/ installs as ascend_agent.backends), so it
# checks a tree of links laid out as the installed package is.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf build/mypy && mkdir -p build/mypy/ascend_agent
	for f in ascend_agent/*; do ln -s "$(CURDIR)/$$f" build/mypy/ascend_agent/; done
	ln -s "$(CURDIR)/backends" build/mypy/ascend_agent/backends
	cd build/mypy && "$(abspath $(BIN))/mypy" --config-file "$(CURDIR)/pyproject.toml" -p ascend_agent

test: lint prometheus-tools
	$(BIN)/pytest $(PYTEST_FLAGS)

# Prometheus' promtool and server (the version tests/prometheus/go.mod pins), from the Go module proxy into a
# cache outside the clone keyed by version (tests/prometheus/build.sh: minutes when cold, then a cache hit);
# their paths go to build/prometheus-tools, where tests/prometheus/ finds them for the alert rules, a scrape
# of the agent and the dashboard's queries. Without go those tests are skipped (under CI=1 they fail).
PROMETHEUS_TOOLS := build/prometheus-tools
prometheus-tools:
	@if command -v $(GO) >/dev/null; then \
		mkdir -p $(dir $(PROMETHEUS_TOOLS)) && tests/prometheus/build.sh > $(PROMETHEUS_TOOLS).partial && \
		mv $(PROMETHEUS_TOOLS).partial $(PROMETHEUS_TOOLS); \
	else echo "make test: no go on PATH, so no promtool or prometheus: tests/prometheus/ is skipped"; fi

# The DRA driver's APIs into a package of their own: dra-health v1 shares protobuf package v1 with podresources,
# and generated together a device plugin would load the DRA health messages with the pod resources.
proto: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I protos \
		--python_betterproto2_out=ascend_agent/_proto \
		--python_betterproto2_opt=client_generation=async,server_generation=async $(PROTO)
	mkdir -p ascend_agent/_proto/dra
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I protos \
		--python_betterproto2_out=ascend_agent/_proto/dra \
		--python_betterproto2_opt=client_generation=async,server_generation=async $(DRA_PROTO)

bench: $(STAMP)
	$(BIN)/python -m bench.run

# The documentation site (mkdocs.yml, docs/) into build/site; --strict fails on a link that does not resolve.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir build/site

soak: $(STAMP)
	$(BIN)/pytest -q -s -m soak -o addopts=''

# The grpc-go kubelet stand-in (tests/interop/kubelet/) and the device-info decoder, a Go module of their own
# (tests/interop/go.mod: the grpc-go and protobuf versions Kubernetes v1.36.3's kubelet uses). The stand-in's Go
# code is generated from protos/ into build/interop/protos by protoc (Debian's protobuf-compiler) with
# protoc-gen-go and protoc-gen-go-grpc installed by `go install` at pinned versions into a cache outside the clone.
INTEROP := build/interop
GO ?= go
GO_CACHE_DIR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ascend-agent
# protoc-gen-go at the protobuf module the stand-in links; protoc-gen-go-grpc at the version the kubelet's own
# api_grpc.pb.go names.
PROTOC_GEN_GO_VERSION := $(shell awk '$$1 == "google.golang.org/protobuf" {print $$2}' tests/interop/go.mod)
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
PROTOC_GEN_GO := $(GO_CACHE_DIR)/tools/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(GO_CACHE_DIR)/tools/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
INTEROP_GO_SOURCES := $(wildcard tests/interop/kubelet/*.go) tests/interop/go.mod tests/interop/go.sum
# What the two decoders share: one strict decode (unknown fields and trailing data refused).
INTEROP_STRICT := tests/interop/strictjson/strictjson.go
INTEROP_PROTO_OPT = module=ascend-agent/protos,Mdeviceplugin/v1beta1/api.proto=ascend-agent/protos/deviceplugin/v1beta1

interop-packages:
	@command -v $(GO) >/dev/null || { echo "make interop: no go on PATH; install Go 1.26 or newer"; exit 1; }
	@command -v protoc >/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "make interop: install Debian's protobuf-compiler (as root), then run it again"; exit 1; }; \
		echo "make interop: installing protobuf-compiler"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq protobuf-compiler >/dev/null || \
			{ apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; }; }

$(PROTOC_GEN_GO): | interop-packages
	GOBIN="$(dir $@)" nice -n 10 $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(PROTOC_GEN_GO_GRPC): | interop-packages
	GOBIN="$(dir $@)" nice -n 10 $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

$(INTEROP)/protos/go.mod: $(KUBELET_PROTO) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) | interop-packages
	rm -rf $(INTEROP)/protos && mkdir -p $(INTEROP)/protos
	protoc -I protos --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --plugin=protoc-gen-go-grpc=$(PROTOC_GEN_GO_GRPC) \
		--go_out=$(INTEROP)/protos --go_opt=$(INTEROP_PROTO_OPT) \
		--go-grpc_out=$(INTEROP)/protos --go-grpc_opt=$(INTEROP_PROTO_OPT) $(KUBELET_PROTO)
	printf 'module ascend-agent/protos\n\ngo 1.26.0\n' > $@

$(INTEROP)/kubelet-standin: $(INTEROP_GO_SOURCES) $(INTEROP)/protos/go.mod
	cd tests/interop && nice -n 10 $(GO) build -mod=readonly -o "$(CURDIR)/$@" ./kubelet

# The device-info ConfigMap decoded by Go's encoding/json into ascend-for-volcano's types (standard library only).
$(INTEROP)/deviceinfo-decode: tests/interop/deviceinfo/main.go $(INTEROP_STRICT) tests/interop/go.mod $(INTEROP)/protos/go.mod
	cd tests/interop && nice -n 10 $(GO) build -mod=readonly -o "$(CURDIR)/$@" ./deviceinfo

# The pods' ascend-910-configuration and hccl.json v1.0/v1.2 decoded by Go's encoding/json (standard library only).
$(INTEROP)/ranktable-decode: tests/interop/ranktable/main.go $(INTEROP_STRICT) tests/interop/go.mod $(INTEROP)/protos/go.mod
	cd tests/interop && nice -n 10 $(GO) build -mod=readonly -o "$(CURDIR)/$@" ./ranktable

interop: $(STAMP) $(INTEROP)/kubelet-standin $(INTEROP)/deviceinfo-decode $(INTEROP)/ranktable-decode
	INTEROP_REQUIRE_STANDIN=1 $(BIN)/pytest -q -s -m interop -o addopts='' tests/interop

# A real single-node Kubernetes (tests/cluster/): one binary with kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl and embedded etcd, built from Kubernetes' own Go modules (the version pinned
# in tests/cluster/go.mod, or K8S_VERSION=v1.x.y: any release the Go module proxy serves) into a cache outside
# the clone keyed by that version and a hash of the module's sources; a second build with the same sources is a
# cache hit. `make test` never builds it.
K8S_VERSION ?=
e2e-build:
	@command -v $(GO) >/dev/null || { echo "make e2e-build: no go on PATH; install Go 1.26 or newer"; exit 1; }
	K8S_VERSION="$(K8S_VERSION)" tests/cluster/build.sh

# The node's runtime (containerd, runc, the CNI plugins: tests/cluster/runtime/build.sh, cached outside the
# clone like the Kubernetes binary) and the agent's image for this machine's architecture, which containerd
# imports (no registry). .venv-helm too: tests/cluster/helm.py installs the chart with Helm's own engine, as an
# operator does.
E2E_IMAGE := build/image/ascend-agent-e2e.oci.tar
NATIVE_ARCH = $$(dpkg --print-architecture 2>/dev/null || echo amd64)
e2e: $(STAMP) $(HELM_STAMP)
	@command -v $(GO) >/dev/null || { echo "make e2e: no go on PATH; install Go 1.26 or newer"; exit 1; }
	binary=$$(K8S_VERSION="$(K8S_VERSION)" tests/cluster/build.sh) && tests/cluster/runtime/build.sh >/dev/null && \
	IMAGE_ARCHIVE=$(E2E_IMAGE) image/build.sh $(NATIVE_ARCH) >/dev/null && \
	E2E_K8S_BINARY="$$binary" E2E_K8S_VERSION="$(K8S_VERSION)" E2E_IMAGES="$(abspath $(E2E_IMAGE))" \
		E2E_REQUIRE_CLUSTER=1 $(BIN)/pytest -q -m e2e_cluster -o addopts='' tests/cluster

# The e2e scenarios on every release of tests/cluster/matrix.py (or MATRIX="v1.33.13 v1.37.2"), each built and
# cached apart; the table goes to build/e2e-matrix.md. Root; not in .ci/run (an hour and more when cold).
MATRIX ?=
e2e-matrix: $(STAMP) $(HELM_STAMP)
	@command -v $(GO) >/dev/null || { echo "make e2e-matrix: no go on PATH; install Go 1.26 or newer"; exit 1; }
	tests/cluster/runtime/build.sh >/dev/null && IMAGE_ARCHIVE=$(E2E_IMAGE) image/build.sh $(NATIVE_ARCH) >/dev/null && \
	$(BIN)/python -m tests.cluster.matrix "$(abspath $(E2E_IMAGE))" $(MATRIX)

# The same node kept up for a person (root): the chart installed on it, a kubectl for it, until Ctrl-C
# (K8S_VERSION as for make e2e).
cluster: $(STAMP) $(HELM_STAMP)
	@command -v $(GO) >/dev/null || { echo "make cluster: no go on PATH; install Go 1.26 or newer"; exit 1; }
	@$(BIN)/python -m tests.cluster.standing --check
	@binary=$$(K8S_VERSION="$(K8S_VERSION)" tests/cluster/build.sh) && tests/cluster/runtime/build.sh >/dev/null && \
	IMAGE_ARCHIVE=$(E2E_IMAGE) image/build.sh $(NATIVE_ARCH) >/dev/null && \
	exec $(BIN)/python -m tests.cluster.standing "$$binary" "$(abspath $(E2E_IMAGE))"

# How long the real cluster takes to see what the agent does (tests/cluster/bench.py); figures in docs/performance.md.
bench-cluster: $(STAMP)
	binary=$$(tests/cluster/build.sh) && generic=$$(tests/cluster/goplugin/build.sh) && \
	tests/cluster/runtime/build.sh >/dev/null && IMAGE_ARCHIVE=$(E2E_IMAGE) image/build.sh $(NATIVE_ARCH) >/dev/null && \
	$(BIN)/python -m tests.cluster.bench "$$binary" "$$generic" "$(abspath $(E2E_IMAGE))" 5 60

# What each agent costs the API server with many nodes (kwok's) and agents, at rest and in storms; root.
# NODES, AGENTS, MODES, REST_SECONDS narrow it; writes build/bench-scale.json.
NODES ?= 1000
AGENTS ?= 100
MODES ?= default,volcano,dra
REST_SECONDS ?= 310
bench-scale: $(STAMP)
	binary=$$(tests/cluster/build.sh) && kwok=$$(tests/cluster/kwok/build.sh) && \
	$(BIN)/python -m tests.cluster.scale "$$binary" "$$kwok" --nodes $(NODES) --agents $(AGENTS) \
		--modes $(MODES) --rest-seconds $(REST_SECONDS)

# linux/amd64 and linux/arm64 (the second under emulation) in one OCI archive, with buildah; root.
image:
	image/build.sh

# What an air-gapped site installs from, in dist/: each image as an OCI archive with its SBOM, the chart as a
# Helm repository, the wheel and sdist, SHA256SUMS (release/build.sh, docs/release.md); root, as make image is.
RELEASE_STAMP := $(VENV)/.release-stamp
$(RELEASE_STAMP): $(RUN_STAMP) release/requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r release/requirements.txt
	touch $(RELEASE_STAMP)

release: $(RELEASE_STAMP) $(HELM_STAMP)
	@command -v $(GO) >/dev/null || { echo "make release: no go on PATH (syft, the SBOM tool, is built with it); install Go 1.26 or newer"; exit 1; }
	RELEASE_PYTHON=$(BIN)/python RELEASE_HELM_PYTHON=$(HELM_VENV)/bin/python release/build.sh

# make image, then the agent run inside each architecture's image (arm64 under emulation); root. See
# tests/image/.
image-test:
	tests/image/image-test.sh

# The Helm chart through Helm v4's own engine (helm-sdkpy), which needs Python 3.12 or newer: the first such
# interpreter on PATH or under pyenv, or HELM_PYTHON, in an environment of its own (.venv-helm). See
# charts/check.py.
_is_3_12 = "$(1)" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null
HELM_PYTHON ?= $(shell for p in python3.14 python3.13 python3.12 python3 \
	$$(pyenv root 2>/dev/null || echo "$${PYENV_ROOT:-$$HOME/.pyenv}")/versions/3.1[2-9]*/bin/python3; do $(call _is_3_12,$$p) && { command -v "$$p"; break; }; done)
_helm_python_ok = $(and $(HELM_PYTHON),$(shell $(call _is_3_12,$(HELM_PYTHON)) && echo yes))

$(HELM_STAMP): charts/requirements.txt
	$(if $(_helm_python_ok),,$(error make helm-lint needs Python 3.12 or newer for helm-sdkpy but $(if $(HELM_PYTHON),$(HELM_PYTHON) is not,none is on PATH or under pyenv); name one with make helm-lint HELM_PYTHON=/path/to/python3.12))
	$(HELM_PYTHON) -m venv --clear $(HELM_VENV)
	$(HELM_VENV)/bin/pip install --quiet --disable-pip-version-check -r charts/requirements.txt
	touch $(HELM_STAMP)

helm-lint: $(HELM_STAMP)
	$(HELM_VENV)/bin/python charts/check.py lint

# After a chart change: the renders tests/unit/test_chart.py reads, in tests/fixtures/helm/.
helm-render: $(HELM_STAMP)
	$(HELM_VENV)/bin/python charts/check.py write-renders

# After a setting is added or changed: values.schema.json's config, made from the agent's settings
# (charts/schema.py; tests/unit/test_chart.py fails while it is stale).
helm-schema: $(STAMP)
	$(BIN)/python charts/schema.py

clean:
	rm -rf $(VENV) $(HELM_VENV) dist build *.egg-info bench/results
