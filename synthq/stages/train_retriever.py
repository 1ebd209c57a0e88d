"""``synthq train-retriever``: a dual encoder trained with the in-batch softmax loss.

Stage 3 of Carranza et al.: one shared encoder for queries and documents, cosine similarity
over a temperature, in-batch negatives (eq. 1). Three ways to train, and what the ledger says:

* on a **synthetic** artifact (from ``generate``): non-private training, and the retriever
  inherits the synthetic set's guarantee (DP post-processing);
* on **private pairs** without ``--dp``: ε = ∞, said loudly;
* on private pairs with ``--dp sample|batch|group|logit``: direct DP training (the baselines):
  the DP engine (:class:`synthq.dp.engine.PrivacyPlan`) Poisson-samples queries at
  ``q = batch/n`` with secret randomness, the registered mechanism (:mod:`synthq.dp.contrastive`)
  clips, the engine adds noise ``σ × sensitivity``; ε from the same accountant.

The starting encoder is an input too (:func:`synthq.bookkeeping.inputs.model_input`): a synthq artifact
composes its guarantee, any other local or hub model is assumed public and the guarantee says so.

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
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.artifacts.on_main import artifact_on_main
from synthq.bookkeeping.inputs import data_input, model_input
from synthq.config.fields import revalidated
from synthq.config.retriever import TrainRetrieverConfig
from synthq.data.pairs import Pair, document_text, first_pairs_per_document, training_pairs
from synthq.data.sources import load_source
from synthq.dp.contrastive.examples import Example
from synthq.dp.engine import PrivacyPlan, build_mechanism, check_units_fit, planned_steps
from synthq.dp.noise import SecretRandomness
from synthq.dp.privacy_units import (
    PrivacyUnits,
    describe_units,
    public_count_assumption,
    training_units,
    unit_details,
    unit_diagnostics,
)
from synthq.models.defaults import Chosen, document_token_length, dp_group_pass_texts, retriever_defaults
from synthq.models.encoder import (
    embed,
    features,
    freeze_token_embeddings,
    load_encoder,
    position_limit,
    sentence_embeddings,
    training_loss,
)
from synthq.models.stage_costs import expected_line, parameter_count, retriever_training_seconds
from synthq.models.training_step import training_statistics
from synthq.privacy.guarantee import Guarantee
from synthq.runtime import distributed, precision
from synthq.runtime.console import info, progress, warn
from synthq.runtime.errors import DataError, PrivacyError, SynthqError
from synthq.runtime.optim import make_optimizer

STAGE = "train-retriever"


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


def _embed_rows(encoder, texts: list[str], max_length: int) -> torch.Tensor:
    """Embeddings with gradients; ``[0, dim]`` for no texts (a rank whose share is empty)."""
    if not texts:
        device = next(encoder.parameters()).device
        return torch.zeros(0, encoder.get_sentence_embedding_dimension(), device=device)
    return sentence_embeddings(encoder, texts, max_length)


def _in_batch_loss(
    encoder, loss_function, batch: list[Example], config: TrainRetrieverConfig, negatives: list[list[str]]
):
    """sentence-transformers' in-batch softmax over the WHOLE batch, and its gradient;
    ``negatives[i]`` are example ``i``'s mined hard negatives (texts, the same count for all).

    Each rank embeds its share of the batch; the embeddings are gathered with their graph, so
    every query sees every rank's documents as negatives (as large-batch contrastive training
    does) and every rank computes the same loss. Backward sends each embedding's gradient to
    the rank that made it (``world ×`` over, hence the division); summing parameter gradients
    over ranks gives the single-process gradient of the same batch."""
    local = distributed.shard(batch)
    ranks = distributed.topology().world_size
    local_negatives = distributed.shard(negatives)
    columns = [[e.query for e in local], [e.document for e in local]]
    columns += [list(column) for column in zip(*local_negatives, strict=True)] if local_negatives else []
    if not local:  # an empty share still takes part in every gather, one column per negative
        columns += [[] for _ in range(len(negatives[0]) if negatives else 0)]
    lengths = [config.max_query_length] + [config.max_doc_length] * (len(columns) - 1)
    embeddings = [
        distributed.gather_rows(_embed_rows(encoder, texts, length), with_grad=True)
        for texts, length in zip(columns, lengths, strict=True)
    ]
    loss = loss_function.compute_loss_from_embeddings(embeddings, None)
    (loss / ranks).backward()
    return loss


def _grad(parameter: torch.nn.Parameter) -> torch.Tensor:
    if parameter.grad is None:  # unused on this rank (e.g. its share of the batch was empty)
        parameter.grad = torch.zeros_like(parameter)
    return parameter.grad


def _train_step(
    encoder, loss_function, batch: list[Example], parameters, config, negatives: list[list[str]]
) -> float:
    """One non-private step's gradient (in-batch softmax, or its GradCache form), with each
    example's hard negatives (``negatives[i]``, possibly none) as extra candidates."""
    if config.mini_batch_size is None:
        loss = _in_batch_loss(encoder, loss_function, batch, config, negatives)
        distributed.all_reduce_sum([_grad(p) for p in parameters])
        return loss.item()
    # GradCache: chunks without a graph, then replayed with one
    features_pair = [
        features(encoder, [e.query for e in batch], config.max_query_length),
        features(encoder, [e.document for e in batch], config.max_doc_length),
        *(features(encoder, list(column), config.max_doc_length) for column in zip(*negatives, strict=True)),
    ]
    with precision.forward_autocast():  # GradCache's own backward replays these forward passes
        loss = loss_function(features_pair, None)
        loss.backward()
    return loss.item()


