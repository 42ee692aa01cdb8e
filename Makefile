# rmqdelay developer tasks.  `make test` is the documented test command; CI runs it.
#
#   make venv     .venv with the package, its dev and dashboard extras (redone when
#                 pyproject.toml changes)
#   make broker   make sure a RabbitMQ broker is up (scripts/broker.py)
#   make lint     ruff + mypy (rmqdelay, tests, bench, scripts), with the dev and dashboard
#                 extras alone
#   make test     lint, then pytest over tests/ with coverage of rmqdelay and its floor
#                 (PYTEST_ARGS='-k foo -x' passes options through, and lifts the floor)
#   make unit     the broker-free tests only (tests/unit), in seconds; no broker is started
#   make test-browser  the dashboard in headless Chromium (tests/browser, Selenium; installs
#                 Debian's chromium and chromium-driver when missing); CI runs it beside make test
#   make screenshots  the same, its screenshots written to docs/screenshots (the docs')
#   make demo     run examples/seeds_demo.py against the broker
#   make test-rmq43  the suite against RabbitMQ 4.3 in a Debian sid chroot on :5683
#                 (make rmq43-stop); CI runs its tests/broker beside `make test` (3.10)
#   make test-rmq4  the same against RabbitMQ 4.0 in a trixie chroot on :5682 (rmq4-stop)
#   make test-deps  the publishers' and worker's tests on the oldest and the newest pika,
#                 aio-pika, aiormq, pamqp and yarl that pyproject.toml allows
#   make cluster  a local 3-node RabbitMQ 4.3 cluster on :5721-5723, URLs printed masked
#                 (cluster-stop; CLUSTER_RABBITMQ=4: 4.0 on :5711-5713; 3: the host's
#                 3.10 on :5701-5703)
#   make cluster-test  kill -9, rolling-restart and partition tests on a local 3-node cluster
#   make dist     a wheel in dist/ (the package is not on PyPI yet)
#   make interop-deps  the Node publisher's locked npm packages (tests/interop/node), which
#                 the x-delay bridge's interop test also installs on first use
#   make docs     the docs site (MkDocs, Material) into site/, --strict as CI builds it;
#                 installs the docs extra first
#   make bench    install the bench extras, run python -m bench (BENCH_ARGS passes through)
#   make bench-compare  publish and worker figures of this tree against BENCH_BASE (a git
#                 revision, default main), side by side in one run (BENCH_COMPARE_ARGS)
#   make clean    caches and build output (distclean also removes .venv)
#
# The broker comes from scripts/broker.py: $RMQDELAY_URL, else 127.0.0.1:5672, else a
# testcontainers container (started by pytest's fixture), else Debian's rabbitmq-server.
# Its URL is exported as RMQDELAY_URL to pytest, the demo and the bench.  For the tests and
# the bench it enables rabbitmq_management on a local broker, saying so first when it did
# not start that broker; the demo does not need it (--no-management).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test
.DELETE_ON_ERROR:

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP_DEV := $(VENV)/.stamp-dev
STAMP_BENCH := $(VENV)/.stamp-bench
STAMP_DOCS := $(VENV)/.stamp-docs
PYTEST_ARGS ?=
# pytest-xdist workers for make test and the chroot suites (0: one process). The suites
# wait on the broker's TTL timers far more than they compute (4.3's tests/broker: 17 % of
# a core, 15 min 18 s in one process, 6 min 15 s on three workers); a broker test file
# runs on one worker, and a test that changes the whole node (whole_node) runs alone on
# it (tests/conftest.py).
PYTEST_WORKERS ?= 2
XDIST = -n $(PYTEST_WORKERS) --dist loadgroup
# pyproject's coverage floor ([tool.coverage.report] fail_under) holds for the full suite
COV_FLOOR = $(if $(strip $(PYTEST_ARGS)),--cov-fail-under=0)
DEMO_ARGS ?=
BENCH_ARGS ?=

