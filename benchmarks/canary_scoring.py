"""Canary scoring in the audit: every (document, candidate) pair scored on its own vs the shared
part (prompt and query up to the secret) computed once, same model and candidates, one process.

    python benchmarks/canary_scoring.py [--model smollm2-135m] [--canaries 3] [--references 99]

Prints JSON: seconds per canary for each way, the speedup, and the largest difference between
the two log-likelihoods (they must agree).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import emit  # noqa: E402


def main() -> None:
    import torch

    from synthq.data.pairs import document_text
    from synthq.data.sources import load_source
    from synthq.models.generator import QueryGenerator

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--canaries", type=int, default=3)
    parser.add_argument("--references", type=int, default=99)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = QueryGenerator.load(args.model, max_source_length=96)
    generator.model.eval()
    corpus = load_source("embedded").corpus
    rng = random.Random(0)
    documents = [document_text(corpus[d]) for d in rng.sample(sorted(corpus), args.canaries)]
    canaries = []
    for document in documents:
        secrets = [f"{rng.randrange(10**10):010d}" for _ in range(1 + args.references)]
        canaries.append((document, [f"what is the access code {secret}" for secret in secrets]))

    started = time.perf_counter()
    each = [generator.query_log_likelihood([d] * len(c), c, batch_size=args.batch) for d, c in canaries]
    each_seconds = time.perf_counter() - started
    started = time.perf_counter()
    shared = [generator.candidate_log_likelihoods(d, c, batch_size=args.batch) for d, c in canaries]
    shared_seconds = time.perf_counter() - started
    difference = max(float((a - b).abs().max()) for a, b in zip(each, shared, strict=True))
    emit(
        {
            "benchmark": "canary_scoring",
            "model": args.model,
            "candidates_per_canary": 1 + args.references,
            "results": {
                "pair_by_pair_seconds_per_canary": round(each_seconds / args.canaries, 3),
                "shared_prefix_seconds_per_canary": round(shared_seconds / args.canaries, 3),
                "speedup": round(each_seconds / shared_seconds, 2),
                "max_abs_log_likelihood_difference": difference,
            },
        }
    )


if __name__ == "__main__":
    main()
