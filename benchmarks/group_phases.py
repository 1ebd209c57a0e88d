"""Where `--dp group`'s extra time goes: its step (the loop over groups, the CPU default) timed by
phase next to a non-private step, in one process, in turn.

    python benchmarks/group_phases.py [--batch 16] [--group-size 8] [--steps 3]

Phases: the forward passes, the backward passes (one per group for DP), clipping and adding the
group gradients, the noise, the optimizer. ``torch.profiler`` is not used: it distorts hooked
backward passes (README "Performance"); ``perf_counter`` around each phase does not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import as_a_stage, emit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    as_a_stage()
    import torch

    from benchmarks.retriever_step import training_setup
    from synthq.dp.clipping import add_into, clip, gradient
    from synthq.dp.engine import PrivacyPlan, build_mechanism
    from synthq.dp.noise import SecretRandomness
    from synthq.models.encoder import embed, features, in_batch_softmax_loss, training_loss

    encoder, parameters, optimizer, examples = training_setup(args.batch, 32, 128)
    loss_function = training_loss(encoder, 0.05)
    mechanism = build_mechanism(
        "group", clip_norm=1.0, temperature=0.05, model=encoder, group_size=args.group_size,
        expected_batch_size=args.batch, randomness=SecretRandomness(seed=0),
    )  # fmt: skip
    mechanism.one_pass = False
    plan = PrivacyPlan.with_noise(1.0, mechanism.sensitivity(args.batch), args.batch)
    randomness = SecretRandomness(seed=0)
    seconds: dict[str, float] = defaultdict(float)

    def timed(side: str, phase: str, work):
        started = time.perf_counter()
        value = work()
        seconds[f"{side}.{phase}"] += time.perf_counter() - started
        return value

    def optimize(side: str) -> None:
        timed(side, "optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))

    def non_private() -> None:
        inputs = timed(
            "non_private", "forward",
            lambda: [features(encoder, [e.query for e in examples], 32),
                     features(encoder, [e.document for e in examples], 128)],
        )  # fmt: skip
        loss = timed("non_private", "forward", lambda: loss_function(inputs, None))
        timed("non_private", "backward", loss.backward)
        optimize("non_private")

    def group() -> None:
        per_group = []
        for key, members in mechanism.groups(examples).items():

            def losses(key=key, members=members):
                queries = embed(encoder, [e.query for e in members], 32)
                documents = embed(encoder, mechanism._documents(key, members), 128)
                return in_batch_softmax_loss(queries, documents, 0.05, [e.doc_id for e in members], "sum")

            loss = timed("group", "forward", losses)
            per_group.append(timed("group", "backward", lambda loss=loss: gradient(loss, parameters)))
        total = [torch.zeros_like(p) for p in parameters]
        for group_gradient in per_group:
            timed("group", "clip_and_add", lambda g=group_gradient: add_into(total, clip(g, 1.0)))
        mechanism.step += 1
        noisy = timed("group", "noise", lambda: plan.privatize(total, randomness))
        for parameter, value in zip(parameters, noisy, strict=True):
            parameter.grad = value
        optimize("group")

    for _ in range(2):  # warm-up
        non_private()
        group()
    seconds.clear()
    for _ in range(args.steps):
        for side, step in (("non_private", non_private), ("group", group)):
            started = time.perf_counter()
            step()
            seconds[f"{side}.step"] += time.perf_counter() - started
    per_step = {name: round(value / args.steps, 3) for name, value in sorted(seconds.items())}
    sizes = sorted((len(m) for m in mechanism.groups(examples).values()), reverse=True)
    emit(
        {
            "benchmark": "group_phases",
            "model": "minilm-l6",
            "batch": args.batch,
            "group_size": args.group_size,
            "steps": args.steps,
            "group_sizes": sizes,
            "results": {
                "seconds_per_step": per_step,
                "time_ratio": round(per_step["group.step"] / per_step["non_private.step"], 3),
            },
        }
    )


if __name__ == "__main__":
    main()