# Python 3.10+ to build the venv with; python3.11 first when present.
ifndef BOOT_PYTHON
BOOT_PYTHON := $(shell for p in python3.11 python3 python3.13 python3.12 python3.10; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	2>/dev/null && { command -v $$p; break; }; done)
endif

# Shell snippet: export RMQDELAY_URL=<broker URL> unless the broker is a testcontainers
# one (then broker.py prints no URL and pytest's fixture starts the container); and
# RMQDELAY_MANAGEMENT_URL when that broker's API is not the default :15672 (the script's
# own node on :5674 has it on :15674), unless it is set already.
WITH_BROKER = out="$$($(PY) scripts/broker.py --quiet --print-management)"; \
	url="$$(printf '%s\n' "$$out" | sed -n 1p)"; mgmt="$$(printf '%s\n' "$$out" | sed -n 2p)"; \
	if [ -n "$$url" ]; then export RMQDELAY_URL="$$url"; fi; \
	case "$$mgmt" in ""|*:15672|*:15672/) ;; *) export RMQDELAY_MANAGEMENT_URL="$${RMQDELAY_MANAGEMENT_URL:-$$mgmt}";; esac; \
	unset out url mgmt;

.PHONY: venv broker lint test unit docs test-browser screenshots test-rmq43 rmq43-stop test-rmq4 rmq4-stop cluster cluster-stop cluster-test test-oldest test-deps demo bench bench-compare dist interop-deps clean distclean

venv: $(STAMP_DEV)

$(STAMP_DEV): pyproject.toml
	@if [ -z "$(BOOT_PYTHON)" ]; then echo "make venv: need python3 >= 3.10 (python3.11 preferred)" >&2; exit 1; fi
	@if [ ! -x $(PY) ]; then echo "creating $(VENV) with $(BOOT_PYTHON)"; $(BOOT_PYTHON) -m venv $(VENV); fi
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,dashboard]'
	@touch $@

$(STAMP_BENCH): pyproject.toml $(STAMP_DEV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,dashboard,bench]'
	@touch $@

$(STAMP_DOCS): pyproject.toml $(STAMP_DEV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,dashboard,docs]'
	@touch $@

# The docs site (mkdocs.yml): strict, so a broken link or anchor, or a page out of the nav,
# fails. The CLI, settings, API and module references are generated from the code
# (scripts/docs_hooks.py, mkdocs-click, mkdocstrings); the Performance page's figures are
# written by `python -m bench report`. No broker needed.
docs: $(STAMP_DOCS)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Succeeds on a Docker-only machine without starting anything (pytest starts the container).
broker: venv
	@$(PY) scripts/broker.py > /dev/null

# mypy checks bench/ and scripts/ too; the bench extras' libraries are typed as Any when
# they are not installed (pyproject's mypy overrides), so the dev extras suffice
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check rmqdelay tests bench scripts examples docker
	$(VENV)/bin/mypy

test: venv lint broker
	@$(WITH_BROKER) \
	rc=0; $(VENV)/bin/pytest -q $(XDIST) --durations=15 --cov --cov-report=term $(COV_FLOOR) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5); that is a failure" >&2; fi; \
	exit $$rc

unit: venv
	$(VENV)/bin/pytest -q -m unit tests/unit $(PYTEST_ARGS)

# The dashboard driven in a real browser: Debian's chromium and chromium-driver, headless,
# through Selenium (the dev extra); installed here when missing (as root, like CI). The
# tests save their screenshots in $RMQDELAY_SCREENSHOTS, else a temp folder (the tree
# stays clean); `make screenshots` runs them writing docs/screenshots (the dashboard guide shows one).
test-browser: venv broker
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
		echo "test-browser: installing chromium and chromium-driver"; \
		apt-get install -y -qq chromium chromium-driver >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }; \
	fi; \
	$(WITH_BROKER) \
	rc=0; $(VENV)/bin/pytest -q -p no:cacheprovider -m browser tests/browser $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-browser: pytest collected no tests (exit 5); that is a failure" >&2; fi; \
	exit $$rc

