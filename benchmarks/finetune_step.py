"""finetune-lm step time and peak memory: non-private vs each DP per-example clipping mode
(ghost, hooks, vmap), full fine-tuning vs LoRA, on the packaged SmolLM2-135M and a
T5-small-shaped model. The full (and the LoRA) configurations are timed in one process, in turn
(a shared CPU slows both sides of a ratio alike); peak RSS comes from a process of its own.

    python benchmarks/finetune_step.py [--batch 8] [--tokens 128] [--steps 3] [--modes ghost,hooks,vmap]
    python benchmarks/finetune_step.py --profile [--lora 0] [--modes ghost]
    python benchmarks/finetune_step.py --noise [--models smollm2-135m] [--steps 3]
    python benchmarks/finetune_step.py --phases [--models smollm2-135m] [--lora 16] [--no-full]
    python benchmarks/finetune_step.py --user-clipping [--models smollm2-135m] [--lora 8]

``--user-clipping`` times a ghost DP step that clips each user's combined gradient
(``--user-clipping per-user``) against the per-example step weighted ``1/k``, at the same rows:
the batch's rows fall to users of 4, 2, 1, 1, … rows (:data:`USER_SIZES`), one micro-batch.

``--profile`` runs one step of each side under torch's profiler (after two untimed steps) and
prints, per operator, the self CPU time of the non-private and the DP step and the difference:
where the DP step's extra time goes. ``--noise`` times the step's Gaussian noise alone on the
model's trainable parameters: the engine's parallel streams (:func:`synthq.dp.noise.add_noise`)
against one generator drawing a fresh tensor per parameter (the engine before). ``--phases``
times a ghost DP step and a non-private step phase by phase (:func:`phase_seconds`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import add_ratios, as_a_stage, emit, measure_interleaved  # noqa: E402

USER_SIZES = (4, 2, 1, 1)  # rows per user, repeated over the batch (--user-clipping)


def user_groups(batch: int) -> tuple[list[int], list[float]]:
    """Each row's user and weight ``1/k`` for a batch cut into users of :data:`USER_SIZES` rows."""
    groups, weights, user = [], [], 0
    while len(groups) < batch:
        size = min(USER_SIZES[user % len(USER_SIZES)], batch - len(groups))
        groups += [user] * size
        weights += [1.0 / size] * size
        user += 1
    return groups, weights


def make_step(
    model_spec: str,
    mode: str | None,
    lora: int,
    batch: int,
    tokens: int,
    user_clipping: str | None = None,
    device: str = "cpu",
):
    """One training step of ``model_spec`` (an alias, a model directory, or ``t5-small-shape``):
    a DP step with per-example clipping ``mode``, or the non-private step when ``mode`` is None."""
    import torch

    from synthq.dp.engine import PrivacyPlan
    from synthq.dp.lm.step import DPStep
    from synthq.dp.noise import SecretRandomness
    from synthq.models.generator import QueryGenerator
    from synthq.models.generator import apply_lora as _apply_lora
    from synthq.models.training_step import non_private_step
    from synthq.runtime.optim import make_optimizer

    torch.manual_seed(0)
    if model_spec == "t5-small-shape":
        import tempfile

        from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

        from synthq.models.resolve import resolve_model

        directory = Path(tempfile.mkdtemp())
        T5ForConditionalGeneration(T5Config()).save_pretrained(directory)  # T5-small shape, random
        AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")).save_pretrained(directory)
        generator = QueryGenerator.load(directory, max_source_length=tokens)
    else:
        generator = QueryGenerator.load(model_spec, max_source_length=tokens)
    if lora:
        _apply_lora(generator, lora, None)
    generator.model.to(device)
    generator.model.train()
    words = " ".join(["retrieval"] * tokens)
    documents, queries = [words] * batch, ["a short user query about retrieval"] * batch
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    optimizer = make_optimizer("adam", trainable, lr=1e-4, weight_decay=0.0)  # as finetune-lm builds it

    def make_batch(indices):
        return generator.training_batch([documents[i] for i in indices], [queries[i] for i in indices], 24)

    indices = list(range(batch))
    if mode is not None:
        plan = PrivacyPlan.with_noise(1.0, 0.1, expected_batch_size=batch)
        dp = DPStep(generator, optimizer, plan, batch, mode, user_clipping or "per-example")
        randomness = SecretRandomness(seed=0)
        groups, weights = user_groups(batch) if user_clipping else (None, [1.0] * len(indices))

        def step():
            dp.step(make_batch, indices, weights, randomness, groups=groups)
    else:

        def step():
            non_private_step(generator, optimizer, make_batch, indices, batch)

    step.model, step.optimizer = generator.model, optimizer  # for phase_seconds
    return step


