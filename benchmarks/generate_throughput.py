"""Query generation throughput: the naive way (one document at a time, ``pipeline``-style
``model.generate``) vs synthq's sampler (length-sorted batches, per-row nucleus draws, rows
stopped at the newline that ends a query), same model, prompts and settings, one process.

    python benchmarks/generate_throughput.py [--prompts 32] [--batch 16] [--new-tokens 24]

Rows, per decoding mode (greedy and top-p 0.8):

* ``naive_hf``: ``model.generate`` per document with Hugging Face's own sampling, stopping at EOS
  (what a ``text-generation`` pipeline does);
* ``naive_synthq``: synthq's sampler with batches of one (same queries as ``batched``);
* ``batched_no_newline_stop``: synthq's batches, but rows run to EOS or ``--new-tokens``;
* ``batched``: what ``synthq generate`` does.

Throughput is documents (one query each) per second and kept query tokens per second (the
query is cut at its first newline in every row, so tokens generated after it are not counted);
``speedup`` divides the naive wall time by each row's. Under greedy decoding all rows must give
identical queries; under top-p ``naive_synthq`` and ``batched`` must (sampling is per document).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import as_a_stage, emit  # noqa: E402


def main() -> None:
    import torch

    from synthq.data.pairs import document_text
    from synthq.data.sources import load_source
    from synthq.models.generator import QueryGenerator
    from synthq.models.sampling import Request, length_sorted_batches, sample_queries, stop_token_ids

    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--top-p", type=float, default=0.8)
    args = parser.parse_args()
    threads = as_a_stage()  # the threads and heap setting `synthq generate` applies
    generator = QueryGenerator.load("smollm2-135m")
    generator.model.eval()
    tokenizer = generator.tokenizer
    stop_token_ids(generator)  # built once per tokenizer (~1 s); not part of any timing
    corpus = load_source("embedded").corpus
    requests = [Request(d, document_text(corpus[d]), 0) for d in sorted(corpus)[: args.prompts]]
    prompt_tokens = [len(generator.generation_batch([r.document])["input_ids"][0]) for r in requests]

    def naive_hf(greedy: bool) -> list[str]:
        torch.manual_seed(0)
        texts = []
        for request in requests:
            batch = generator.generation_batch([request.document])
            with torch.inference_mode():
                output = generator.model.generate(
                    **batch,
                    do_sample=not greedy,
                    top_p=None if greedy else args.top_p,
                    top_k=None if greedy else 0,
                    temperature=None if greedy else 1.0,
                    max_new_tokens=args.new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            texts.append(generator.decode_new_tokens(output, batch)[0])
        return texts

    def ours(greedy: bool, batch_size: int, stop_at_newline: bool = True) -> list[str]:
        texts = {}
        for batch in length_sorted_batches(requests, generator, batch_size):
            sampled = sample_queries(
                generator, batch, 0, args.top_p, 1.0, args.new_tokens, greedy, stop_at_newline
            )
            texts.update({r.doc_id: t for r, t in zip(batch, sampled, strict=True)})
        return [texts[r.doc_id] for r in requests]

    ours(True, 2)  # warm-up: first-call allocations and lazy initialisation
    results = {}
    for greedy in (True, False):
        runs = {
            "naive_hf": lambda greedy=greedy: naive_hf(greedy),
            "naive_synthq": lambda greedy=greedy: ours(greedy, 1),
            "batched_no_newline_stop": lambda greedy=greedy: ours(greedy, args.batch, False),
            "batched": lambda greedy=greedy: ours(greedy, args.batch),
        }
        outputs, seconds = {}, {}
        for name, function in runs.items():
            started = time.perf_counter()
            outputs[name] = function()
            seconds[name] = time.perf_counter() - started
        mode = {}
        for name, texts in outputs.items():
            tokens = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
            mode[name] = {
                "seconds": round(seconds[name], 2),
                "documents_per_second": round(len(texts) / seconds[name], 2),
                "query_tokens_per_second": round(tokens / seconds[name], 2),
                "speedup": round(seconds["naive_hf"] / seconds[name], 2),
            }
        same = ["naive_synthq", "batched_no_newline_stop", "batched"] + (["naive_hf"] if greedy else [])
        mode["identical_outputs"] = all(outputs[name] == outputs["batched"] for name in same)
        mode["compared"] = same
        mode["example"] = outputs["batched"][:3]
        results["greedy" if greedy else f"top_p_{args.top_p}"] = mode
    emit(
        {
            "benchmark": "generate_throughput",
            "model": "smollm2-135m",
            "prompts": args.prompts,
            "mean_prompt_tokens": round(sum(prompt_tokens) / len(prompt_tokens), 1),
            "batch": args.batch,
            "max_new_tokens": args.new_tokens,
            "threads": threads,
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
