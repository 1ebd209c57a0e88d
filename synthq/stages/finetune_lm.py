"""``synthq finetune-lm``: fine-tune a query generator on (document -> query) pairs with DP.

Stage 1 of Carranza et al. (section 4; settings in 5.2.1): DP-Adam, clip 0.1, batch 1024,
30 epochs, lr 1e-3, 384/128 tokens, δ = 1/(2n). The recipe: resolve the data and the starting
model, let the DP engine plan the run (:class:`synthq.dp.engine.PrivacyPlan`: q, steps, σ for
the target ε with the chosen accountant), train with :class:`synthq.dp.lm.training.GeneratorTraining`,
write the model. ``--epsilon inf`` trains the same way without clipping or noise (ε = ∞).

Privacy unit: one query with all its pairs (:class:`synthq.dp.lm.per_query.PerQueryClipping`), or at
``--privacy-unit user`` one user with all their kept queries (at most K; per-user clipping by
default, :class:`synthq.dp.lm.per_user.PerUserClipping`); sensitivity ``C`` either way. A starting model
that is a synthq artifact composes its own guarantee; any other local or hub model is recorded and
assumed public (:func:`synthq.bookkeeping.inputs.model_input`).

The artifact is a Hugging Face ``save_pretrained`` directory (LoRA adapters merged). Per-step
losses and batch sizes, which are computed from private data without noise, go to the private
``diagnostics/`` part (ε = ∞, left out by ``synthq export``). Checkpoints every
``checkpoint_every`` steps hold the weights, optimizer, step, the secret randomness and the
config; ``--resume`` continues with identical accounting and refuses a changed config.

Options left unset are chosen for the machine and the data (:func:`choose_defaults`,
:mod:`synthq.models.defaults`): the document length from the PUBLIC corpus's documents (never the
queries, nor which documents they judge), a fixed 32 query tokens, and
the micro-batch by ``--profile``. The first line says what was chosen; the manifest's config
records the values used, while the fingerprint keeps the options as given (like ``--device auto``),
so the same command stays up to date.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from synthq.artifacts.checkpoint import load_checkpoint, save_checkpoint
from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.artifacts.on_main import artifact_on_main
from synthq.bookkeeping.inputs import artifact_inside, data_input, model_input, public_pairs_input
from synthq.bookkeeping.splits import public_read_record, split_is_private
from synthq.config.fields import DEFAULT_TOP_P, revalidated
from synthq.config.generator import FinetuneConfig
from synthq.data.pairs import training_pairs
from synthq.data.sources import load_source, qrels_splits
from synthq.dp.batch_choice import choose_batch_size
from synthq.dp.engine import Mechanism, PrivacyPlan, mechanism_class, planned_steps
from synthq.dp.lm.learning_check import HELD_OUT_PAIRS, HeldOut, LearningCheck
from synthq.dp.lm.training import GeneratorTraining
from synthq.dp.noise import SecretRandomness
from synthq.dp.privacy_units import (
    PrivacyUnits,
    describe_units,
    public_count_assumption,
    training_units,
    unit_details,
    unit_diagnostics,
)
from synthq.models.defaults import Chosen, finetune_defaults, hardware_profile, why_corpus_is_public
from synthq.models.generator import QueryGenerator, apply_lora, check_generator_model, check_lora_targets
from synthq.models.query_only import INVOCATION_TOKENS, CachedRows, QueryOnlyView, query_only_micro_batch
from synthq.models.stage_costs import expected_line, generator_training_seconds, parameter_count
from synthq.models.training_step import non_private_step, training_statistics
from synthq.privacy.accounting import default_delta
from synthq.privacy.digests import public_split_record
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.runtime import distributed, precision
from synthq.runtime.console import StepFraction, info, progress, warn
from synthq.runtime.errors import SettingError
from synthq.runtime.optim import make_optimizer

STAGE = "finetune-lm"
CHECKPOINT = "state.pt"
PER_SAMPLE_CLIPPING = {
    "vmap": "torch.func vmap per-example gradients (exact, every trainable parameter)",
    "hooks": "Opacus hook per-example gradients (exact, every trainable parameter)",
    "ghost": "ghost clipping with book-keeping (exact per-example norms, every trainable parameter)",
}


def _write_log(path: Path, log: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in log:
            handle.write(json.dumps(row) + "\n")


def _plan(config: FinetuneConfig, units: PrivacyUnits, steps: int) -> PrivacyPlan | None:
    """The DP plan for a finite ε (``None``: non-private training)."""
    return PrivacyPlan.for_stage(
        config, num_units=len(units), expected_batch_size=config.batch_size, steps=steps,
        mechanism=_mechanism(config)(config.clip_norm), unit=units.kind,
    )  # fmt: skip


def _auto_batch(config: FinetuneConfig, settings: FinetuneConfig, fitted: Chosen, units: PrivacyUnits):
    """``--batch-size auto`` resolved (:func:`~synthq.dp.batch_choice.choose_batch_size`): the
    settings with the chosen batch, and the choice among the defaults the first line reports."""
    delta = config.delta if config.delta is not None else default_delta(len(units))
    choice = choose_batch_size(
        len(units), config.epochs, config.max_steps, config.epsilon, delta, config.accountant
    )
    fitted.add("batch_size", choice.batch_size, choice.line(units.kind))
    return settings.model_copy(update={"batch_size": choice.batch_size}), fitted


# --user-clipping -> the mechanism registered for it (synthq.dp.engine's one registry, which the
# retrievers' --dp reads too): per example weighted 1/k (per-query), or per user
CLIPPING_MECHANISMS = {"per-example": "per-query", "per-user": "per-user"}


def _mechanism(config: FinetuneConfig) -> type[Mechanism]:
    """The clipping rule behind the sensitivity, from the registry of mechanisms."""
    return mechanism_class(CLIPPING_MECHANISMS[config.user_clipping])


def _optimizer(config: FinetuneConfig, trainable: list[torch.nn.Parameter], plan: PrivacyPlan | None):
    """The optimizer; ``adam-bc`` removes the plan's gradient-noise variance (public: σ, Δ, B)
    from Adam's second moment (0 without DP)."""
    noise_variance = plan.gradient_noise_variance if plan is not None else 0.0
    return make_optimizer(config.optimizer, trainable, config.lr, config.weight_decay, noise_variance)


