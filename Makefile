# AAH Studio: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -c1-16)
export AAH_DATA_DIR ?= $(CURDIR)/data
# OpenMP threads sleep at barriers instead of spinning (much faster on a shared CPU; see bench/__init__.py)
export OMP_WAIT_POLICY ?= PASSIVE
export AAH_API_PORT ?= 8000
export AAH_UI_PORT ?= 8501

.PHONY: setup bytecode browser postgres slurm system-packages lint pytest test bench demo demo-model clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==24.3.1
	# torch==2.13.0 is pinned: pip takes the local CPU wheel (never a CUDA build).
	# pip compiles bytecode on one core; `bytecode` below does it on every core, beside lint.
	$(PIP) install -q --no-compile -r requirements.txt -r requirements-dev.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-* $(VENV)/.compiled-*; touch $@

# This environment may set PYTHONDONTWRITEBYTECODE, so without .pyc files every process would compile what it
# imports (`import torch` 3.3 s against 1.8 s). A file that is not Python 3.11 (torch ships a 3.12-only test
# helper) fails to compile and is skipped, as pip does. The packages' own test suites (2,500 files under tests/
# folders) are never imported, so they are skipped. `make test` runs this beside lint (mypy uses one core).
COMPILED := $(subst .installed-,.compiled-,$(STAMP))
bytecode: $(COMPILED)
$(COMPILED): $(STAMP)
	$(PY) -m compileall -q -j 0 -x '/tests/' $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null || true
	touch $@

# Debian packages the tests use (never a browser download): Chromium for the browser tests, PostgreSQL's server
# binaries (tests/postgres.py starts a throwaway server, never the packaged cluster), Slurm, slurmrestd and munge
# (tests/clusters/ start their own daemons from a generated slurm.conf). Installing needs root; without them the
# tests that need them are skipped. `make test` installs all that are missing in one apt-get, beside pip.
HAVE_CHROMIUM := test -x /usr/bin/chromium
HAVE_POSTGRES := ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
HAVE_SLURM := command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v slurmrestd >/dev/null
apt_install = if [ "$$(id -u)" != 0 ]; then echo "warning: not root, $(1) not installed; the tests that need them will be skipped"; \
  else (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null) \
    || echo "warning: could not install $(1); the tests that need them will be skipped"; fi

browser:
	@$(HAVE_CHROMIUM) || { $(call apt_install,chromium chromium-driver); }
postgres:
	@$(HAVE_POSTGRES) || { $(call apt_install,postgresql); }
slurm:
	@$(HAVE_SLURM) || { $(call apt_install,slurm-wlm slurmrestd munge); }
system-packages:
	@missing=""; $(HAVE_CHROMIUM) || missing="$$missing chromium chromium-driver"; \
	$(HAVE_POSTGRES) || missing="$$missing postgresql"; $(HAVE_SLURM) || missing="$$missing slurm-wlm slurmrestd munge"; \
	if [ -n "$$missing" ]; then $(call apt_install,$$missing); fi

# Lint first: ruff (pyflakes, pycodestyle, isort, bugbear, no print in library code), then mypy on the
# engine, the client, tracking and the service (pyproject.toml says which rules and files); an error in
# either fails `make test`.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# PYTEST_ARGS narrows the run (e.g. PYTEST_ARGS="tests/core -k attention"). A run that collects no test
# fails (pytest's exit 5): a selection that matches nothing is a mistake, not a pass.
# PYTEST_WORKERS: pytest-xdist processes, one per core of the 2-core CI box (tests/conftest.py sends each
# module, and the tests sharing one browser or one cluster, whole to one worker); 0 runs in one process.
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2
# pytest runs with bytecode writing allowed even where the environment sets PYTHONDONTWRITEBYTECODE: its
# assertion rewriting of the plugins and test modules is then cached once, not redone by every worker and
# nested pytest (about 8 s of CPU each).
pytest: bytecode
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -x -n $(PYTEST_WORKERS) --durations=15 $(PYTEST_ARGS)

# The apt packages download and unpack while pip installs (one waits on the network, the other mostly on the
# CPU); then lint beside the bytecode compilation, then pytest.
test:
	$(MAKE) --no-print-directory -j2 setup system-packages
	$(MAKE) --no-print-directory -j2 lint bytecode
	$(MAKE) --no-print-directory pytest

bench: bytecode
	$(PY) -m bench.run_all

# Starts the API (127.0.0.1:$AAH_API_PORT) and the dashboard (127.0.0.1:$AAH_UI_PORT) on $AAH_DATA_DIR;
# Ctrl-C stops both. Server logs go to $AAH_DATA_DIR/logs/.
demo: bytecode
	$(VENV)/bin/aah serve

# Retrains the shipped demo checkpoint from scratch (about 40-60 minutes on a 2-core CPU).
demo-model: setup
	rm -f data/demo.metrics.jsonl
	$(VENV)/bin/aah train --preset demo --out data/demo
	mv data/demo.metrics.jsonl data/demo/history.jsonl

clean:
	rm -rf $(VENV) .pytest_cache
