"""bf16 autocast against fp32 on this CPU: the three costs a CPU run pays, same inputs, one process.

    python benchmarks/cpu_precision.py [--prompts 48] [--doc-tokens 128] [--batch 32] [--steps 3]

Rows, each timed at ``--precision fp32`` and ``bf16`` in turn (A, B, A, B …: a change in load
reaches both sides of the ratio alike; :func:`benchmarks._measure.measure_interleaved`):

* ``generate``: ``synthq generate``'s sampler (one length-sorted batch of ``--prompts`` pylibs
  documents, cut to ``--doc-tokens`` as the generator is trained, top-p 0.8, 24 new tokens) on the
  packaged SmolLM2-135M — prompt prefill and decoding;
* ``finetune_dp``: one ghost-clipping DP step of SmolLM2-135M with LoRA 8 (``finetune-lm``);
* ``retriever``: one non-private in-batch-softmax step of MiniLM-L6 (``train-retriever``).

``time_ratio`` is bf16's step time over fp32's, measured in the same run (below 1: bf16 is
faster). Whether bf16 pays depends on the CPU: with native bf16 arithmetic (AVX512-BF16, AMX) it
does, without it autocast converts and is slower. ``cpu_flags`` records which this CPU has.
``auto`` stays fp32 on a CPU whatever this says (a run's figures should not depend on the CPU);
``--precision bf16`` asks for it. For a figure, run it with nothing else on the cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import add_ratios, emit, measure_interleaved  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def at_precision(step, precision: str):
    """``step`` run inside a stage context at ``precision`` on the CPU, as a stage sets it."""
    from synthq.runtime.precision import use_precision

    def run():
        with use_precision(precision, "cpu"):
            step()

    return run


def generate_step(precision: str, prompts: int, doc_tokens: int):
    """One batch of the sampler over ``prompts`` pylibs documents (the same draws every time)."""
    from synthq.data.pairs import document_text
    from synthq.data.sources import load_source
    from synthq.models.generator import QueryGenerator
    from synthq.models.sampling import Request, sample_queries, stop_token_ids

    generator = QueryGenerator.load("smollm2-135m", max_source_length=doc_tokens)
    generator.model.eval()
    stop_token_ids(generator)
    corpus = load_source("pylibs").corpus
    requests = [Request(d, document_text(corpus[d]), 0) for d in sorted(corpus)[:prompts]]

    def step():
        sample_queries(generator, requests, 0, 0.8, 1.0, 24, False, True)

    return at_precision(step, precision)


def finetune_step(precision: str, batch: int, doc_tokens: int):
    from benchmarks.finetune_step import make_step

    return at_precision(make_step("smollm2-135m", "ghost", 8, batch, doc_tokens), precision)


def retriever_step(precision: str, batch: int, doc_tokens: int):
    from benchmarks.retriever_step import make_step

    return at_precision(make_step("non_private", batch, 32, doc_tokens), precision)


def bf16_flags() -> list[str]:
    """The CPU's bf16-related instruction sets (and AVX-512's base), as Linux reports them."""
    from synthq.runtime.precision import cpu_flags

    return sorted(f for f in cpu_flags() if "bf16" in f or f.startswith("amx") or f == "avx512f")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--doc-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="rows of the finetune and retriever steps")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", default="generate,finetune_dp,retriever")
    parser.add_argument("--no-memory", action="store_true", help="times only (no peak-RSS processes)")
    args = parser.parse_args()
    builders = {
        "generate": (generate_step, (args.prompts, args.doc_tokens)),
        "finetune_dp": (finetune_step, (args.batch, args.doc_tokens)),
        "retriever": (retriever_step, (args.batch, args.doc_tokens)),
    }
    results = {}
    for row in args.rows.split(","):
        function, shape = builders[row]
        configurations = {f"{row}@{p}": (p, *shape) for p in PRECISIONS}
        measured = measure_interleaved(function, configurations, steps=args.steps, memory=not args.no_memory)
        add_ratios(measured, {key: f"{row}@fp32" for key in measured})
        results.update(measured)
    emit(
        {
            "benchmark": "cpu_precision",
            "prompts": args.prompts,
            "doc_tokens": args.doc_tokens,
            "batch": args.batch,
            "steps": args.steps,
            "cpu_flags": bf16_flags(),
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
