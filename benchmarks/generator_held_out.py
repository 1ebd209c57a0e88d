"""How far did each generator move on public pairs? Per-pair loss on a public split, paired.

    .venv/bin/python benchmarks/generator_held_out.py --data pylibs --split test --pairs 320 \\
        runs/pylibs-epoch/gen-warm runs/pylibs-epoch/gen-eps8-epoch runs/pylibs-lora-targets/gen-eps8-qv-r1

``finetune-lm`` records the loss on 16 public pairs before and after training, too few to tell
two DP generators apart. This reads the first ``--pairs`` (document, query) pairs of a split the
dataset declares public (refused otherwise: a loss on private queries printed without noise would
be ε = ∞) and scores every generator on the same pairs, one forward pass per batch without
gradients. It prints one JSON object: each generator's ε (a loss of a generator trained without
DP is a number about its private data too: ε = ∞), its mean loss and, against the first one
(the reference, e.g. the warm start before any DP step), the mean paired difference with a
bootstrap interval over pairs (2,000 resamples, seed 0). Generators are scored in turn in one
process at the given precision; the figures are losses, not times, so a busy CPU changes nothing
but the wall time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from synthq.artifacts.manifest import is_artifact, open_artifact
from synthq.bookkeeping.inputs import public_pairs_input
from synthq.dp.lm.learning_check import held_out_losses
from synthq.models.generator import QueryGenerator

RESAMPLES = 2000
BATCH = 16


def pair_losses(path: str, documents: list[str], queries: list[str], source_tokens: int, target_tokens: int):
    """``path``'s loss on every pair, in order."""
    generator = QueryGenerator.load(path, device="cpu", max_source_length=source_tokens)
    losses = [
        held_out_losses(generator, documents[i : i + BATCH], queries[i : i + BATCH], target_tokens)
        for i in range(0, len(documents), BATCH)
    ]
    return torch.cat(losses).numpy()


def paired_interval(difference: np.ndarray) -> list[float]:
    """95 % bootstrap interval of the mean of ``difference`` over pairs."""
    rng = np.random.default_rng(0)
    means = difference[rng.integers(0, len(difference), (RESAMPLES, len(difference)))].mean(axis=1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _epsilon(path: str) -> float | str:
    """The generator's own guarantee (ε = ∞ for one trained without DP: its loss is then a number
    about private data too), or ``public model`` for a model that is not a synthq artifact."""
    return open_artifact(Path(path)).privacy.epsilon if is_artifact(Path(path)) else "public model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("generators", nargs="+", help="generator directories; the first is the reference")
    parser.add_argument("--data", required=True, help="a dataset spec (pylibs, a BEIR directory)")
    parser.add_argument("--split", default="test", help="a split the dataset declares public")
    parser.add_argument("--pairs", type=_positive, default=320, help="the first N pairs of the split")
    parser.add_argument("--max-source-length", type=int, default=128)
    parser.add_argument("--max-target-length", type=int, default=32)
    args = parser.parse_args()
    pairs = public_pairs_input(f"{args.data}:{args.split}", "--data").pairs[: args.pairs]
    documents, queries = [p.document for p in pairs], [p.query for p in pairs]
    losses = {
        path: pair_losses(path, documents, queries, args.max_source_length, args.max_target_length)
        for path in args.generators
    }
    reference = losses[args.generators[0]]
    result = {
        "data": f"{args.data}:{args.split}",
        "pairs": len(pairs),
        "reference": args.generators[0],
        "generators": {
            path: {
                "epsilon": _epsilon(path),
                "mean_loss": float(values.mean()),
                "minus_reference": float((values - reference).mean()),
                "interval_95": paired_interval(values - reference),
            }
            for path, values in losses.items()
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
