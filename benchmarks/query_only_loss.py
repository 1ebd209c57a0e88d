"""Does an adapter that acts on the query only learn what one over the whole row learns? Both LoRA
generators are trained WITHOUT DP (same pairs, order, steps, rank and learning rate) from the same
starting model, and their held-out loss (mean per-sequence loss of held-out pairs' queries, each
through its own path) is compared: ``loss_ratio`` = query-only / full adapter.

    python benchmarks/query_only_loss.py [--model smollm2-135m] [--data pylibs] [--train 240] [--held-out 64]
        [--steps 30] [--batch 16] [--lora 8] [--lr 2e-3] [--tokens 128]
    python benchmarks/query_only_loss.py --train 16 --held-out 8 --steps 2 --batch 4 --tokens 32   # smoke

Training pairs are the first ``--train`` of the training split (a fixed public shuffle), held-out
pairs the first ``--held-out`` of ``dev``. Prints one ``query_only_loss`` JSON document.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import as_a_stage, emit  # noqa: E402


def train(args, pairs, held_out, query_only: bool) -> dict:
    import torch

    from synthq.dp.lm.learning_check import held_out_loss
    from synthq.models.generator import QueryGenerator, apply_lora
    from synthq.models.query_only import CachedRows, QueryOnlyView
    from synthq.models.training_step import non_private_step
    from synthq.runtime.optim import make_optimizer

    torch.manual_seed(0)
    generator = QueryGenerator.load(args.model, max_source_length=args.tokens)
    apply_lora(generator, args.lora, None)
    documents, queries = [p.document for p in pairs], [p.query for p in pairs]
    trained = generator
    started = time.perf_counter()
    if query_only:
        generator.enable_query_only("bfloat16")
        trained = QueryOnlyView(generator)
        make_batch = CachedRows(trained, documents, queries, 32)
        make_batch.build(None)
    else:

        def make_batch(rows):
            return generator.training_batch([documents[i] for i in rows], [queries[i] for i in rows], 32)

    cache_seconds = time.perf_counter() - started
    held = ([p.document for p in held_out], [p.query for p in held_out])
    before = held_out_loss(trained, *held, 32)
    generator.model.train()
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    optimizer = make_optimizer("adam", trainable, lr=args.lr, weight_decay=0.0)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)).tolist()
    order = order * (args.steps * args.batch // len(order) + 1)
    losses, started = [], time.perf_counter()
    for step in range(args.steps):
        rows = order[step * args.batch : (step + 1) * args.batch]
        losses.append(non_private_step(trained, optimizer, make_batch, rows, args.batch).loss)
    seconds = time.perf_counter() - started
    return {
        "held_out_loss_before": round(before, 4),
        "held_out_loss_after": round(held_out_loss(trained, *held, 32), 4),
        "first_train_loss": round(losses[0], 4),
        "last_train_loss": round(losses[-1], 4),
        "train_seconds": round(seconds, 1),
        "prefix_cache_seconds": round(cache_seconds, 1) if query_only else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", default="pylibs")
    parser.add_argument("--train", type=int, default=240)
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lora", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--tokens", type=int, default=128, help="document tokens kept")
    args = parser.parse_args()
    as_a_stage()
    import random

    from synthq.data.pairs import training_pairs
    from synthq.data.sources import load_source

    pairs = training_pairs(load_source(args.data, splits=["train"]), "train")
    pairs = random.Random(0).sample(list(pairs), min(args.train, len(pairs)))
    held_out = list(training_pairs(load_source(args.data, splits=["dev"]), "dev"))[: args.held_out]
    results = {side: train(args, pairs, held_out, side == "query_only") for side in ("full", "query_only")}
    emit(
        {
            "benchmark": "query_only_loss",
            "model": args.model,
            "data": args.data,
            "train_pairs": len(pairs),
            "held_out_pairs": len(held_out),
            "steps": args.steps,
            "batch": args.batch,
            "lora": args.lora,
            "lr": args.lr,
            "tokens": args.tokens,
            "loss_ratio": round(
                results["query_only"]["held_out_loss_after"] / results["full"]["held_out_loss_after"], 4
            ),
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