def _scheduler(optimizer, steps: int, warmup_ratio: float):
    """Linear warm-up then linear decay to zero."""
    warmup = max(1, int(warmup_ratio * steps))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * max(0.0, (steps - step) / max(steps - warmup, 1)),
    )


def _load(config: TrainRetrieverConfig, path, rank: int):
    """The starting encoder, identical on every rank, in train mode."""
    if config.seed is not None:  # public randomness (dropout, shuffling of non-private epochs)
        torch.manual_seed(config.seed)
    encoder = load_encoder(path, device=distributed.device_for(config.device))
    distributed.broadcast_parameters(encoder)
    if config.seed is not None:
        torch.manual_seed(config.seed + rank)  # under torchrun, each rank its own dropout masks
    encoder.train()
    return encoder


def _dp_setup(config: TrainRetrieverConfig, units: PrivacyUnits, encoder, randomness, synthetic: bool):
    """The registered mechanism for ``--dp`` and the engine's plan for it."""
    if synthetic:
        warn("--dp on a synthetic artifact: its ε composes with the generator's; the ledger records both")
    steps = planned_steps(len(units), config.batch_size, config.epochs, config.max_steps)
    mechanism = build_mechanism(
        config.dp, clip_norm=config.clip_norm, temperature=config.temperature, model=encoder,
        group_size=config.group_size, expected_batch_size=config.batch_size, randomness=randomness,
        aug_negatives=config.aug_negatives, max_query_length=config.max_query_length,
        max_doc_length=config.max_doc_length, pair_chunk=config.pair_chunk,
        pass_texts=dp_group_pass_texts(str(next(encoder.parameters()).device), config.max_doc_length),
    )  # fmt: skip
    check_units_fit(units, mechanism)
    plan = PrivacyPlan.for_stage(
        config, num_units=len(units), expected_batch_size=config.batch_size, steps=steps,
        mechanism=mechanism, unit=units.kind,
    )  # fmt: skip
    if plan is None:
        raise PrivacyError(f"--dp {config.dp} needs a finite --epsilon (ε = ∞ is training without --dp)")
    info(
        f"direct DP training ({config.dp}) over {describe_units(units)}: "
        f"sensitivity {plan.sensitivity / config.clip_norm:.4g}·C = "
        f"{plan.sensitivity:.4g} (batch cap {plan.batch_cap or 'none needed'}), "
        f"σ = {plan.noise_multiplier:.3f} → noise std {plan.noise_std:.4g}, "
        f"q = {plan.sample_rate:.4f}, {steps} steps"
    )
    if (advice := mechanism.advice(plan.batch_cap)) is not None:
        warn(advice)
    return mechanism, plan, steps


