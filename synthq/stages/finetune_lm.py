"""``synthq finetune-lm``: fine-tune a query generator on (document -> query) pairs with DP.

Stage 1 of Carranza et al. (section 4; settings in 5.2.1): DP-Adam, clip 0.1, batch 1024,
30 epochs, lr 1e-3, 384/128 tokens, δ = 1/(2n). The noise multiplier is calibrated with the
accountant for the *actual* Poisson sampling rate ``q = batch_size / n`` and the planned number
of steps; the reported ε is recomputed for the steps that ran. ``--epsilon inf`` trains the same
way without clipping or noise (ε = ∞ in the ledger). See :mod:`synthq.dp.lm` for the privacy
unit (one pair) and the sensitivity (C).

The artifact is a Hugging Face ``save_pretrained`` directory (LoRA adapters merged), plus
``training.jsonl`` (loss and ε per step) and the manifest. Checkpoints every
``checkpoint_every`` steps hold model, optimizer, step and RNG state; ``--resume`` continues
with identical accounting.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import torch
from rich.progress import TextColumn

from synthq import distributed
from synthq.artifacts import Artifact, data_input_record, existing_result, open_artifact
from synthq.config import FinetuneConfig
from synthq.console import info, progress, warn
from synthq.data.pairs import training_pairs
from synthq.data.sources import load_source, resolve_source
from synthq.dp.lm import DPStep, non_private_step, poisson_batch
from synthq.errors import DataError, SynthqError
from synthq.models.generator import QueryGenerator
from synthq.privacy import Guarantee, default_delta, epsilon_for, noise_multiplier_for, validate_budget

STAGE = "finetune-lm"
PER_SAMPLE_CLIPPING = {
    "vmap": "torch.func vmap per-example gradients (exact, every trainable parameter)",
    "hooks": "Opacus hook per-example gradients (exact, every trainable parameter; RMS-norm samplers, "
    "per-example T5 relative bias, tied embeddings summed)",
    "ghost": "Opacus ghost clipping (exact per-example norms, every trainable parameter; tied embeddings "
    "with cross terms, per-example T5 relative bias)",
}
CHECKPOINT = "state.pt"


def planned_steps(config: FinetuneConfig, num_examples: int) -> int:
    """Logical steps: ``epochs / q`` with ``q = batch / n`` (capped by ``max_steps``)."""
    steps = math.ceil(config.epochs * num_examples / config.batch_size)
    if config.max_steps is not None:
        steps = min(steps, config.max_steps)
    return max(steps, 1)


def _apply_lora(generator: QueryGenerator, rank: int, alpha: float | None) -> None:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha or 2 * rank,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="SEQ_2_SEQ_LM" if generator.kind == "seq2seq" else "CAUSAL_LM",
    )
    generator.model = get_peft_model(generator.model, lora)


def _optimizer(config: FinetuneConfig, parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            parameters,
            lr=config.lr,
            relative_step=False,
            scale_parameter=False,
            warmup_init=False,
            weight_decay=config.weight_decay,
        )
    return torch.optim.SGD(parameters, lr=config.lr, weight_decay=config.weight_decay)


def _save_checkpoint(
    path: Path, generator, optimizer, step: int, rngs: dict, log: list[dict], order: list[int]
) -> None:
    trainable = {n: p.detach().cpu() for n, p in generator.model.named_parameters() if p.requires_grad}
    state = {
        "trainable": trainable,
        "optimizer": optimizer.state_dict(),
        "step": step,
        "rngs": {name: g.get_state() for name, g in rngs.items()},
        "log": log,
        "order": order,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _read_checkpoint(path: Path) -> dict | None:
    return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else None


def _load_checkpoint(state: dict, generator, optimizer, rngs: dict) -> tuple[int, list[dict], list[int]]:
    parameters = dict(generator.model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            parameters[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    for name, generator_state in state["rngs"].items():
        rngs[name].set_state(generator_state)
    return int(state["step"]), list(state["log"]), list(state["order"])


def run(config: FinetuneConfig) -> Artifact:
    place = distributed.setup(config.device)
    source = resolve_source(config.data)
    inputs = [data_input_record(source, name=config.data)]
    if (done := distributed.on_main(existing_result, STAGE, config, inputs)) is not None:
        return done
    dataset = load_source(config.data, splits=[config.split])
    pairs = training_pairs(dataset, config.split)
    if config.limit is not None:
        pairs = pairs[: config.limit]
    n = len(pairs)
    if config.batch_size > n:
        raise DataError(f"--batch-size {config.batch_size} is larger than the {n} training pairs", source)
    if config.physical_batch_size < 1 or config.batch_size < 1:
        raise SynthqError("batch sizes must be ≥ 1")
    private = math.isfinite(config.epsilon)
    delta = config.delta if config.delta is not None else default_delta(n)
    validate_budget(config.epsilon, delta, n)
    sample_rate = config.batch_size / n
    steps = planned_steps(config, n)
    calibration = noise_multiplier_for(config.epsilon, delta, sample_rate, steps, config.accountant)
    if calibration.fallback_reason:
        warn(f"accountant: {calibration.fallback_reason}; using RDP")

    torch.manual_seed(config.seed)
    random.seed(config.seed)
    device = distributed.device_for(config.device)
    generator = QueryGenerator.load(config.model, device="cpu", max_source_length=config.max_source_length)
    if config.lora_rank > 0:
        _apply_lora(generator, config.lora_rank, config.lora_alpha)
    generator.model.to(device)
    distributed.broadcast_parameters(generator.model)  # identical replicas from the first step
    torch.manual_seed(config.seed + place.rank)  # under torchrun, each rank its own dropout masks
    generator.model.train()
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    optimizer = _optimizer(config, trainable)
    rngs = {
        "sampling": torch.Generator().manual_seed(config.seed),
        "noise": torch.Generator().manual_seed(config.seed + 1),
    }
    documents = [p.document for p in pairs]
    queries = [p.query for p in pairs]

    def make_batch(indices: list[int]) -> dict[str, torch.Tensor]:
        return generator.training_batch(
            [documents[i] for i in indices], [queries[i] for i in indices], config.max_target_length
        )

    dp_step = (
        DPStep(
            generator,
            optimizer,
            config.clip_norm,
            calibration.noise_multiplier,
            sample_rate * n,
            config.physical_batch_size,
            config.grad_sample_mode,
        )
        if private
        else None
    )
    info(
        f"fine-tuning {config.model} ({generator.kind}, {sum(p.numel() for p in trainable):,} trainable) "
        f"on {n} pairs: {steps} steps, q = {sample_rate:.4f}, "
        + (
            f"σ = {calibration.noise_multiplier:.3f}, C = {config.clip_norm}, target ε = {config.epsilon:g}, "
            f"per-example clipping: {dp_step.mode}"
            if private
            else "non-private (ε = ∞)"
        )
        + (f"; {place.world_size} ranks ({place.backend})" if place.world_size > 1 else "")
    )
    with distributed.artifact_on_main(
        config.out, STAGE, config, inputs, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        checkpoint = writer.checkpoint_dir / CHECKPOINT
        start_step, log, order = 0, [], []
        state = distributed.on_main(_read_checkpoint, checkpoint) if config.resume else None
        if state is not None:
            start_step, log, order = _load_checkpoint(state, generator, optimizer, rngs)
            info(f"resuming at step {start_step} of {steps}")
        examples_seen, tokens_seen, started = 0, 0, time.perf_counter()
        columns = (
            TextColumn("loss {task.fields[loss]:.3f}"),
            TextColumn("ε {task.fields[eps]}"),
            TextColumn("{task.fields[rate]} ex/s"),
        )
        with progress(*columns) as bar:
            task = bar.add_task(
                "finetune-lm", total=steps, completed=start_step, loss=math.nan, eps="0", rate="-"
            )
            for step in range(start_step, steps):
                if private:
                    indices = poisson_batch(n, sample_rate, rngs["sampling"])
                    result = dp_step.step(make_batch, indices, rngs["noise"])
                    spent = epsilon_for(
                        calibration.noise_multiplier, delta, sample_rate, step + 1, "rdp"
                    ).epsilon
                else:
                    if len(order) < config.batch_size:
                        order += torch.randperm(n, generator=rngs["sampling"]).tolist()
                    indices, order = order[: config.batch_size], order[config.batch_size :]
                    result = non_private_step(
                        generator, optimizer, make_batch, indices, config.physical_batch_size
                    )
                    spent = math.inf
                examples_seen += result.examples
                tokens_seen += result.tokens
                elapsed = time.perf_counter() - started
                log.append(
                    {"step": step + 1, "loss": result.loss, "epsilon": spent, "examples": result.examples}
                )
                bar.update(
                    task,
                    advance=1,
                    loss=result.loss if result.examples else math.nan,
                    eps="∞" if math.isinf(spent) else f"{spent:.2f}",
                    rate=f"{examples_seen / max(elapsed, 1e-9):.1f}",
                )
                if (
                    writer.primary
                    and config.checkpoint_every
                    and (step + 1) % config.checkpoint_every == 0
                    and step + 1 < steps
                ):
                    _save_checkpoint(checkpoint, generator, optimizer, step + 1, rngs, log, order)
        elapsed = time.perf_counter() - started
        if dp_step is not None:
            dp_step.clipper.close()  # the saved model carries no Opacus hooks
        generator.model.eval()
        if writer.primary:
            generator.save(writer.dir, generation_defaults={"do_sample": True, "top_p": 0.8})
        with open(writer.dir / "training.jsonl", "w", encoding="utf-8") as handle:
            for row in log:
                handle.write(
                    json.dumps({**row, "epsilon": row["epsilon"] if math.isfinite(row["epsilon"]) else "inf"})
                    + "\n"
                )
        if private:
            final = epsilon_for(
                calibration.noise_multiplier, delta, sample_rate, steps, calibration.accountant
            )
            writer.privacy = Guarantee(
                epsilon=final.epsilon,
                delta=delta,
                unit="example",
                mechanism=f"dp-{config.optimizer}",
                accountant=final.accountant,
                details={
                    "noise_multiplier": calibration.noise_multiplier,
                    "sample_rate": sample_rate,
                    "steps": steps,
                    "clip_norm": config.clip_norm,
                    "sensitivity": config.clip_norm,
                    "expected_batch_size": config.batch_size,
                    "num_examples": n,
                    "target_epsilon": config.epsilon,
                    "per_sample_clipping": PER_SAMPLE_CLIPPING[dp_step.mode],
                    "trainable": "LoRA adapters" if config.lora_rank else "all parameters",
                    "accountant_fallback": final.fallback_reason or calibration.fallback_reason,
                },
                note="privacy unit: one (document, query) training pair, which protects each query",
            )
        else:
            writer.privacy = Guarantee.non_private("fine-tuned on the private queries without DP (ε = ∞)")
        final_losses = [row["loss"] for row in log[-max(1, len(log) // 10) :] if not math.isnan(row["loss"])]
        writer.metrics.update(
            {
                "steps": steps,
                "first_loss": log[0]["loss"] if log else None,
                "final_loss": sum(final_losses) / len(final_losses) if final_losses else None,
                "kind": generator.kind,
            }
        )
        writer.timings.update(
            {
                "train_seconds": round(elapsed, 3),
                "examples_per_second": round(examples_seen / max(elapsed, 1e-9), 3),
                "tokens_per_second": round(tokens_seen / max(elapsed, 1e-9), 3),
                "seconds_per_step": round(elapsed / max(steps - start_step, 1), 4),
            }
        )
    return distributed.on_main(open_artifact, config.out, STAGE)