def profile_overhead(model: str, mode: str, lora: int, batch: int, tokens: int, top: int = 15) -> dict:
    """Self CPU seconds per operator of one non-private and one DP step, largest differences first."""
    from torch.profiler import ProfilerActivity, profile

    as_a_stage()
    sides = {
        "non_private": make_step(model, None, lora, batch, tokens),
        "dp": make_step(model, mode, lora, batch, tokens),
    }
    for step in sides.values():  # warm-up: allocations, lazy initialisation
        step()
        step()
    totals = {}
    for name, step in sides.items():
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            step()
        totals[name] = {e.key: e.self_cpu_time_total / 1e6 for e in recorded.key_averages()}
    operators = set(totals["non_private"]) | set(totals["dp"])
    rows = sorted(
        ((op, totals["non_private"].get(op, 0.0), totals["dp"].get(op, 0.0)) for op in operators),
        key=lambda row: row[1] - row[2],
    )
    return {
        "seconds": {name: round(sum(values.values()), 3) for name, values in totals.items()},
        "largest_differences": [
            {"operator": op, "non_private": round(a, 3), "dp": round(b, 3), "extra": round(b - a, 3)}
            for op, a, b in rows[:top]
        ],
    }


def phase_seconds(model: str, mode: str, lora: int, batch: int, tokens: int, steps: int) -> dict:
    """Median seconds per phase of a non-private and a ghost DP step, timed in turn: the forward
    pass, the backward pass (DP: the norm pass, output gradients and per-layer norms, no parameter
    gradient), the clipped sum from the records (DP), the noise (DP), the optimizer, and the rest.
    ``perf_counter`` around the step's own functions, wrapped in place; no profiler, which
    distorts hooked backward passes."""
    import statistics
    import time
    from collections import defaultdict

    import torch

    from synthq.dp import engine
    from synthq.dp.lm import hooks as lm_hooks

    as_a_stage()
    current: dict[str, float] = defaultdict(float)

    def wrap(owner, attribute: str, phase: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                current[phase] += time.perf_counter() - started

        setattr(owner, attribute, timed)

    sides = {
        "non_private": make_step(model, None, lora, batch, tokens),
        "dp": make_step(model, mode, lora, batch, tokens),
    }
    for step in sides.values():
        wrap(step.model, "forward", "forward")
        wrap(step.optimizer, "step", "optimizer")
    wrap(torch.Tensor, "backward", "backward")
    wrap(lm_hooks.GhostClipper, "_norms", "forward_and_norm_pass")
    wrap(lm_hooks.TiedGhostClipping, "clipped_gradients", "clipped_sum")
    wrap(engine.PrivacyPlan, "privatize", "noise")
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for index in range(steps + 1):  # the first round warms up
        for name, step in sides.items():
            current.clear()
            started = time.perf_counter()
            step()
            phases = dict(current, step=time.perf_counter() - started)
            if "forward_and_norm_pass" in phases:
                phases["backward"] = phases.pop("forward_and_norm_pass") - phases["forward"]
            phases["rest"] = phases["step"] - sum(v for k, v in phases.items() if k != "step")
            if index:
                runs[name].append(phases)
    return {
        name: {phase: round(statistics.median(r[phase] for r in rows), 3) for phase in rows[0]}
        for name, rows in runs.items()
    }


def noise_seconds(model_spec: str, steps: int) -> dict:
    """Median seconds of one step's noise on the model's trainable parameters, each way."""
    import statistics
    import time

    import torch

    from synthq.dp.noise import add_noise
    from synthq.models.generator import QueryGenerator

    as_a_stage()
    shapes = [p.shape for p in QueryGenerator.load(model_spec).model.parameters() if p.requires_grad]
    tensors = [torch.zeros(shape) for shape in shapes]
    generator = torch.Generator().manual_seed(0)

    def one_generator():
        for tensor in tensors:
            tensor.add_(torch.normal(0.0, 1.0, size=tensor.shape, generator=generator))

    ways = {
        "one_generator_fresh_tensors": one_generator,
        "engine_streams": lambda: add_noise(tensors, 1.0, generator),
    }
    times = {name: [] for name in ways}
    for index in range(steps + 1):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            if index:  # the first round warms the allocator
                times[name].append(time.perf_counter() - started)
    medians = {name: round(statistics.median(values), 3) for name, values in times.items()}
    return {
        "coordinates": sum(t.numel() for t in tensors),
        "threads": torch.get_num_threads(),
        "seconds": medians,
        "speedup": round(medians["one_generator_fresh_tensors"] / medians["engine_streams"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default="smollm2-135m,t5-small-shape")
    parser.add_argument("--modes", default="ghost,hooks,vmap", help="DP modes to compare")
    parser.add_argument("--lora", type=int, default=16, help="LoRA rank for the LoRA rows (0 = skip)")
    parser.add_argument("--no-full", action="store_true", help="LoRA rows only")
    parser.add_argument("--no-memory", action="store_true", help="times only (no peak-RSS processes)")
    parser.add_argument("--profile", action="store_true", help="where the DP step's extra time goes")
    parser.add_argument("--noise", action="store_true", help="the step's Gaussian noise alone")
    parser.add_argument("--phases", action="store_true", help="ghost DP and non-private steps by phase")
    parser.add_argument("--user-clipping", action="store_true", help="per-user vs per-example clipping")
    args = parser.parse_args()
    if args.phases:
        for model in args.models.split(","):
            ranks = sorted({0, args.lora} - ({0} if args.no_full else set()))
            results = {}
            for rank in ranks:
                name = "full" if rank == 0 else f"lora{rank}"
                results[name] = phase_seconds(model, "ghost", rank, args.batch, args.tokens, args.steps)
            emit({"benchmark": "finetune_phases", "model": model, "batch": args.batch, "tokens": args.tokens,
                  "steps": args.steps, "results": results})  # fmt: skip
        return
    if args.noise:
        for model in args.models.split(","):
            emit({"benchmark": "dp_noise", "model": model, "results": noise_seconds(model, args.steps)})
        return
    if args.user_clipping:
        for model in args.models.split(","):
            results = {}
            for rank in sorted({0, args.lora} - ({0} if args.no_full else set())):
                kind = "full" if rank == 0 else f"lora{rank}"
                group = {
                    f"{clipping}_{kind}": (model, "ghost", rank, args.batch, args.tokens, clipping)
                    for clipping in ("per-example", "per-user")
                }
                results.update(
                    measure_interleaved(make_step, group, steps=args.steps, memory=not args.no_memory)
                )
            add_ratios(results, {name: name.replace("per-user", "per-example") for name in results})
            emit({"benchmark": "user_clipping_step", "model": model, "batch": args.batch,
                  "tokens": args.tokens, "users": USER_SIZES, "steps": args.steps,
                  "results": results})  # fmt: skip
        return
    modes = [m for m in args.modes.split(",") if m]
    if args.profile:
        for model in args.models.split(","):
            for rank in sorted({0, args.lora} - ({0} if args.no_full else set())):
                emit(
                    {
                        "benchmark": "finetune_step_profile",
                        "model": model,
                        "mode": modes[0],
                        "lora": rank,
                        "batch": args.batch,
                        "tokens": args.tokens,
                        "results": profile_overhead(model, modes[0], rank, args.batch, args.tokens),
                    }
                )
        return
    for model in args.models.split(","):
        configurations = [] if args.no_full else [("non_private_full", None, 0)]
        configurations += [] if args.no_full else [(f"dp_{m}_full", m, 0) for m in modes]
        if args.lora:
            configurations += [(f"non_private_lora{args.lora}", None, args.lora)]
            configurations += [(f"dp_{m}_lora{args.lora}", m, args.lora) for m in modes[:1]]
        # each DP mode is timed interleaved with its non-private baseline (robust to a shared CPU)
        results = {}
        for lora in sorted({lora for _, _, lora in configurations}):
            group = {
                name: (model, mode, lora, args.batch, args.tokens)
                for name, mode, rank in configurations if rank == lora
            }  # fmt: skip
            results.update(measure_interleaved(make_step, group, steps=args.steps, memory=not args.no_memory))
        # each DP row against the non-private step of the same kind (full or LoRA), same run
        baselines = {
            name: "non_private_full" if lora == 0 else f"non_private_lora{args.lora}"
            for name, _, lora in configurations
        }
        add_ratios(results, baselines)
        emit(
            {
                "benchmark": "finetune_step",
                "model": model,
                "batch": args.batch,
                "tokens": args.tokens,
                "steps": args.steps,
                "results": results,
            }
        )


if __name__ == "__main__":
    main()