def _fitted_pass_size(config: TrainRetrieverConfig, encoder, corpus, place) -> Chosen:
    """The document length when ``--max-doc-length`` is unset, and GradCache's chunk when
    ``--mini-batch-size`` is unset and the batch would not fit a CPU's memory
    (:func:`synthq.models.defaults.retriever_defaults`; the corpus is public), said in one line."""
    device = str(next(encoder.parameters()).device)
    chosen = retriever_defaults(
        config, device, place.world_size,
        lambda cap: document_token_length(encoder.tokenizer, corpus, cap), position_limit(encoder),
    )  # fmt: skip
    if chosen.line():
        info(chosen.line())
    return chosen


def _within_position_limit(config: TrainRetrieverConfig, encoder) -> TrainRetrieverConfig:
    """``config`` with --max-query-length / --max-doc-length clamped to the encoder's position
    limit (longer inputs would index past its position embeddings in every mode), with a warning."""
    limit = position_limit(encoder)
    clamped = {}
    for name in ("max_query_length", "max_doc_length"):  # an unset length is chosen within it
        if limit is not None and getattr(config, name) is not None and getattr(config, name) > limit:
            warn(f"--{name.replace('_', '-')} {getattr(config, name)} is beyond {config.encoder}'s {limit} "
                 f"positions: using {limit}")  # fmt: skip
            clamped[name] = limit
    return config.model_copy(update=clamped) if clamped else config


def _statistics(losses: list[float], elapsed: float, seen: int, steps: int) -> dict:
    pairs_per_second = round(seen / max(elapsed, 1e-9), 3)
    return {**training_statistics(losses, elapsed, steps), "pairs_per_second": pairs_per_second}


@dataclass(frozen=True)
class _Sources:
    """What a run reads: the training pairs' dataset (private, or a synthetic set) and the encoder."""

    data: Any
    dataset: Any
    start: Any

    @property
    def records(self) -> list[dict]:
        return [self.data.record, self.start.record]

    @property
    def synthetic(self) -> bool:
        return self.data.is_artifact


@dataclass
class _Setup:
    """Everything the training loop needs, decided before the first step."""

    settings: TrainRetrieverConfig  # the config within the encoder's limits, unset options chosen
    fitted: Chosen
    pairs: Any
    units: PrivacyUnits
    randomness: SecretRandomness
    rng: random.Random
    encoder: Any
    parameters: list[torch.nn.Parameter]
    optimizer: Any
    scheduler: Any
    steps: int
    mined: list  # hard negatives per pair (non-private runs), with their texts
    texts: dict
    mechanism: Any = None  # under --dp: the mechanism and its plan
    plan: PrivacyPlan | None = None
    loss_function: Any = None  # without DP: the in-batch softmax (GradCache in chunks where chosen)


@precision.stage
def run(config: TrainRetrieverConfig) -> Artifact:
    """Resolve the inputs, set up the pairs, units, encoder and (under --dp) the DP plan, train,
    then write the encoder and what it releases of the pairs it read."""
    config = revalidated(config)  # the checks that decide ε, however the config was built
    place = distributed.setup(config.device)
    sources = _resolve_sources(config)
    if (done := distributed.on_main(existing_result, STAGE, config, sources.records)) is not None:
        return done
    setup = _set_up(config, sources, place)
    with artifact_on_main(config.out, STAGE, config, sources.records) as writer:
        # the values used; the fingerprint keeps the options as given
        writer.config.update(setup.fitted.values)
        started = time.perf_counter()
        seen, losses = _train(config, setup)
        statistics = _statistics(losses, time.perf_counter() - started, seen, setup.steps)
        _write_encoder(writer, sources, setup)
        _write_release(writer, config, sources, setup, statistics)
    return distributed.on_main(open_artifact, config.out, STAGE)


