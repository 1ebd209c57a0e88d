"""Private Evolution's generation, one batch of few-shot prompts, three ways: as the stage runs
it (``prefix_once``: the prompts' common prefix prefilled once,
:func:`synthq.models.sampling.shared_prompt_state`, and rows that have their query dropped from the
decoding batch, :func:`synthq.models.sampling.decode`), every prompt prefilled whole
(``whole_prompts``), and every row kept to the batch's last step as Hugging Face ``generate``
keeps it (``rows_kept``).

    python benchmarks/evolve_prompts.py [--documents 96] [--repeats 2] [--model smollm2-135m]

The prompts are ``evolve``'s random-API prompts for the embedded corpus' first documents, in one
batch of the demo's ``generation_batch_size`` (96); both sides are timed in one process, in
turn, and must sample the same queries.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import as_a_stage, emit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    as_a_stage()
    from synthq.data.sources import load_source
    from synthq.models import sampling
    from synthq.models.generator import QueryGenerator
    from synthq.models.sampling import Request, sample_queries
    from synthq.stages.evolve.prompts import Prompter

    corpus = load_source("embedded").corpus
    generator = QueryGenerator.load(args.model, device="cpu")
    generator.model.eval()
    prompter = Prompter(generator)
    requests = [
        Request(doc_id, prompter.random(document["text"]), 0)
        for doc_id, document in list(corpus.items())[: args.documents]
    ]
    batch = prompter.prompting.generation_batch([r.document for r in requests])
    _, prefix = sampling._common_prefix_first(batch)
    minimum, drop = sampling.SHARED_PREFIX_MIN_TOKENS, sampling.DROP_FRACTION
    seconds: dict[str, list[float]] = {"prefix_once": [], "whole_prompts": [], "rows_kept": []}
    queries = {}
    for _ in range(args.repeats + 1):  # the first round warms up
        for side in seconds:
            sampling.SHARED_PREFIX_MIN_TOKENS = 10**9 if side == "whole_prompts" else minimum
            sampling.DROP_FRACTION = float("inf") if side == "rows_kept" else drop
            started = time.perf_counter()
            queries[side] = sample_queries(prompter.prompting, requests, 0, 0.8, 1.0, 20)
            seconds[side].append(time.perf_counter() - started)
    sampling.SHARED_PREFIX_MIN_TOKENS, sampling.DROP_FRACTION = minimum, drop
    best = {side: min(values[1:]) for side, values in seconds.items()}
    emit(
        {
            "benchmark": "evolve_prompts",
            "model": args.model,
            "batch": args.documents,
            "results": {
                "prompt_tokens": int(batch["input_ids"].shape[1]),
                "common_prefix_tokens": prefix,
                "seconds": {side: round(value, 2) for side, value in best.items()},
                "speedup": round(best["whole_prompts"] / best["prefix_once"], 2),
                "speedup_rows_dropped": round(best["rows_kept"] / best["prefix_once"], 2),
                "same_queries": queries["prefix_once"] == queries["whole_prompts"] == queries["rows_kept"],
            },
        }
    )


if __name__ == "__main__":
    main()
