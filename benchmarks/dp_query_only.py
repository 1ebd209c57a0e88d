"""The DP generator step per training row with the document path cached (``--query-only``: the
frozen model's key/value cache of each document prefix, adapters on the invocation and the query
only) against today's step (LoRA over the whole row), both timed in one process, in turn, at each
document length. The prefix cache is built once before the timed steps (what ``finetune-lm`` does
once per run, reused by every epoch); its cost per row is reported apart. Each side runs in the
micro-batches ``finetune-lm`` chooses for it on a CPU (at most 1,024 tokens per micro-batch: today
the whole row counts, query-only only the invocation and the query), over the same rows.

    python benchmarks/dp_query_only.py [--model smollm2-135m] [--batch 24] [--tokens 128,384] [--steps 3]
    python benchmarks/dp_query_only.py --batch 4 --tokens 32,64 --steps 1 --no-memory   # smoke

Prints one ``dp_query_only`` JSON document (:func:`benchmarks._measure.emit`) with
``ratio_<tokens>`` = query-only step seconds / today's step seconds at each document length.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import add_ratios, as_a_stage, emit, measure_interleaved  # noqa: E402

# about 24 tokens, the issue's query length (SmolLM2's tokenizer)
QUERY = (
    "how do I configure the retry policy and timeout of the http client session in the async python library"
)


def _generator(model_spec: str, lora: int, tokens: int, query_only: bool):
    import torch

    from synthq.models.generator import QueryGenerator, apply_lora

    torch.manual_seed(0)
    generator = QueryGenerator.load(model_spec, max_source_length=tokens)
    apply_lora(generator, lora, None)
    if query_only:
        generator.enable_query_only("bfloat16")
    generator.model.train()
    return generator


def _rows(batch: int, tokens: int) -> tuple[list[str], list[str]]:
    # distinct documents (a cache per row, as on pylibs at one query per user); truncated to ``tokens``
    documents = [f"document {i} " + " ".join(["retrieval"] * tokens) for i in range(batch)]
    return documents, [QUERY] * batch


def micro_batch(query_only: bool, tokens: int, target_tokens: int = 32) -> int:
    """The CPU micro-batch finetune-lm chooses for rows of ``tokens`` document tokens."""
    from synthq.models.defaults import PROMPT_TOKENS, physical_batch
    from synthq.models.query_only import query_only_micro_batch

    if query_only:
        return query_only_micro_batch("cpu", target_tokens)
    return physical_batch("cpu", tokens + target_tokens + PROMPT_TOKENS)


def make_step(
    model_spec: str, query_only: bool, lora: int, batch: int, tokens: int, micro: int, mode: str = "ghost"
):
    """One DP step (ghost clipping by default, micro-batches of ``micro`` rows, per-example
    clipping, Adam) over ``batch`` rows of today's LoRA generator, or of the query-only one reading
    a prefix store built here, before the step is timed."""
    from synthq.dp.engine import PrivacyPlan
    from synthq.dp.lm.step import DPStep
    from synthq.dp.noise import SecretRandomness
    from synthq.models.query_only import QueryOnlyView
    from synthq.runtime.optim import make_optimizer

    generator = _generator(model_spec, lora, tokens, query_only)
    documents, queries = _rows(batch, tokens)
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    optimizer = make_optimizer("adam", trainable, lr=1e-4, weight_decay=0.0)
    if query_only:
        view = QueryOnlyView(generator)
        store, rows = view.store(documents)

        def make_batch(indices):
            return view.batch([store.state(rows[i]) for i in indices], [queries[i] for i in indices], 32)

        trained = view
    else:

        def make_batch(indices):
            return generator.training_batch(
                [documents[i] for i in indices], [queries[i] for i in indices], 32
            )

        trained = generator
    plan = PrivacyPlan.with_noise(1.0, 0.1, expected_batch_size=batch)
    dp = DPStep(trained, optimizer, plan, micro, mode)
    randomness = SecretRandomness(seed=0)
    indices = list(range(batch))

    def step():
        dp.step(make_batch, indices, [1.0] * batch, randomness)

    return step


def cache_seconds_per_row(model_spec: str, lora: int, batch: int, tokens: int) -> float:
    """Seconds per row to build the prefix store (once per run)."""
    from synthq.models.query_only import QueryOnlyView

    view = QueryOnlyView(_generator(model_spec, lora, tokens, True))
    documents, _ = _rows(batch, tokens)
    started = time.perf_counter()
    store, _ = view.store(documents)
    seconds = time.perf_counter() - started
    store.close()
    return seconds / batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=24, help="rows per DP step")
    parser.add_argument("--tokens", default="128,384", help="document lengths")
    parser.add_argument("--lora", type=int, default=8, help="LoRA rank (the pylibs pipelines': 8)")
    parser.add_argument("--mode", default="ghost")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="times only (no peak-RSS processes)")
    args = parser.parse_args()
    as_a_stage()
    results, payload = {}, {}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        group = {
            f"{side}_{tokens}": (
                args.model,
                only,
                args.lora,
                args.batch,
                tokens,
                micro_batch(only, tokens),
                args.mode,
            )
            for side, only in (("today", False), ("query_only", True))
        }
        results.update(measure_interleaved(make_step, group, steps=args.steps, memory=not args.no_memory))
        for name, arguments in group.items():
            results[name]["micro_batch"] = arguments[5]
        results[f"query_only_{tokens}"]["prefix_cache_seconds_per_row"] = round(
            cache_seconds_per_row(args.model, args.lora, args.batch, tokens), 4
        )
    add_ratios(results, {name: "today_" + name.rsplit("_", 1)[1] for name in results})
    for name, row in results.items():
        row["seconds_per_row"] = round(row["median_step_seconds"] / args.batch, 4)
        if name.startswith("query_only_"):
            payload[f"ratio_{name.rsplit('_', 1)[1]}"] = row["time_ratio"]
    emit(
        {
            "benchmark": "dp_query_only",
            "model": args.model,
            "batch": args.batch,
            "lora": args.lora,
            "mode": args.mode,
            "steps": args.steps,
            **payload,
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