# Phases ------------------------------------------------------------------------------------------


def _resolve_sources(config: TrainRetrieverConfig) -> _Sources:
    data = data_input(config.data)
    dataset = load_source(str(data.root), splits=[config.split])
    return _Sources(data, dataset, model_input(config.encoder, stage=STAGE))


def _training_pairs(config: TrainRetrieverConfig, sources: _Sources):
    """The split's pairs (first per document, a prefix: both refused where DP forbids them)."""
    pairs = training_pairs(sources.dataset, config.split)
    if config.queries_per_document is not None:
        if config.dp is not None:
            raise SynthqError(
                "--queries-per-document keeps a document's first pairs, so whether a query is kept "
                "depends on the other queries: not a selection a DP mechanism may make; "
                "select the pairs before training"
            )
        pairs = first_pairs_per_document(pairs, config.queries_per_document)
    pairs = pairs[: config.limit] if config.limit is not None else pairs
    if config.batch_size > len(pairs):
        raise DataError(f"--batch-size {config.batch_size} is larger than the {len(pairs)} training pairs; "
                        f"pass --batch-size {len(pairs)} or less", sources.dataset.root)  # fmt: skip
    return pairs


def _set_up(config: TrainRetrieverConfig, sources: _Sources, place) -> _Setup:
    """Pairs and units, the encoder (embeddings frozen where asked) and its optimizer, the settings
    chosen for this machine, hard negatives, and the steps: planned by the DP plan under --dp."""
    if config.mini_batch_size is not None and place.world_size > 1:
        raise SynthqError("--mini-batch-size (GradCache) runs in one process; under torchrun each rank "
                          "already embeds only its share of the batch")  # fmt: skip
    pairs = _training_pairs(config, sources)
    randomness, rng = SecretRandomness(config.seed), random.Random(config.seed)
    units = training_units(
        pairs, sources.data.root, config.privacy_unit, config.max_queries_per_user, randomness
    )
    if config.dp is None and not sources.synthetic:
        warn(
            "[bold]training on the private queries WITHOUT differential privacy: this retriever has ε = ∞[/]"
        )
    encoder = _load(config, sources.start.path, place.rank)
    randomness.seed_torch(place.rank)  # dropout from the run's randomness, not torch's default seed
    if config.freeze_embeddings and not freeze_token_embeddings(encoder):
        raise SynthqError(f"--freeze-embeddings: found no token-embedding matrix in {config.encoder}")
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = make_optimizer("adamw", parameters, lr=config.lr, weight_decay=config.weight_decay)
    settings = _within_position_limit(config, encoder)  # what training uses; the artifact records config
    fitted = _fitted_pass_size(settings, encoder, sources.dataset.corpus, place)
    settings = settings.model_copy(update=fitted.values)
    mined, texts = (
        _hard_negatives(settings, encoder, pairs, sources.dataset.corpus, rng)
        if config.hard_negatives
        else ([], {})
    )
    setup = _Setup(settings, fitted, pairs, units, randomness, rng, encoder, parameters, optimizer, None, 0,
                   mined, texts)  # fmt: skip
    if config.dp is None:
        steps = math.ceil(config.epochs * math.ceil(len(pairs) / config.batch_size))
        setup.steps = min(steps, config.max_steps) if config.max_steps is not None else steps
        setup.loss_function = training_loss(encoder, config.temperature, settings.mini_batch_size)
    else:
        setup.mechanism, setup.plan, setup.steps = _dp_setup(
            settings, units, encoder, randomness, sources.synthetic
        )
    setup.scheduler = _scheduler(optimizer, setup.steps, config.warmup_ratio)
    info(_expected_time(config, setup))
    return setup


