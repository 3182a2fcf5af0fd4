# reshape — set-up and checks. `make run` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON_VERSION := $(shell cat .python-version)
# pyenv's shim (or any python3.12 on PATH) provides the interpreter named in .python-version.
PYTHON ?= $(shell command -v python$(PYTHON_VERSION) || echo python3)
VENV := .venv
BIN := $(VENV)/bin
LISTEN ?= 127.0.0.1:8080
ADMIN ?= 127.0.0.1:9464
POLICY ?= reshape/policy/default.yaml
CONFDIR ?= $(HOME)/.reshape
PYTEST_ARGS ?=

.PHONY: run test unit check lint venv report-deps test-deps system-deps lock clean lab-plt lab-booster mitmproxy-suite

# The proxy in the foreground (Ctrl-C stops it): the README's quick start. Its pid is in
# CONFDIR/reshape.pid (kill -HUP reloads the policy).
run: $(VENV)/.installed
	$(BIN)/reshape ca init --confdir $(CONFDIR)
	$(BIN)/reshape run --listen $(LISTEN) --admin $(ADMIN) --policy $(POLICY) \
	  --confdir $(CONFDIR) --pid-file $(CONFDIR)/reshape.pid

venv: $(VENV)/.installed

# The same three install steps run in the Dockerfile.
$(VENV)/.installed: requirements.lock pyproject.toml .python-version
	@$(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; \
	  sys.exit(0 if v == "$(PYTHON_VERSION)" else "need Python $(PYTHON_VERSION), $(PYTHON) is " + v)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# `reshape report`'s extra (scipy, statsmodels, matplotlib), at the versions the locks pin.
report-deps: $(VENV)/.installed
	$(BIN)/pip install --quiet --disable-pip-version-check \
	  -c requirements.lock -c requirements-test.lock -e '.[report]'

$(VENV)/.test-installed: $(VENV)/.installed requirements-test.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements-test.lock
	touch $@

system-deps:
	bash tests/install-system-deps.sh

# h2spec, the HTTP/2 conformance suite tests/hardening/test_h2spec.py runs: built from the Go
# module proxy, at the versions tests/tools/h2spec/go.mod and go.sum pin.
$(BIN)/h2spec: tests/tools/h2spec/go.mod tests/tools/h2spec/go.sum | $(VENV)/.installed system-deps
	cd tests/tools/h2spec && GOBIN=$(abspath $(BIN)) go install github.com/summerwind/h2spec/cmd/h2spec
	touch $@

test-deps: $(VENV)/.test-installed system-deps $(BIN)/h2spec

test: test-deps lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit tests alone: no network, no process (tests/unit/conftest.py), well under a minute.
unit: $(VENV)/.test-installed
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check reshape labkit tests bench
	$(BIN)/ruff format --check reshape labkit tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports  # the architecture's import rules (.importlinter, docs/architecture.md)
	$(BIN)/pylint bench labkit tests

# The lab's full experiments (long: see `python -m bench.lab list`); they need the test dependencies
# (hypercorn origins, Chromium). Results go to bench/RESULTS.md and bench/plots/.
lab-plt lab-booster: lab-%: test-deps
	$(BIN)/python -m bench.lab run $*

# mitmproxy's own test suite with reshape's patches installed (tests/mitmproxy_suite/): needs a
# checkout of mitmproxy at the pinned release, e.g. `git clone -b v12.2.3 https://github.com/
# mitmproxy/mitmproxy`, whose test/ is not in the wheel: make mitmproxy-suite MITMPROXY_SRC=...
# Two of its tlsconfig tests fail here with or without the patches (they expect messages this
# OpenSSL build does not give for SSL 3 and TLS 1.0): deselected. `-c /dev/null`: pytest 9 refuses
# mitmproxy's pyproject.toml, which holds both of pytest's configuration tables.
MITMPROXY_SRC ?=
MITMPROXY_DESELECT := --deselect test/mitmproxy/addons/test_tlsconfig.py::TestTlsConfig::test_configure_tls_version \
  --deselect test/mitmproxy/addons/test_tlsconfig.py::TestTlsConfig::test_configure_ciphers
mitmproxy-suite: $(VENV)/.test-installed
	@test -n "$(MITMPROXY_SRC)" || { echo "make mitmproxy-suite: set MITMPROXY_SRC to a mitmproxy checkout"; exit 2; }
	cd $(MITMPROXY_SRC) && PYTHONPATH=$(CURDIR) $(CURDIR)/$(BIN)/python -m pytest -c /dev/null --rootdir . \
	  -q -p no:cacheprovider -p tests.mitmproxy_suite.reshape_patches -o asyncio_mode=auto \
	  test/mitmproxy/proxy test/mitmproxy/test_http.py test/mitmproxy/addons/test_tlsconfig.py \
	  $(MITMPROXY_DESELECT)

# Re-resolve the pins in pyproject.toml into the lock files (needs the package registry).
lock:
	rm -rf /tmp/reshape-lock && $(PYTHON) -m venv /tmp/reshape-lock
	/tmp/reshape-lock/bin/pip install --quiet .
	/tmp/reshape-lock/bin/pip uninstall --quiet -y reshape
	{ echo "# Resolved runtime dependencies of reshape. Regenerate: make lock"; \
	  /tmp/reshape-lock/bin/pip freeze | LC_ALL=C sort -f; } > requirements.lock
	/tmp/reshape-lock/bin/pip install --quiet -c requirements.lock .[test]
	/tmp/reshape-lock/bin/pip uninstall --quiet -y reshape
	{ echo "# Resolved test dependencies, installed with -c requirements.lock. Regenerate: make lock"; \
	  /tmp/reshape-lock/bin/pip freeze | LC_ALL=C sort -f | grep -vxFf <(grep -v '^#' requirements.lock); } > requirements-test.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
