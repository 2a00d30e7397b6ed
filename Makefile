# The commands the README names. Everything is installed into .venv by these rules.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROTO := protos/deviceplugin/v1beta1/api.proto
PYTEST_FLAGS ?= -q

.PHONY: install run test lint proto bench soak image image-test clean

# The interpreter is checked before .venv is made: on an older Python, pip's resolver searches for minutes
# before it gives up. $(error) in the recipe stops only the targets that need .venv, with one line.
PYTHON_MIN := 3.11
_python_version = $(shell $(PYTHON) -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
_python_ok = $(shell $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < ($(subst .,$(comma),$(PYTHON_MIN))))' 2>/dev/null && echo yes)
comma := ,

$(STAMP): pyproject.toml
	$(if $(_python_ok),,$(error ascend-agent needs Python $(PYTHON_MIN) or newer but $(PYTHON) is $(or $(_python_version),not found); pick another with make PYTHON=python$(PYTHON_MIN)))
	$(PYTHON) -m venv --clear $(VENV)
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
	@engine=$$(command -v podman || command -v docker || command -v buildah) || { echo "make image: no podman, docker or buildah here"; exit 1; }; \
	$$engine build -f Containerfile -t ascend-agent:0.1.0 .

# Builds the image with buildah (no daemon) and runs the agent inside it; needs root. See tests/image/.
image-test:
	tests/image/image-test.sh

clean:
	rm -rf $(VENV) dist build *.egg-info bench/results