def _load_generator(config: FinetuneConfig, path: Path, rank: int) -> QueryGenerator:
    """The starting model (LoRA applied), identical on every rank, in train mode."""
    if config.seed is not None:  # public randomness (LoRA init, dropout): reproducible when asked
        torch.manual_seed(config.seed)
    generator = QueryGenerator.load(path, device="cpu", max_source_length=config.max_source_length)
    if generator.query_only:
        raise SettingError(
            f"--model {config.model} is a query-only generator (a base model and an adapter that acts on "
            "the query only); fine-tuning starts from one model: start from its base or a plain generator"
        )
    if config.lora_rank > 0:
        apply_lora(generator, config.lora_rank, config.lora_alpha, config.lora_targets)
    generator.model.to(distributed.device_for(config.device))
    distributed.broadcast_parameters(generator.model)  # identical replicas from the first step
    if config.seed is not None:
        torch.manual_seed(config.seed + rank)  # under torchrun, each rank its own dropout masks
    generator.model.train()
    return generator


def choose_defaults(config: FinetuneConfig, corpus, data, model_path: Path) -> tuple[FinetuneConfig, Chosen]:
    """The settings the run uses: ``config`` with the options left unset chosen for this machine
    and the public corpus (:mod:`synthq.models.defaults`: the document length from the corpus's
    documents only, never the queries or which documents they judge; the micro-batch by profile)."""
    if config.max_source_length is not None and config.physical_batch_size is not None:
        return config, Chosen()
    tokenizer = None
    if config.max_source_length is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
    why_public = why_corpus_is_public(config.data, data.is_artifact)
    device = distributed.device_for(config.device)
    chosen = finetune_defaults(config, tokenizer, corpus, why_public, device)
    if config.query_only and config.physical_batch_size is None:  # rows of query tokens only
        profile = hardware_profile(config.profile, device)
        size = query_only_micro_batch(profile, config.max_target_length)
        chosen.values["physical_batch_size"] = size
        chosen.reasons[-1] = f"physical batch {size} (query-only rows, {profile} profile)"
    return config.model_copy(update=chosen.values), chosen


