"""train-retriever step time and peak memory on minilm-l6: non-private vs each DP mode.

python benchmarks/retriever_step.py [--batch 32] [--query-tokens 32] [--doc-tokens 128] [--steps 2]
    [--modes non_private,batch,group,group_loop,sample,sample_loop,sample_vmap] [--logit-batch 8]

``group`` forces the one-pass per-group engine and ``group_loop`` one backward pass per group
(whatever the CPU default is); ``sample`` is ``--dp sample`` as train-retriever runs it (on CPU
the query side in one pass per chunk and one backward pass per query through the documents:
``SAMPLE_VMAP_ON_CPU``), ``sample_vmap``
:func:`synthq.dp.contrastive.sample_vmap.per_query_clipped_sum` with the documents' per-query
passes vmapped (what accelerators run), and ``sample_loop`` the same sum without the encoder:
one backward pass per query through the whole batch graph, queries and documents.

The modes of one batch size are timed in one process, in turn (a shared CPU slows every side of
a ratio alike); peak RSS comes from a process of its own. Ratios are against the non-private step
at the same batch size, measured in the same run; ``logit`` is measured at
``--logit-batch`` (its cost grows with the square of the batch) against a non-private step there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import add_ratios, emit, measure_interleaved  # noqa: E402


def training_setup(
    batch: int, query_tokens: int, doc_tokens: int, encoder_spec: str = "minilm-l6", device: str = "cpu"
):
    """The encoder (MiniLM-L6 by default) in training mode on ``device``, its trainable parameters,
    AdamW over them, and ``batch`` synthetic pairs long enough to fill the token budgets (the
    tokenizer truncates them)."""
    import torch

    from synthq.dp.contrastive.examples import Example
    from synthq.models.encoder import load_encoder
    from synthq.runtime.optim import make_optimizer

    torch.manual_seed(0)
    encoder = load_encoder(encoder_spec, device=device)
    encoder.train()
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = make_optimizer("adamw", parameters, lr=1e-5, weight_decay=0.01)  # as train-retriever does
    examples = [
        Example(" ".join([f"query{i}"] * query_tokens), " ".join([f"word{i}"] * doc_tokens), f"d{i}", f"q{i}")
        for i in range(batch)
    ]
    return encoder, parameters, optimizer, examples


def make_step(
    mode: str,
    batch: int,
    query_tokens: int,
    doc_tokens: int,
    group_size: int = 8,
    encoder_spec: str = "minilm-l6",
    device: str = "cpu",
):
    from synthq.dp.contrastive.sample_vmap import per_query_clipped_sum
    from synthq.dp.engine import PrivacyPlan, build_mechanism
    from synthq.dp.noise import SecretRandomness
    from synthq.models.encoder import embed, features, training_loss

    encoder, parameters, optimizer, examples = training_setup(
        batch, query_tokens, doc_tokens, encoder_spec, device
    )
    lengths = {"query": query_tokens, "doc": doc_tokens}

    def encode(texts, side):
        return embed(encoder, texts, lengths[side])

    temperature = 1.0 if mode == "logit" else 0.05
    mechanism = None
    if mode != "non_private":
        mechanism = build_mechanism(
            {"group_loop": "group", "sample_vmap": "sample", "sample_loop": "sample"}.get(mode, mode),
            clip_norm=1.0, temperature=temperature, model=None if mode == "sample_loop" else encoder,
            group_size=group_size, expected_batch_size=batch,
            max_query_length=query_tokens, max_doc_length=doc_tokens, pair_chunk=16,
            randomness=SecretRandomness(seed=0),
        )  # fmt: skip
        if mode.startswith("group"):
            mechanism.one_pass = mode == "group"
    loss_function = training_loss(encoder, temperature)
    randomness = SecretRandomness(seed=0)
    plan = PrivacyPlan.with_noise(1.0, mechanism.sensitivity(batch), batch) if mechanism else None

    def step():
        if mechanism is None:
            inputs = [
                features(encoder, [e.query for e in examples], query_tokens),
                features(encoder, [e.document for e in examples], doc_tokens),
            ]
            loss_function(inputs, None).backward()
        else:
            if mode == "sample_vmap":
                clipped, _ = per_query_clipped_sum(
                    encoder, [e.query for e in examples], [e.document for e in examples],
                    [e.doc_id for e in examples], temperature, 1.0, parameters, query_tokens, doc_tokens,
                )  # fmt: skip
            else:
                clipped, _ = mechanism.clipped_sum(encode, examples, parameters)
            for parameter, gradient in zip(parameters, plan.privatize(clipped, randomness), strict=True):
                parameter.grad = gradient
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--doc-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--modes", default="non_private,batch,group,group_loop,sample,sample_loop,sample_vmap"
    )
    parser.add_argument("--logit-batch", type=int, default=8, help="0 skips logit")
    parser.add_argument("--group-size", type=int, default=8, help="S for the group rows")
    parser.add_argument("--no-memory", action="store_true", help="times only (no peak-RSS processes)")
    args = parser.parse_args()
    runs = [(mode, args.batch) for mode in args.modes.split(",")]
    if args.logit_batch:
        runs += [("non_private", args.logit_batch), ("logit", args.logit_batch)]
    results = {}
    for batch in sorted({b for _, b in runs}):  # each batch size's modes timed in turn, one process
        shape = (args.query_tokens, args.doc_tokens, args.group_size)
        group = {f"{m}@{b}": (m, b, *shape) for m, b in runs if b == batch}
        results.update(measure_interleaved(make_step, group, steps=args.steps, memory=not args.no_memory))
    add_ratios(results, {key: f"non_private@{key.split('@')[1]}" for key in results})
    emit(
        {
            "benchmark": "retriever_step",
            "model": "minilm-l6",
            "batch": args.batch,
            "query_tokens": args.query_tokens,
            "doc_tokens": args.doc_tokens,
            "group_size": args.group_size,
            "steps": args.steps,
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
