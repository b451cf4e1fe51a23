# qwenweb: `make demo` runs the demo on a fresh machine; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: system-deps apt-packages setup demo test test-postgres test-redis test-python test-js test-browser soak screenshots lint check clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP)

# What the tests need from the system (Debian's packages; root, as on CI): Node for the
# JavaScript tests, npm for axe-core (package.json / package-lock.json: `npm ci` into
# node_modules/, which the accessibility tests inject into the pages), Chromium for the
# browser tests (never a test tool's own browser download) with the fonts its pages render
# in (DejaVu Sans: what `system-ui` resolves to; Liberation Mono: the monospace), and
# redis-server: the Redis end-to-end tests start private ones, and a few use the one at
# 127.0.0.1:6379 (under a key prefix of their own, never flushed), started here when none
# answers. Only what is missing is installed, named on one line first, without the
# packages Debian merely recommends (Chromium's alone would bring udev, avahi-daemon and
# a hundred more); with everything present it installs nothing and says so.
system-deps: apt-packages node_modules/.installed
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || { \
		echo "starting redis-server on 127.0.0.1:6379 (none answered; the Redis tests use it)"; \
		redis-server --bind 127.0.0.1 --port 6379 --save '' --daemonize yes; }

apt-packages:
	@set -e; packages=""; reasons=""; \
	want() { packages="$$packages $$1"; reasons="$$reasons$${reasons:+, }$$1 ($$2)"; }; \
	installed() { dpkg-query -W -f='$${Status}' "$$1" 2>/dev/null | grep -q 'ok installed'; }; \
	command -v node >/dev/null || want nodejs "the JavaScript tests"; \
	command -v npm >/dev/null || want npm "npm ci of axe-core"; \
	[ -x /usr/bin/chromium ] || want chromium "the browser tests"; \
	installed fonts-dejavu-core || want fonts-dejavu-core "the browser tests' sans-serif"; \
	installed fonts-liberation || want fonts-liberation "the browser tests' monospace"; \
	[ -x /usr/bin/redis-server ] || want redis-server "the Redis tests"; \
	if [ -z "$$packages" ]; then \
		echo "system packages: node, npm, chromium, its fonts and redis-server are installed"; \
		exit 0; \
	fi; \
	echo "installing $$reasons with apt-get --no-install-recommends"; \
	apt-get update -q; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$packages

node_modules/.installed: package.json package-lock.json | apt-packages
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# `make demo ARGS="--port 8765"` passes options to `manage.py demo` (see its --help).
demo: $(STAMP)
	$(PY) manage.py demo $(ARGS)

# The Python tests run in two passes: first in PYTEST_WORKERS (3) pytest-xdist workers, each test
# module whole in one worker (its servers and fixtures are shared by its tests), then, alone,
# the tests marked `serial` (a pace or a rate a neighbour's load would change; pyproject.toml
# says which and why). Both passes run whatever the first gives; the status is the worse.
# `make test PYTEST_WORKERS=1` gives the plain serial order in the first pass.
PYTEST_WORKERS ?= 3
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile

test: $(STAMP) system-deps
	node --test tests/js/
	status=0; \
	$(PY) -m pytest $(PARALLEL) -m "not serial" || status=$$?; \
	$(PY) -m pytest -m serial || status=$$?; \
	exit $$status

# The integration tests against PostgreSQL: pytest-django creates and drops
# test_qwenweb on that server. Fails, naming the reason, when the server does not answer.
POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/qwenweb

test-postgres: $(STAMP)
	$(PY) -m tests.support.postgres $(POSTGRES_URL)
	DATABASE_URL=$(POSTGRES_URL) $(PY) -m pytest $(PARALLEL) tests/integration