def _held_out_read(config: FinetuneConfig, data) -> dict | None:
    """The first split (in name order) other than the training split that the dataset declares
    public (:func:`~synthq.bookkeeping.splits.split_is_private`, fail closed), as the read record of
    the learning check's held-out loss: a read of a public split, recorded like a warm start's so
    that a retracted declaration is noticed (review round 5); None for a synthetic set or when no
    split is public."""
    if data.artifact is not None:
        return None
    for split in sorted(qrels_splits(data.root) - {config.split}):
        if split_is_private(config.data, data.root, split) or artifact_inside(data.root, split) is not None:
            continue  # private, or a link into an artifact (a release, not public pairs)
        read = public_split_record(data.root, config.data, split)
        if read is not None:
            return {**public_read_record(read, config.data), "role": "held-out loss"}
    return None


def _public_held_out(config: FinetuneConfig, sources) -> HeldOut | None:
    """A few pairs of the held-out split :func:`_held_out_read` recorded, for the learning check."""
    if sources.held_out is None:
        return None
    split = sources.held_out["split"]
    pairs = training_pairs(load_source(str(sources.data.root), splits=[split]), split)[:HELD_OUT_PAIRS]
    return HeldOut(split, [p.document for p in pairs], [p.query for p in pairs]) if len(pairs) else None


def _own_guarantee(config, plan, training: GeneratorTraining, units: PrivacyUnits) -> Guarantee:
    """What this run itself releases about the private pairs."""
    if plan is None:
        return Guarantee.non_private("fine-tuned on the private queries without DP (ε = ∞)", unit=units.kind)
    details = {
        **unit_details(units),
        "clip_norm": config.clip_norm,
        "sensitivity_rule": _mechanism(config).sensitivity_rule,
        "user_clipping": config.user_clipping,
        "per_sample_clipping": PER_SAMPLE_CLIPPING[training.mode]
        + ("; norms of each user's combined gradient" if config.user_clipping == "per-user" else ""),
        "trainable": "LoRA adapters" if config.lora_rank else "all parameters",
    }
    if config.query_only:
        details["trainable"] = (
            "LoRA adapters on the decoder (query-only: the frozen encoder's output cached)"
            if training.generator.kind == "seq2seq"
            else "LoRA adapters on the invocation and query tokens (query-only; activated LoRA)"
        )
    assumptions = [training.randomness.assumption(), public_count_assumption(units)]
    return plan.guarantee(mechanism=f"dp-{config.optimizer}", details=details, assumptions=assumptions)


def _diagnostics(log: list[dict], elapsed: float, steps_run: int) -> dict:
    """Training statistics of private batches (ε = ∞: for the private diagnostics only)."""
    losses = [row["loss"] for row in log if not math.isnan(row["loss"])]
    examples = sum(row["examples"] for row in log)
    return {**training_statistics(losses, elapsed, steps_run), "examples_seen": examples}


WARM_START_BATCH = 16  # public pairs per warm-start step


def _batches_of(generator: QueryGenerator, pairs, max_target_length: int):
    """Row indices of ``pairs`` -> the generator's training batch of those pairs."""

    def make_batch(rows: list[int]) -> dict[str, torch.Tensor]:
        chosen = [pairs[i] for i in rows]
        return generator.training_batch(
            [p.document for p in chosen], [p.query for p in chosen], max_target_length
        )

    return make_batch