screenshots:
	RMQDELAY_SCREENSHOTS=$(CURDIR)/docs/screenshots $(MAKE) test-browser

# The whole suite against a newer RabbitMQ from a Debian chroot built once on first use
# (scripts/brokers/chroot.py; where: $$RMQDELAY_RMQ43_ROOT, $$RMQDELAY_RMQ4_ROOT): 4.3.6
# (sid) on :5683, management :15683; 4.0.5 (trixie) on :5682, :15682. The node is
# stopped after unless it was running before (others may be using it); rmq43-stop
# stops it. $(call CHROOT_SUITE,release,AMQP port)
define CHROOT_SUITE
@up=0; $(PY) scripts/broker.py $(1) running 2>/dev/null && up=1; \
$(PY) scripts/broker.py $(1) start > /dev/null; \
rc=0; RMQDELAY_URL=amqp://guest:guest@127.0.0.1:$(2)/%2F \
	RMQDELAY_MANAGEMENT_URL=http://127.0.0.1:$$(($(2) + 10000)) \
	$(VENV)/bin/pytest -q -p no:cacheprovider $(XDIST) --durations=15 $(PYTEST_ARGS) || rc=$$?; \
if [ $$up = 0 ]; then $(PY) scripts/broker.py $(1) stop || rc=1; \
else echo "test-$(1): the node was running before: left running ($(1)-stop stops it)"; fi; \
if [ $$rc -eq 5 ]; then echo "test-$(1): pytest collected no tests (exit 5); that is a failure" >&2; fi; \
exit $$rc
endef

test-rmq43: venv
	$(call CHROOT_SUITE,rmq43,5683)

rmq43-stop:
	$(PY) scripts/broker.py rmq43 stop

test-rmq4: venv
	$(call CHROOT_SUITE,rmq4,5682)

rmq4-stop:
	$(PY) scripts/broker.py rmq4 stop

# A local 3-node cluster from the chroot of `make test-rmq43` (built once): RabbitMQ 4.3,
# nodes rmqd-c43-1..3 on 127.0.0.1:5721-5723 (management 15721-15723), data inside the
# chroot; cluster-test starts it, runs the failover tests (kill -9 of a node, a rolling
# restart, a 30 s partition of the clients' node and of another, made with nftables:
# scripts/brokers/partition.py; about 5 minutes) and stops it. CLUSTER_RABBITMQ=4:
# RabbitMQ 4.0 from the chroot of `make test-rmq4`, nodes rmqd-c4-1..3 on :5711-5713;
# CLUSTER_RABBITMQ=3: the host's rabbitmq-server 3.10 on 5701-5703 (data:
# scripts/brokers/cluster.py), whose dead-letter worker can strand messages in the
# rolling restart (fixed in 3.10.20).
CLUSTER_RABBITMQ ?= 43
CLUSTER = $(PY) scripts/broker.py cluster --rabbitmq $(CLUSTER_RABBITMQ)

cluster: venv
	$(CLUSTER) start

cluster-stop:
	$(CLUSTER) stop

cluster-test: venv
	@command -v nft >/dev/null 2>&1 || { echo "cluster-test: installing nftables (the partition tests)"; \
		apt-get install -y -qq nftables >/dev/null || { apt-get update -qq && apt-get install -y -qq nftables >/dev/null; }; }; \
	$(CLUSTER) start || { $(CLUSTER) stop; exit 1; }; \
	export RMQDELAY_CLUSTER_RABBITMQ=$(CLUSTER_RABBITMQ); \
	export RMQDELAY_CLUSTER_URLS="$$($(CLUSTER) urls)"; \
	export RMQDELAY_CLUSTER_MANAGEMENT_URLS="$$($(CLUSTER) management-urls)"; \
	rc=0; $(VENV)/bin/pytest -q -s -p no:cacheprovider -m cluster tests/cluster $(PYTEST_ARGS) || rc=$$?; \
	$(CLUSTER) stop || rc=1; \
	exit $$rc

