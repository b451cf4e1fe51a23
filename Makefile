# qwenweb: `make demo` runs the demo on a fresh machine; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-python test-js lint check clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) manage.py demo

test: $(STAMP)
	node --test tests/js/
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

check: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