def _warm_start(config: FinetuneConfig, settings: FinetuneConfig, generator: QueryGenerator, public) -> dict:
    """The public phase: ``warm_start_epochs`` over the public pairs without DP (Adam at the run's
    learning rate, shuffled by a public seed), before any private pair is read. Returns its
    statistics (public data: they go into the released metrics)."""
    pairs = public.pairs
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    optimizer = make_optimizer("adam", trainable, config.lr)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(config.seed or 0)).tolist()
    steps = max(1, math.ceil(config.warm_start_epochs * len(pairs) / WARM_START_BATCH))
    order = (order * math.ceil(steps * WARM_START_BATCH / len(pairs) + 1))[: steps * WARM_START_BATCH]

    make_batch = _batches_of(generator, pairs, settings.max_target_length)
    losses = []
    seconds = generator_training_seconds(
        steps * WARM_START_BATCH, settings.max_source_length, parameter_count(generator.model)
    )
    info(f"warm start on {public.spec}: {steps} public steps; {expected_line(seconds)}")
    with progress() as bar:
        task = bar.add_task(f"warm start on {public.spec}", total=steps)
        for step in range(steps):
            rows = order[step * WARM_START_BATCH : (step + 1) * WARM_START_BATCH]
            losses.append(
                non_private_step(generator, optimizer, make_batch, rows, settings.physical_batch_size).loss
            )
            bar.update(task, advance=1)
    info(f"warm start on {public.spec}: {steps} public steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return {"warm_start_steps": steps, "warm_start_first_loss": losses[0], "warm_start_last_loss": losses[-1]}


def _warm_start_only(config: FinetuneConfig, place, start) -> Artifact:
    """``--max-steps 0 --warm-start S``: the generator after the public phase and before any DP
    step — the ε = 0 control that tells how much of a synthetic row the private log buys.

    Nothing of ``--data`` is read (not its queries, not its corpus: the document length comes from
    the warm-start's public corpus unless ``--max-source-length`` is given), so the artifact records
    no release: ``generate`` with it writes an ε = 0 set, and the statement names the public pairs."""
    warm = public_pairs_input(config.warm_start, "--warm-start")
    inputs = [start.record, warm.record]
    if (done := distributed.on_main(existing_result, STAGE, config, inputs)) is not None:
        return done
    source = warm.spec.rpartition(":")[0]
    settings, fitted = config, Chosen()
    if config.max_source_length is None or config.physical_batch_size is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(start.path) if config.max_source_length is None else None
        corpus = load_source(source, splits=[warm.split]).corpus
        fitted = finetune_defaults(
            config, tokenizer, corpus, why_corpus_is_public(source), distributed.device_for(config.device)
        )
        settings = config.model_copy(update=fitted.values)
        if fitted.line():
            info(fitted.line())
    generator = _load_generator(settings, start.path, place.rank)
    warmed = _warm_start(config, settings, generator, warm)
    with artifact_on_main(config.out, STAGE, config, inputs, resume=False) as writer:
        writer.config.update(fitted.values)
        generator.model.eval()
        if writer.primary:
            generator.save(writer.dir, generation_defaults={"do_sample": True, "top_p": DEFAULT_TOP_P})
        start.carry_into(writer)
        writer.assume(warm.assumption)
        writer.metrics.update({**warmed, "steps": 0, "kind": generator.kind})
    return distributed.on_main(open_artifact, config.out, STAGE)


@dataclass(frozen=True)
class _Sources:
    """What a run reads: the private pairs' dataset, the starting model, public warm-start pairs."""

    data: Any
    start: Any
    warm: Any | None
    held_out: dict | None = None  # the public split the learning check reads

    @property
    def records(self) -> list[dict]:
        reads = [self.warm.record] if self.warm else []
        return [self.data.record, self.start.record, *reads, *([self.held_out] if self.held_out else [])]


@dataclass
class _Setup:
    """Everything the training loop needs, decided before any private step (``units`` follows
    the secret key a resumed run restores)."""

    settings: FinetuneConfig  # the config with the options left unset chosen (fitted)
    fitted: Chosen
    pairs: Any
    units: PrivacyUnits
    steps: int
    plan: PrivacyPlan | None
    generator: QueryGenerator
    warmed: dict
    learning: LearningCheck
    training: GeneratorTraining


@precision.stage
def run(config: FinetuneConfig) -> Artifact:
    """Resolve the inputs, plan the DP run before reading a private step, train (resuming a
    checkpoint), then write the generator and the release of the private pairs."""
    config = revalidated(config)  # the checks that decide ε, however the config was built
    place = distributed.setup(config.device)
    start = model_input(config.model, stage=STAGE)
    check_generator_model(start.path, f"--model {config.model}")  # before any data is read
    if config.lora_rank > 0:
        check_lora_targets(start.path, config.lora_targets)  # before any data is read
    if config.max_steps == 0:
        return _warm_start_only(config, place, start)
    sources = _resolve_sources(config, start)
    if (done := distributed.on_main(existing_result, STAGE, config, sources.records)) is not None:
        return done
    setup = _set_up(config, sources, place)
    _announce(config, setup, place)
    with artifact_on_main(
        config.out, STAGE, config, sources.records, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        # the values used; the fingerprint keeps the options as given
        writer.config.update(setup.fitted.values)
        checkpoint = writer.checkpoint_dir / CHECKPOINT
        log = _resume(config, sources, setup, checkpoint)
        first, started = setup.training.step_index, time.perf_counter()
        with _prefix_cache(setup, writer):
            _train(config, sources, setup, writer, checkpoint, log)
        elapsed = time.perf_counter() - started
        _write_generator(writer, config, sources, setup)
        _write_release(writer, config, sources, setup, log, (elapsed, setup.steps - first))
    return distributed.on_main(open_artifact, config.out, STAGE)


# Phases ------------------------------------------------------------------------------------------


def _resolve_sources(config: FinetuneConfig, start) -> _Sources:
    data = data_input(config.data)
    _warn_of_settings_that_protect_nothing(config, data)
    warm = public_pairs_input(config.warm_start, "--warm-start") if config.warm_start else None
    return _Sources(data, start, warm, _held_out_read(config, data))


def _warn_of_settings_that_protect_nothing(config: FinetuneConfig, data) -> None:
    """Two runs that are accepted but do not do what their options suggest (issue #74): a user
    unit without DP (nothing is protected, per user or otherwise), and DP on a split the dataset
    declares public (ε spent on pairs that need none)."""
    private = not math.isinf(config.epsilon)
    if config.privacy_unit == "user" and not private:
        warn(
            "--privacy-unit user without DP (--epsilon inf) protects nothing: the generator is not "
            "private (ε = ∞); give a finite --epsilon for a per-user guarantee"
        )
    if private and not data.is_artifact and not split_is_private(config.data, data.root, config.split):
        warn(
            f"split {config.split!r} of {config.data} is declared public: DP spends ε on pairs that need "
            f"none; --warm-start {config.data}:{config.split} trains on them at no ε (and --split a "
            "private one for the DP phase)"
        )


def _set_up(config: FinetuneConfig, sources: _Sources, place) -> _Setup:
    """The pairs and units, the settings chosen for this machine and corpus (and ``--batch-size
    auto``), the DP plan (an impossible budget is refused before anything is said), the
    generator (warm-started on public pairs where asked) and its training state."""
    data = sources.data
    dataset = load_source(str(data.root), splits=[config.split])
    settings, fitted = choose_defaults(config, dataset.corpus, data, sources.start.path)
    pairs = training_pairs(dataset, config.split)
    pairs = pairs[: config.limit] if config.limit is not None else pairs  # refused with DP (config)
    randomness = SecretRandomness(config.seed)
    units = training_units(pairs, data.root, config.privacy_unit, config.max_queries_per_user, randomness)
    if config.batch_size == "auto":  # from n (recorded, assumed public) and the public settings
        settings, fitted = _auto_batch(config, settings, fitted, units)
    steps = planned_steps(len(units), settings.batch_size, config.epochs, config.max_steps)
    plan = _plan(settings, units, steps)
    if fitted.line():
        info(fitted.line())
    generator = _load_generator(settings, sources.start.path, place.rank)
    warmed = _warm_start(config, settings, generator, sources.warm) if sources.warm is not None else {}
    trained, make_batch = generator, _batches_of(generator, pairs, settings.max_target_length)
    if config.query_only:
        trained, make_batch = _query_only(settings, generator, pairs, warmed=sources.warm is not None)
    randomness.seed_torch(place.rank)  # dropout from the run's randomness, not torch's default seed
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    held_out = _public_held_out(config, sources)
    learning = LearningCheck(trained, trainable, held_out, settings.max_target_length)
    training = GeneratorTraining(
        trained, _optimizer(config, trainable, plan), make_batch,
        units, settings.batch_size, plan, randomness, settings.physical_batch_size, config.grad_sample_mode,
        config.user_clipping,
    )  # fmt: skip
    return _Setup(settings, fitted, pairs, units, steps, plan, generator, warmed, learning, training)


def _query_only(settings: FinetuneConfig, generator: QueryGenerator, pairs, warmed: bool):
    """``--query-only``: the warm-started adapters (public) merged into the frozen base model and
    fresh ones applied, which act on the invocation and query only (activated LoRA; a seq2seq
    model's on its decoder only, the frozen encoder's output cached); the view that DP steps train
    and the rows that read each document's prefix cache (built once in :func:`run`)."""
    seq2seq = generator.kind == "seq2seq"  # adapters on the decoder only: the encoder frozen
    if warmed or seq2seq:
        if settings.seed is not None:
            torch.manual_seed(settings.seed)
        generator.model = generator.model.merge_and_unload()
        apply_lora(
            generator, settings.lora_rank, settings.lora_alpha, settings.lora_targets, decoder_only=seq2seq
        )
        generator.model.to(distributed.device_for(settings.device))
        distributed.broadcast_parameters(generator.model)
        generator.model.train()
    generator.enable_query_only()
    view = QueryOnlyView(generator)
    rows = CachedRows(view, [p.document for p in pairs], [p.query for p in pairs], settings.max_target_length)
    return view, rows


@contextlib.contextmanager
def _prefix_cache(setup: _Setup, writer):
    """``--query-only``: every training document's prefix cache, computed once before the first
    step by the frozen model; in memory, or memory-mapped in the partial artifact's private
    ``checkpoints/`` (removed when the artifact is finished, never part of its payload), and
    dropped (its file deleted) when training ends, however it ends."""
    rows = setup.training.make_batch
    if not isinstance(rows, CachedRows):
        yield
        return
    store = rows.build(writer.checkpoint_dir)
    where = f"memory-mapped in the private {store.path.parent.name}/" if store.path else "in memory"
    info(f"query-only: {len(store):,} documents' prefix caches, {store.nbytes / 2**30:.2f} GiB, {where}")
    try:
        yield
    finally:
        rows.close()


def _announce(config: FinetuneConfig, setup: _Setup, place) -> None:
    """The run's first line: the model, the steps and the DP plan (σ, q, σ/B) or "non-private"."""
    plan, generator = setup.plan, setup.generator
    trainable = sum(p.numel() for p in generator.model.parameters() if p.requires_grad)
    info(
        f"fine-tuning {config.model} ({generator.kind}, {trainable:,} trainable) for {setup.steps} steps, "
        + (
            f"{describe_units(setup.units)}, q = {plan.sample_rate:.4f}, σ = {plan.noise_multiplier:.3f}, "
            f"C = {config.clip_norm}, noise/signal σ/B = {plan.noise_to_signal:.3g} "
            f"(σC/B = {plan.noise_std / plan.expected_batch_size:.3g} per coordinate), "
            f"target ε = {config.epsilon:g} ({plan.accountant}), clipping: {setup.training.mode}"
            + (", per user" if config.user_clipping == "per-user" else "")
            if plan
            else "non-private (ε = ∞)"
        )
        + (f"; {place.world_size} ranks ({place.backend})" if place.world_size > 1 else "")
    )
    per_user = setup.units.kind == "user"  # rows counted at K per user: read from no text
    rows = setup.steps * setup.settings.batch_size * (config.max_queries_per_user if per_user else 1)
    tokens = setup.settings.max_source_length
    if config.query_only:  # each row runs its invocation and query tokens only
        tokens = INVOCATION_TOKENS + setup.settings.max_target_length
    seconds = generator_training_seconds(rows, tokens, parameter_count(generator.model))
    info(expected_line(seconds))


def _resume(config: FinetuneConfig, sources: _Sources, setup: _Setup, checkpoint: Path) -> list[dict]:
    """The step log so far: empty, or the checkpoint's (``--resume``), whose training state and
    secret randomness are restored into ``setup``."""
    state = (
        distributed.on_main(load_checkpoint, checkpoint, config, sources.records) if config.resume else None
    )
    if state is None:
        return []
    training = setup.training
    training.load_state_dict(state)
    if setup.units.kind == "user":  # which queries a user keeps follows the restored secret key
        setup.units = training.units = training_units(
            setup.pairs,
            sources.data.root,
            config.privacy_unit,
            config.max_queries_per_user,
            training.randomness,
        )
    info(f"resuming at step {training.step_index} of {setup.steps}")
    return json.loads(state["log"])


def _train(config: FinetuneConfig, sources: _Sources, setup: _Setup, writer, checkpoint: Path, log) -> None:
    """The steps left, with ε on the bar a few times per run and a checkpoint every
    ``--checkpoint-every`` steps."""
    training, plan, steps = setup.training, setup.plan, setup.steps
    every = max(1, steps // 20)  # ε by the plan's own accountant, a few times per run
    with progress() as bar:
        task = bar.add_task("finetune-lm", total=steps, completed=training.step_index)
        within = StepFraction(bar, task)  # micro-batch by micro-batch: a DP step takes minutes on CPU
        while training.step_index < steps:
            result = training.step(within)
            log.append({"step": training.step_index, "loss": result.loss, "examples": result.examples})
            if plan and (training.step_index % every == 0 or training.step_index == steps):
                spent = format_epsilon(plan.epsilon_after(training.step_index))
                bar.update(task, description=f"finetune-lm ε {spent}")
            within.finish()
            if (
                writer.primary
                and config.checkpoint_every
                and training.step_index % config.checkpoint_every == 0
            ):
                state = {**training.state_dict(), "log": json.dumps(log)}
                save_checkpoint(checkpoint, state, config, sources.records)


def _write_generator(writer, config: FinetuneConfig, sources: _Sources, setup: _Setup) -> None:
    """The generator (no clipping hooks), what it learned, and where it started."""
    setup.training.close()  # the saved model carries no clipping hooks
    trained = "LoRA adapters" if config.lora_rank else "all weights"
    writer.metrics.update(setup.learning.finish(setup.steps, trained))
    setup.generator.model.eval()
    if writer.primary:
        setup.generator.save(writer.dir, generation_defaults={"do_sample": True, "top_p": DEFAULT_TOP_P})
    sources.start.carry_into(writer)
    if sources.warm is not None:  # public pairs: no release, but the guarantee names them
        writer.assume(sources.warm.assumption)
        writer.metrics.update(setup.warmed)


def _write_release(writer, config, sources: _Sources, setup: _Setup, log, timing: tuple[float, int]) -> None:
    """This run's release of the private pairs (and what a synthetic set as data brings along);
    the step log, timings and unit statistics go to the private diagnostics."""
    if sources.data.artifact is not None:  # DP on a synthetic set: it is itself a release of D
        writer.inherit(sources.data.artifact)
    units, training = setup.units, setup.training
    guarantee = _own_guarantee(config, setup.plan, training, units)
    writer.release(guarantee, sources.data.record, units.keys, units.kind, links=units.links)
    writer.metrics.update(
        {"steps": setup.steps, "kind": setup.generator.kind, "grad_sample_mode": training.mode}
    )
    _write_log(writer.diagnostics_dir / "training.jsonl", log)
    elapsed, steps_run = timing
    writer.diagnostics.update(
        _diagnostics(log, elapsed, steps_run), **unit_diagnostics(units, len(setup.pairs))
    )
    writer.timings_are_private = True
