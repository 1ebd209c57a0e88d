"""``synthq train-retriever``: a dual encoder trained with the in-batch softmax loss.

Stage 3 of Carranza et al.: one shared encoder for queries and documents, cosine similarity
over a temperature, in-batch negatives (eq. 1). Three ways to train, and what the ledger says:

* on a **synthetic** artifact (from ``generate``): non-private training, and the retriever
  inherits the synthetic set's guarantee (DP post-processing);
* on **private pairs** without ``--dp``: ε = ∞, said loudly;
* on private pairs with ``--dp sample|batch|group|logit``: direct DP training (the baselines),
  Poisson sampling at ``q = batch/n``, noise ``σ × sensitivity`` with the mechanism's own
  sensitivity (:mod:`synthq.dp.contrastive`), ε from the accountant.

Non-private training uses sentence-transformers' ``MultipleNegativesRankingLoss`` (scale 1/T), or
its GradCache form with ``--mini-batch-size``, on batches that never hold two pairs with the same
document. DP batches cannot be built that way without making one pair's presence decide
another's, so there duplicates are masked out of the negatives instead (``logit``: kept, see
its docstring). The artifact is a sentence-transformers directory.
"""

from __future__ import annotations

import math
import random
import time

import torch
import torch.nn.functional as F

from synthq import distributed
from synthq.artifacts import (
    Artifact,
    data_input_record,
    existing_result,
    is_artifact,
    open_artifact,
)
from synthq.config import TrainRetrieverConfig
from synthq.console import info, progress, warn
from synthq.data.pairs import Pair, training_pairs
from synthq.data.sources import load_source, resolve_source
from synthq.dp.contrastive import Example, build_mechanism, max_batch_size, privatize
from synthq.dp.contrastive_logit import logit_dp_constants
from synthq.errors import DataError, SynthqError
from synthq.models.encoder import features, load_encoder, training_loss
from synthq.privacy import Guarantee, default_delta, epsilon_for, noise_multiplier_for, validate_budget

STAGE = "train-retriever"
SENSITIVITY_RULES = {
    "sample": "(2B-1)C: a pair's own clipped term plus 2C for each other query it is a negative of",
    "batch": "2C: the clipped batch gradient has norm <= C with or without the pair",
    "group": "2C: the pair changes only its own group's clipped gradient",
    "logit": "(G1+G2+(B-1)L)C, Kong et al. Theorem 4.2 with constants for cos/T (logit_dp_constants)",
}


