"""train-retriever step time and peak memory on minilm-l6: non-private vs each DP mode.

python benchmarks/retriever_step.py [--batch 32] [--doc-tokens 128] [--steps 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import measure, report  # noqa: E402


def make_step(mode: str, batch: int, doc_tokens: int):
    import torch

    from synthq.dp.contrastive import BatchClipping, Example, GroupClipping, SampleClipping, privatize
    from synthq.models.encoder import embed, in_batch_softmax_loss, load_encoder

    torch.manual_seed(0)
    encoder = load_encoder("minilm-l6")
    encoder.train()
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)
    examples = [
        Example(f"query number {i} about topic", " ".join([f"word{i}"] * doc_tokens), f"d{i}", i)
        for i in range(batch)
    ]

    def encode(texts, side):
        return embed(encoder, texts, 32 if side == "query" else doc_tokens)

    mechanisms = {
        "batch": BatchClipping(1.0, 0.05),
        "group": GroupClipping(1.0, 0.05, 8, batch),
        "sample": SampleClipping(1.0, 0.05),
    }
    noise = torch.Generator().manual_seed(0)

    def step():
        if mode == "non_private":
            queries = encode([e.query for e in examples], "query")
            docs = encode([e.document for e in examples], "doc")
            in_batch_softmax_loss(queries, docs, 0.05).backward()
        else:
            mechanism = mechanisms[mode]
            clipped, _ = mechanism.clipped_sum(encode, examples, parameters)
            for parameter, gradient in zip(
                parameters, privatize(clipped, mechanism.sensitivity(batch), 1.0, noise), strict=True
            ):
                parameter.grad = gradient / batch
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--doc-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", default="non_private,batch,group,sample")
    args = parser.parse_args()
    results = {
        mode: measure(make_step, mode, args.batch, args.doc_tokens, steps=args.steps)
        for mode in args.modes.split(",")
    }
    report(
        f"retriever_step[minilm-l6, batch {args.batch}, docs {args.doc_tokens} tokens]",
        results,
        "non_private",
    )


if __name__ == "__main__":
    main()