# The whole single-process suite again with the Redis backend, on the Redis at
# QWENWEB_REDIS_URL (default redis://127.0.0.1:6379/0), under a key prefix of this run's
# (qwtest-<random>); its keys are deleted afterwards, pass or fail. Never FLUSHDB.
# The tests marked own_backend start servers with a backend of their own (Redis clusters,
# memory servers in network namespaces) and ran in `make test` already: not run twice.
# Of the browser tier only the session page's own module runs again (the page over the
# Redis backend: stream, resume, reconnect): the rest tests the page's own logic, which the
# backend does not reach, and ran in `make test`; the backend's contract under Redis is
# what tests/integration and tests/e2e check. Likewise the tests that run across servers
# (granian, daphne, uvicorn, runserver: each one's flow control and shutdown) run on the
# production entry point only (tests.support.backend.server_matrix), and the modules
# marked transport_only (sockets, HTTP/2, static files) not at all. Both passes as in
# `make test`. (It keeps `.ci/run` under 30 minutes.)
REDIS_BROWSER_TESTS := tests/browser/test_session_page.py

test-redis: $(STAMP)
	$(PY) -m tests.support.backend check
	prefix=qwtest-$$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n'); status=0; \
	run() { QWENWEB_BACKEND=redis QWENWEB_REDIS_KEY_PREFIX=$$prefix $(PY) -m pytest \
		tests/unit tests/integration tests/e2e $(REDIS_BROWSER_TESTS) -p no:cacheprovider \
		"$$@" || status=$$?; }; \
	run $(PARALLEL) -m "not own_backend and not transport_only and not serial"; \
	run -m "serial and not own_backend and not transport_only"; \
	$(PY) -m tests.support.backend delete $$prefix; exit $$status

# The session page in headless Chromium (also part of `make test`); needs /usr/bin/chromium.
test-browser: $(STAMP) system-deps
	$(PY) -m pytest -m browser tests/browser

# Long rounds of what `make test` runs short (not part of `.ci/run`): the tabs of one
# session opened together, with a snapshot answered late, over HTTP/1.1 and HTTP/2
# (QWENWEB_SOAK_ROUNDS rounds, default 20; `make test` runs 2), then the durable backend's
# server killed with SIGKILL 20 times and stopped with SIGTERM 5 times while a publisher
# posts (`make test`: 5 and 1), then the Redis primary of a Sentinel group killed with
# SIGKILL 5 times, every 20 s, under a 200 events/s publisher and four resuming readers
# (`make test`: one failover per case), then a primary of a 3+3 Redis Cluster killed 3 times
# under load (`make test`: once), then a reader frozen for 110 s while it is evicted
# (`make test`: 40 s). Tests that have a soak form read these variables.
SOAK_ROUNDS ?= 20
SOAK_TESTS := tests/browser/test_gap_repair.py

soak: $(STAMP) system-deps
	QWENWEB_SOAK_ROUNDS=$(SOAK_ROUNDS) $(PY) -m pytest -q $(SOAK_TESTS)
	QWENWEB_SOAK_KILLS=20 QWENWEB_SOAK_TERMS=5 $(PY) -m pytest -q -s tests/e2e/test_durable_restart.py
	QWENWEB_SOAK_FAILOVERS=5 $(PY) -m pytest -q -s tests/e2e/test_redis_failover_load.py
	QWENWEB_SOAK_CLUSTER_FAILOVERS=3 $(PY) -m pytest -q -s tests/e2e/test_redis_cluster.py
	QWENWEB_SOAK_FREEZE_S=110 $(PY) -m pytest -q -s tests/e2e/test_frozen_reader.py

# Re-take docs/session-page-*.png from the browser tests that reach those states: live
# (1440 px), phone (390 px), evicted while paused and after the recovery, ended, and a
# turn with its tool calls.
screenshots: $(STAMP) system-deps
	QWENWEB_SCREENSHOT_DIR=docs $(PY) -m pytest -q -m browser tests/browser \
		-k "demo_agent or closed or 390px_phone or paused_page or duration_and_outcome"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

check: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