def unique_document_batches(pairs: list[Pair], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffle, then fill batches greedily so that no batch holds a document twice
    (several synthetic queries per document would otherwise be false negatives)."""
    order = list(range(len(pairs)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    pending = order
    while pending:
        batch, seen, deferred = [], set(), []
        for index in pending:
            if len(batch) < batch_size and pairs[index].doc_id not in seen:
                batch.append(index)
                seen.add(pairs[index].doc_id)
            else:
                deferred.append(index)
        batches.append(batch)
        pending = deferred
    return batches


def _inputs_and_guarantee(config: TrainRetrieverConfig):
    """The data to train on, its lineage record and the guarantee of a non-DP run on it."""
    if is_artifact(config.data):
        synthetic = open_artifact(config.data, stage="generate")
        dataset = load_source(str(synthetic.path), splits=[config.split])
        inherited = synthetic.privacy.inherit(synthetic.manifest_hash)
        return dataset, synthetic.input_record(), inherited, True
    root = resolve_source(config.data)
    dataset = load_source(config.data, splits=[config.split])
    guarantee = Guarantee.non_private("trained on the private queries without DP (ε = ∞)")
    return dataset, data_input_record(root, name=config.data), guarantee, False


def _embed_rows(encoder, texts: list[str], max_length: int) -> torch.Tensor:
    """Embeddings with gradients; ``[0, dim]`` for no texts (a rank whose share is empty)."""
    if not texts:
        device = next(encoder.parameters()).device
        return torch.zeros(0, encoder.get_sentence_embedding_dimension(), device=device)
    return encoder(features(encoder, texts, max_length))["sentence_embedding"]


def _in_batch_loss(encoder, loss_function, batch: list[Example], config: TrainRetrieverConfig):
    """sentence-transformers' in-batch softmax over the WHOLE batch, and its gradient.

    Each rank embeds its share of the batch; the embeddings are gathered with their graph, so
    every query sees every rank's documents as negatives (as large-batch contrastive training
    does) and every rank computes the same loss. Backward sends each embedding's gradient to
    the rank that made it (``world ×`` over, hence the division); summing parameter gradients
    over ranks gives the single-process gradient of the same batch."""
    local = distributed.shard(batch)
    ranks = distributed.topology().world_size
    queries = _embed_rows(encoder, [e.query for e in local], config.max_query_length)
    docs = _embed_rows(encoder, [e.document for e in local], config.max_doc_length)
    queries = distributed.gather_rows(queries, with_grad=True)
    docs = distributed.gather_rows(docs, with_grad=True)
    loss = loss_function.compute_loss_from_embeddings([queries, docs], None)
    (loss / ranks).backward()
    return loss


def _grad(parameter: torch.nn.Parameter) -> torch.Tensor:
    if parameter.grad is None:  # unused on this rank (e.g. its share of the batch was empty)
        parameter.grad = torch.zeros_like(parameter)
    return parameter.grad


def run(config: TrainRetrieverConfig) -> Artifact:
    place = distributed.setup(config.device)
    dataset, record, base_guarantee, synthetic = _inputs_and_guarantee(config)
    inputs = [record]
    if (done := distributed.on_main(existing_result, STAGE, config, inputs)) is not None:
        return done
    if config.mini_batch_size is not None and place.world_size > 1:
        raise SynthqError(
            "--mini-batch-size (GradCache) runs in one process; under torchrun each rank already "
            "embeds only its share of the batch"
        )
    pairs = training_pairs(dataset, config.split)
    if config.limit is not None:
        pairs = pairs[: config.limit]
    n = len(pairs)
    if config.batch_size > n:
        raise DataError(
            f"--batch-size {config.batch_size} is larger than the {n} training pairs", dataset.root
        )
    if config.dp is not None and synthetic:
        warn("--dp on a synthetic artifact: its own ε composes with the generator's; the ledger records both")
    if config.dp is None and not synthetic:
        warn(
            "[bold]training on the private queries WITHOUT differential privacy: this retriever has ε = ∞[/]"
        )
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    device = distributed.device_for(config.device)
    encoder = load_encoder(config.encoder, device=device)
    distributed.broadcast_parameters(encoder)
    torch.manual_seed(config.seed + place.rank)  # under torchrun, each rank its own dropout masks
    encoder.train()
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr)

    def encode(texts: list[str], side: str) -> torch.Tensor:
        length = config.max_query_length if side == "query" else config.max_doc_length
        return F.normalize(_embed_rows(encoder, texts, length), dim=-1)

    delta = config.delta if config.delta is not None else default_delta(n)
    sample_rate = config.batch_size / n
    if config.dp is None:
        steps_per_epoch = math.ceil(n / config.batch_size)
        steps = math.ceil(config.epochs * steps_per_epoch)
    else:
        validate_budget(config.epsilon, delta, n)
        steps = math.ceil(config.epochs / sample_rate)
    if config.max_steps is not None:
        steps = min(steps, config.max_steps)
    warmup = max(1, int(config.warmup_ratio * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * max(0.0, (steps - step) / max(steps - warmup, 1)),
    )
    mechanism, calibration, cap, tail = None, None, None, 0.0
    if config.dp is not None:
        calibration = noise_multiplier_for(config.epsilon, delta, sample_rate, steps, config.accountant)
        if config.dp in ("sample", "logit"):  # sensitivities that grow with the batch need a cap
            cap, tail = max_batch_size(n, sample_rate, steps)
        mechanism = build_mechanism(
            config.dp, clip_norm=config.clip_norm, temperature=config.temperature, model=encoder,
            group_size=config.group_size, expected_batch_size=config.batch_size,
            aug_negatives=config.aug_negatives, seed=config.seed, max_query_length=config.max_query_length,
            max_doc_length=config.max_doc_length, pair_chunk=config.pair_chunk,
        )  # fmt: skip
        sensitivity = mechanism.sensitivity(cap)
        sigma, multiple = calibration.noise_multiplier, sensitivity / config.clip_norm
        info(
            f"direct DP training ({config.dp}): sensitivity {multiple:.4g}·C = {sensitivity:.4g} "
            f"(batch cap {cap or 'none needed'}), σ = {sigma:.3f} → noise std {sigma * sensitivity:.4g}, "
            f"q = {sample_rate:.4f}, {steps} steps"
        )
        if config.dp == "logit" and sensitivity >= (2 * cap - 1) * config.clip_norm:
            warn(
                f"at temperature {config.temperature} Logit-DP's sensitivity ({multiple:.1f}·C) is no "
                f"better than per-query clipping's ({2 * cap - 1}·C); it pays off near --temperature 1"
            )
    else:
        loss_function = training_loss(encoder, config.temperature, config.mini_batch_size)
    noise_generator = torch.Generator().manual_seed(config.seed + 1)
    sampling_generator = torch.Generator().manual_seed(config.seed)
    examples = [Example(p.query, p.document, p.doc_id, i) for i, p in enumerate(pairs)]
    with distributed.artifact_on_main(config.out, STAGE, config, inputs) as writer:
        started, seen, losses = time.perf_counter(), 0, []
        batches: list[list[int]] = []
        with progress() as bar:
            task = bar.add_task(
                f"train-retriever{' (dp ' + config.dp + ')' if config.dp else ''}", total=steps
            )
            for _step in range(steps):
                if mechanism is None:
                    if not batches:
                        batches = unique_document_batches(pairs, config.batch_size, rng)
                    batch = [examples[i] for i in batches.pop(0)]
                    if config.mini_batch_size is None:
                        loss = _in_batch_loss(encoder, loss_function, batch, config)
                        distributed.all_reduce_sum([_grad(p) for p in parameters])
                    else:  # GradCache: chunks without a graph, then replayed with one
                        features_pair = [
                            features(encoder, [e.query for e in batch], config.max_query_length),
                            features(encoder, [e.document for e in batch], config.max_doc_length),
                        ]
                        loss = loss_function(features_pair, None)
                        loss.backward()
                    value = loss.item()
                else:
                    chosen = torch.nonzero(
                        torch.rand(n, generator=sampling_generator) < sample_rate
                    ).flatten()
                    if cap is not None and len(chosen) > cap:  # probability ≤ tail, accounted in δ
                        chosen = chosen[torch.randperm(len(chosen), generator=sampling_generator)[:cap]]
                    batch = [examples[i] for i in chosen.tolist()]
                    clipped, value = mechanism.clipped_sum(encode, batch, parameters)
                    noisy = privatize(
                        clipped, mechanism.sensitivity(cap), calibration.noise_multiplier, noise_generator
                    )
                    for parameter, gradient in zip(parameters, noisy, strict=True):
                        parameter.grad = gradient / config.batch_size
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                seen += len(batch)
                if not math.isnan(value):
                    losses.append(value)
                bar.update(task, advance=1, description=f"train-retriever loss {value:.3f}")
        elapsed = time.perf_counter() - started
        encoder.eval()
        if writer.primary:
            encoder.save(str(writer.dir))
        if mechanism is None:
            writer.privacy = base_guarantee
        else:
            final = epsilon_for(
                calibration.noise_multiplier, delta, sample_rate, steps, calibration.accountant
            )
            own = Guarantee(
                epsilon=final.epsilon,
                delta=delta + tail,
                unit="example",
                mechanism=f"dp-{config.dp}",
                accountant=final.accountant,
                details={
                    "mode": config.dp,
                    "noise_multiplier": calibration.noise_multiplier,
                    "sample_rate": sample_rate,
                    "steps": steps,
                    "clip_norm": config.clip_norm,
                    "sensitivity": mechanism.sensitivity(cap),
                    "noise_std": calibration.noise_multiplier * mechanism.sensitivity(cap),
                    "sensitivity_rule": SENSITIVITY_RULES[config.dp],
                    "max_batch_size": cap,
                    "batch_cap_tail_probability": tail,
                    "accountant_delta": delta,
                    "num_examples": n,
                    "target_epsilon": config.epsilon,
                    "group_size": config.group_size if config.dp == "group" else None,
                    "temperature": config.temperature,
                    **(
                        {"logit_dp_constants": logit_dp_constants(cap, config.temperature)}
                        if config.dp == "logit"
                        else {}
                    ),
                    **({"one_backward_pass": mechanism.one_pass} if config.dp == "group" else {}),
                },
                note="privacy unit: one (query, document) pair; δ includes the batch-cap tail",
            )
            if synthetic:  # sequential composition with the generator's guarantee
                own = own.model_copy(
                    update={
                        "epsilon": own.epsilon + base_guarantee.epsilon,
                        "delta": own.delta + base_guarantee.delta,
                        "derived_from": base_guarantee.derived_from,
                    }
                )
            writer.privacy = own
        tail_losses = losses[-max(1, len(losses) // 10) :]
        writer.metrics.update(
            {
                "steps": steps,
                "pairs": n,
                "first_loss": losses[0] if losses else None,
                "final_loss": sum(tail_losses) / len(tail_losses) if tail_losses else None,
            }
        )
        writer.timings.update(
            {
                "train_seconds": round(elapsed, 3),
                "pairs_per_second": round(seen / max(elapsed, 1e-9), 3),
                "seconds_per_step": round(elapsed / max(steps, 1), 4),
            }
        )
    return distributed.on_main(open_artifact, config.out, STAGE)