# The oldest supported Python (3.10), when one is installed (on PATH, or a pyenv version
# under PYENV_ROOT): the pure core, the publishers and the worker, in a venv of its own
# (pip may pick older dependencies).
PYENV_ROOT ?= $(HOME)/.pyenv
PY310 ?= $(shell for p in python3.10 $$(ls -d $(PYENV_ROOT)/versions/3.10*/bin/python 2>/dev/null); do \
	$$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null && { echo $$p; break; }; done)
test-oldest: broker
	@if [ -z "$(PY310)" ]; then echo "test-oldest: no Python 3.10 here; skipped"; exit 0; fi; \
	[ -x .venv310/bin/python ] || $(PY310) -m venv .venv310; \
	.venv310/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,dashboard]'; \
	$(WITH_BROKER) .venv310/bin/pytest -q -p no:cacheprovider tests/unit \
		tests/broker/test_delivery.py tests/broker/test_worker.py

# The publishers' and the worker's tests on both ends of the client libraries' ranges in
# pyproject.toml, each in a venv of its own: .venv-deps-oldest pins every lower bound
# (scripts/deps_ends.py) on the oldest supported Python when one is here (PY310, below),
# .venv-deps-newest takes the newest each range allows; the other dependencies are the
# newest allowed in both. One end after the other, on one broker. DEPS_ENDS=oldest runs
# one end: CI does, as its fresh .venv holds the newest versions already, on which
# `make test` runs the whole suite.
DEPS_ENDS ?= oldest newest
DEPS_TESTS ?= tests/unit tests/broker/test_delivery.py tests/broker/test_pika_paths.py \
	tests/broker/test_publisher_recovery.py tests/broker/test_worker.py \
	tests/broker/test_worker_broker_semantics.py
test-deps: broker
	@rc=0; for end in $(DEPS_ENDS); do \
		venv=.venv-deps-$$end; py="$(BOOT_PYTHON)"; \
		if [ $$end = oldest ] && [ -n "$(PY310)" ]; then py="$(PY310)"; fi; \
		want="$$($$py -c 'import sys; print(sys.version_info[:2])')"; \
		have="$$($$venv/bin/python -c 'import sys; print(sys.version_info[:2])' 2>/dev/null || true)"; \
		if [ "$$want" != "$$have" ]; then rm -rf $$venv; $$py -m venv $$venv; fi; \
		$(PY) scripts/deps_ends.py $$end > $$venv/constraints.txt; \
		$$venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade \
			--upgrade-strategy eager -c $$venv/constraints.txt -e '.[dev,dashboard]'; \
		echo "== test-deps, $$end: $$($$venv/bin/python --version) $$($$venv/bin/python scripts/deps_ends.py --installed $$end) =="; \
		( $(WITH_BROKER) $$venv/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(DEPS_TESTS) ) \
			|| { rc=1; echo "test-deps: FAILED on the $$end versions" >&2; }; \
	done; exit $$rc

# The demo needs no management API: never enable its plugin for it.
demo: venv
	$(PY) scripts/broker.py --quiet --no-management --run -- $(PY) examples/seeds_demo.py $(DEMO_ARGS)

bench: $(STAMP_BENCH) broker
	$(PY) scripts/broker.py --quiet --run -- $(PY) -m bench $(BENCH_ARGS)

# Needs no bench extra: raw pika and aio-pika (the references) are the package's own deps.
BENCH_BASE ?= main
BENCH_COMPARE_ARGS ?=
bench-compare: venv broker
	$(PY) scripts/broker.py --quiet --run -- $(PY) -m bench compare $(BENCH_BASE) $(BENCH_COMPARE_ARGS)

# A wheel in dist/: rmqdelay is not on PyPI yet, so this is how to install it elsewhere.
dist: venv
	rm -rf dist build
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/*.whl

# The x-delay bridge's Node publisher (amqplib, as package-lock.json pins it); needs node
# and npm. tests/broker/test_bridge_interop.py runs the same `npm ci` when they are missing.
interop-deps:
	cd tests/interop/node && npm ci --no-audit --no-fund

clean:
	rm -rf build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