def _expected_time(config: TrainRetrieverConfig, setup: _Setup) -> str:
    """The run's expected minutes on the reference machine: the steps' pairs (under --dp at the
    user unit, K per user), each with its hard negatives, at the measured cost per pair."""
    per_user = config.dp is not None and setup.units.kind == "user"
    pairs = setup.steps * config.batch_size * (config.max_queries_per_user if per_user else 1)
    rows = pairs * (1 + config.hard_negatives)  # each hard negative adds a document to encode
    chunked = setup.settings.mini_batch_size is not None  # GradCache: its own measured cost
    seconds = retriever_training_seconds(
        rows, setup.settings.max_doc_length, parameter_count(setup.encoder), config.dp, chunked
    )
    return expected_line(seconds)


def _train(config: TrainRetrieverConfig, setup: _Setup) -> tuple[int, list[float]]:
    """Every step (in-batch softmax over unique-document batches, or the DP mechanism's noisy
    clipped sum over Poisson-sampled units); the pairs seen and the finite losses."""
    seen, losses, batches = 0, [], []
    with progress() as bar:
        task = bar.add_task(
            f"train-retriever{' (dp ' + config.dp + ')' if config.dp else ''}", total=setup.steps
        )
        for _step in range(setup.steps):
            if setup.plan is None:
                if not batches:
                    batches = unique_document_batches(setup.pairs, config.batch_size, setup.rng)
                count, value = _non_private_step(setup, batches.pop(0))
            else:
                count, value = _dp_step(setup)
            setup.optimizer.step()
            setup.scheduler.step()
            setup.optimizer.zero_grad(set_to_none=True)
            seen += count
            losses += [] if math.isnan(value) else [value]
            bar.update(task, advance=1)
    return seen, losses


def _non_private_step(setup: _Setup, chosen: list[int]) -> tuple[int, float]:
    batch = [_example(setup.pairs[i]) for i in chosen]
    mined, texts = setup.mined, setup.texts
    negatives = [[texts[d] for d in mined[i]] for i in chosen] if mined else [[] for _ in chosen]
    value = _train_step(
        setup.encoder, setup.loss_function, batch, setup.parameters, setup.settings, negatives
    )
    return len(batch), value


def _dp_step(setup: _Setup) -> tuple[int, float]:
    """One DP step: the units Poisson-sampled, the mechanism's clipped sum, noise once
    (:meth:`PrivacyPlan.privatize`) into the gradients."""
    settings, encoder, units = setup.settings, setup.encoder, setup.units

    def encode(texts: list[str], side: str) -> torch.Tensor:
        length = settings.max_query_length if side == "query" else settings.max_doc_length
        return F.normalize(_embed_rows(encoder, texts, length), dim=-1)

    rows, weights = units.expand(setup.plan.sample(setup.randomness))
    batch = [_example(setup.pairs[i], w, units, i) for i, w in zip(rows, weights, strict=True)]
    clipped, value = setup.mechanism.clipped_sum(encode, batch, setup.parameters)
    for parameter, noisy in zip(
        setup.parameters, setup.plan.privatize(clipped, setup.randomness), strict=True
    ):
        parameter.grad = noisy
    return len(batch), value


def _write_encoder(writer, sources: _Sources, setup: _Setup) -> None:
    setup.encoder.eval()
    if writer.primary:
        setup.encoder.save(str(writer.dir))
    sources.start.carry_into(writer)


def _write_release(writer, config, sources: _Sources, setup: _Setup, statistics: dict) -> None:
    """What the encoder releases of the pairs it read: a synthetic set's releases (post-processing),
    its own DP release, or ε = ∞ for private pairs read without DP; statistics of private pairs
    go to the private diagnostics."""
    data, units, synthetic = sources.data, setup.units, sources.synthetic
    if synthetic:  # post-processing of the synthetic set's releases
        writer.inherit(data.artifact)
    if setup.plan is not None:  # a DP release of the pairs it read (a synthetic set's queries, too)
        guarantee = _dp_guarantee(setup.plan, setup.mechanism, config, units, setup.randomness)
        writer.release(guarantee, data.record, units.keys, units.kind, links=units.links)
    elif not synthetic:
        reason = "trained on the private queries without DP (ε = ∞)"
        writer.release(
            Guarantee.non_private(reason, unit=units.kind), data.record, units.keys, units.kind,
            links=units.links,
        )  # fmt: skip
    if not synthetic:  # read the private pairs: private statistics
        writer.timings_are_private = True
        writer.diagnostics.update(unit_diagnostics(units, len(setup.pairs)))
    writer.metrics.update({"steps": setup.steps, **({"pairs": len(setup.pairs)} if synthetic else {})})
    (writer.metrics if synthetic else writer.diagnostics).update(statistics)


