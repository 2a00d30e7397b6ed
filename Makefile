# The commands the README names. Everything is installed into .venv by these rules.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROTO := protos/deviceplugin/v1beta1/api.proto protos/pluginregistration/v1/api.proto
PYTEST_FLAGS ?= -q

.PHONY: install run test lint proto bench soak image clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" examples/run-local.sh

# mypy cannot follow setuptools' package-dir mapping (backends/ installs as ascend_agent.backends), so it
# checks a tree of links laid out as the installed package is.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf build/mypy && mkdir -p build/mypy/ascend_agent
	for f in ascend_agent/*; do ln -s "$(CURDIR)/$$f" build/mypy/ascend_agent/; done
	ln -s "$(CURDIR)/backends" build/mypy/ascend_agent/backends
	cd build/mypy && "$(abspath $(BIN))/mypy" --config-file "$(CURDIR)/pyproject.toml" -p ascend_agent

test: lint
	$(BIN)/pytest $(PYTEST_FLAGS)

proto: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I protos \
		--python_betterproto2_out=ascend_agent/_proto \
		--python_betterproto2_opt=client_generation=async,server_generation=async $(PROTO)

bench: $(STAMP)
	$(BIN)/python -m bench.run

soak: $(STAMP)
	$(BIN)/pytest -q -s -m soak -o addopts=''

image:
	@engine=$$(command -v podman || command -v docker) || { echo "make image: no container engine (podman or docker) here"; exit 1; }; \
	$$engine build -f Containerfile -t ascend-agent:0.1.0 .

clean:
	rm -rf $(VENV) dist build *.egg-info bench/results
