# Everything runs from the project's own .venv, created on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG_DIR ?= examples/mesh
# The ControlZ page test (tests/e2e/test_controlz_ui.py) drives Debian's Chromium through its chromedriver.
BROWSER_STAMP := $(VENV)/.browser

.PHONY: run test bench conformance protos crds docs lint install browser backends envoy clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Debian's chromium + chromium-driver for the page test: installed with apt when missing (as root).
browser: $(BROWSER_STAMP)

$(BROWSER_STAMP):
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		echo "chromium: $$(command -v chromium), chromedriver: $$(command -v chromedriver)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's chromium and chromium-driver (the page test needs them)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else \
		echo "The page test needs Debian's chromium and chromium-driver, and this is not root:"; \
		echo "  sudo apt-get install -y chromium chromium-driver    (then make test again)"; \
		exit 1; \
	fi
	@mkdir -p $(VENV) && touch $@

## Start the control plane on the example mesh (xDS 127.0.0.1:15010, /ready+debug :8080, metrics :15014).
run: $(STAMP)
	$(BIN)/pilot-discovery discovery --configDir $(CONFIG_DIR) --meshConfig examples/mesh.yaml \
		--grpcAddr 127.0.0.1:15010 --httpAddr 127.0.0.1:8080 --monitoringAddr 127.0.0.1:15014 \
		--secureGRPCAddr ""

## The example backends that the example EndpointSlices point at.
backends: $(STAMP)
	$(BIN)/python examples/backends.py

## A sidecar Envoy (no iptables) connected to `make run`; admin on 127.0.0.1:15000.
envoy: $(STAMP)
	$(BIN)/envoy -c examples/envoy-sidecar.yaml --use-dynamic-base-id --concurrency 1

## Two pytest-xdist workers: a serial run keeps about one of two cores busy (e2e tests wait on Envoy
## and the control plane), so a second worker fills the other. Each module runs whole, in order, on
## one worker (loadfile): module-scoped fixtures are set up once, and a module's tests never run
## against each other (only the conformance test binds fixed ports, 80/443). PYTEST_ARGS= runs serially.
PYTEST_ARGS ?= -n 2 --dist loadfile

test: $(STAMP) $(BROWSER_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks all $(if $(FULL),--full,)
	$(BIN)/python -m pytest -q -s -m slow

protos: $(STAMP)
	$(BIN)/python protos/generate.py

## deploy/crds/ from the config models (structural schemas); tests/test_crds.py checks it is current.
crds: $(STAMP)
	$(BIN)/python -m pilot.config.crd_schema

## The table of supported fields per kind, generated from the models (checked by a test).
docs: $(STAMP)
	$(BIN)/python -m pilot.config.fields_table --write docs/fields.md

## ruff, then mypy on pilot/ (configured in pyproject.toml: [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check pilot tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

## The upstream Gateway API conformance tests (tests/conformance, data in tests/data/gateway-api-conformance):
## writes docs/gateway-api-conformance.yaml and the README's statement. Binds the manifests' listener
## ports (80, 443, 8080...): needs root or CAP_NET_BIND_SERVICE. RUN=Name runs one test, no report.
conformance: $(STAMP)
	$(BIN)/python -m tests.conformance $(foreach t,$(RUN),--run $(t))