def _hard_negatives(config: TrainRetrieverConfig, encoder, pairs, corpus, rng: random.Random):
    """Each pair's ``--hard-negatives`` document ids, mined by the starting encoder
    (:func:`synthq.retrieval.hard_negatives.mine_hard_negatives`), topped up with random documents
    that are not the query's positives when the top candidates hold too few; and the texts."""
    from synthq.retrieval.hard_negatives import mine_hard_negatives

    texts = {doc_id: document_text(doc) for doc_id, doc in corpus.items()}
    judged: dict[str, set[str]] = {}
    for pair in pairs:
        judged.setdefault(pair.query_id, set()).add(pair.doc_id)

    possible = len(texts) - max(len(positives) for positives in judged.values())
    if config.hard_negatives > possible:  # the rest would be random documents, recorded as mined
        raise DataError(
            f"--hard-negatives {config.hard_negatives} is more than the {possible} documents that can be "
            f"a query's negatives here ({len(texts)} documents, up to {len(texts) - possible} positives "
            "for one query); choose at most that"
        )

    def encode(strings: list[str], length: int, advance=None) -> torch.Tensor:
        vectors = []
        for start in range(0, len(strings), 64):
            vectors.append(embed(encoder, strings[start : start + 64], length))
            if advance is not None:
                advance(len(vectors[-1]))
        return torch.cat(vectors)

    info(
        f"mining {config.hard_negatives} hard negatives per pair with the starting encoder "
        f"({len(texts):,} documents)"
    )
    encoder.eval()
    try:
        with progress() as bar:  # minutes on a CPU: the corpus is encoded once, at --max-doc-length
            task = bar.add_task("mining hard negatives (documents encoded)", total=len(texts))
            mined = mine_hard_negatives(
                lambda strings: encode(strings, config.max_query_length),
                lambda strings: encode(strings, config.max_doc_length, lambda n: bar.advance(task, n)),
                [pair.query for pair in pairs],
                [judged[pair.query_id] for pair in pairs],
                texts,
                config.hard_negatives,
            )
    finally:
        encoder.train()
    ids = list(texts)
    for pair, negatives in zip(pairs, mined, strict=True):
        while len(negatives) < config.hard_negatives and len(ids) > len(judged[pair.query_id]) + len(
            negatives
        ):
            candidate = ids[rng.randrange(len(ids))]
            if candidate not in judged[pair.query_id] and candidate not in negatives:
                negatives.append(candidate)
    return mined, texts


def _dp_guarantee(plan: PrivacyPlan, mechanism, config: TrainRetrieverConfig, units, randomness) -> Guarantee:
    """The guarantee of the direct-DP run itself (before composing with its inputs)."""
    details = {
        **unit_details(units),
        "mode": config.dp,
        "clip_norm": config.clip_norm,
        "sensitivity_rule": mechanism.sensitivity_rule,
        "temperature": config.temperature,
        "group_size": config.group_size if config.dp == "group" else None,
        **mechanism.describe(),
    }
    assumptions = [randomness.assumption(), public_count_assumption(units)]
    return plan.guarantee(mechanism=f"dp-{config.dp}", details=details, assumptions=assumptions)


def _example(pair: Pair, weight: float = 1.0, units: PrivacyUnits | None = None, row: int = -1) -> Example:
    unit_id = units.key_of(row, pair.query_id) if units is not None else pair.query_id
    return Example(pair.query, pair.document, pair.doc_id, unit_id, weight)
