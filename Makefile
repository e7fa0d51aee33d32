# basal — one command per job. `make test` works on a fresh machine: it creates .venv and installs everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-all determinism bench lint serve clean

venv: $(STAMP)

# torch is installed first and by exact version, so that no dependency can pull a (multi-GB) CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(PY) -m pytest -q

# the cross-backend determinism suite alone, with a one-line verdict per backend x dtype
determinism: $(STAMP)
	$(PY) -m pytest -q tests/determinism

# every benchmark suite, CPU-sized (mini shapes cut to 1 layer), tables and plots in bench/results
bench: $(STAMP)
	$(VENV)/bin/basal bench --plot

# serves the built-in demo model on 127.0.0.1:8000 (synthetic: its answers carry no meaning)
serve: $(STAMP)
	$(VENV)/bin/basal serve $(SERVE_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
