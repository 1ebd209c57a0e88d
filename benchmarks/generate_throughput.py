"""Generated tokens per second: one document at a time (the naive way) vs synthq's length-sorted
batched sampler, same model and settings, with identical outputs under greedy decoding.

    python benchmarks/generate_throughput.py [--prompts 32] [--batch 16] [--new-tokens 24]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch

    from synthq.data import load_source
    from synthq.data.pairs import document_text
    from synthq.generation import Request, length_sorted_batches, sample_queries
    from synthq.models.generator import QueryGenerator

    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = QueryGenerator.load("smollm2-135m")
    generator.model.eval()
    corpus = load_source("embedded").corpus
    requests = [Request(d, document_text(corpus[d]), 0) for d in sorted(corpus)[: args.prompts]]
    results = {}
    for greedy in (True, False):
        mode = "greedy" if greedy else "top_p_0.8"
        started = time.perf_counter()
        naive = [
            sample_queries(generator, [r], 0, 0.8, 1.0, args.new_tokens, greedy=greedy)[0] for r in requests
        ]
        naive_seconds = time.perf_counter() - started
        started = time.perf_counter()
        batched = {}
        for batch in length_sorted_batches(requests, generator, args.batch):
            for request, text in zip(
                batch,
                sample_queries(generator, batch, 0, 0.8, 1.0, args.new_tokens, greedy=greedy),
                strict=True,
            ):
                batched[request.doc_id] = text
        batched_seconds = time.perf_counter() - started
        tokens = sum(len(generator.tokenizer(t)["input_ids"]) + 1 for t in naive)
        results[mode] = {
            "naive_tokens_per_second": round(tokens / naive_seconds, 2),
            "batched_tokens_per_second": round(tokens / batched_seconds, 2),
            "speedup": round(naive_seconds / batched_seconds, 2),
            "identical_outputs": naive == [batched[r.doc_id] for r in requests],
        }
    print(
        json.dumps(
            {
                "benchmark": f"generate_throughput[smollm2-135m, {args.prompts} prompts, batch {args.batch}]",
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
