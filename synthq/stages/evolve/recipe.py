"""``synthq evolve``: DP synthetic queries by Private Evolution — a public model writes, the
private pairs only vote.

The other generator family beside ``finetune-lm`` + ``generate``: no gradient ever touches the
model, so any public model that can be prompted works, and the cost is generation alone
(Lin et al., ICLR 2024; Aug-PE, Xie et al., ICML 2024; here conditioned on documents):

1. **Random API.** For every public document, ``--population`` queries written by the public
   model (``--model``) from a prompt that asks for a search query the document answers.
2. **Vote** (the only step that reads private data, :mod:`synthq.dp.evolution`): every private
   (document, query) pair finds its nearest synthetic pair in the joint embedding
   ``[e(d); e(q)] / √2`` of a public encoder (``--embedder``); each privacy unit's votes are
   scaled to L2 norm 1 and ``N(0, σ²)`` is added to every count.
3. **Select and vary.** Per document, the candidate with the most noisy votes survives and the
   public model writes ``population − 1`` variations of it ("another search query for this
   document"), which compete in the next vote. After ``--iterations`` votes, each document keeps
   its ``--queries-per-document`` best candidates.

Privacy: ``T`` Gaussian mechanisms of sensitivity 1 without subsampling; σ is calibrated for
the target ε by the engine's accountant (:class:`synthq.dp.engine.PrivacyPlan` with ``q = 1``
and ``T`` steps; the guarantee also records μ = √T/σ of Gaussian DP). Everything else is
post-processing of the noisy counts and public inputs. Which documents get queries is public
(every document of ``--corpus``, a public ``--documents`` list, or, under a recorded
assumption, the documents judged in ``--judged-split``). The artifact holds synthetic queries
only; the un-noised vote counts are in ``diagnostics/`` (ε = ∞, never exported). Sampling of
the public model is seeded by ``--generation-seed`` (public: it only replays what a public model
writes); the noise comes from the secret randomness.

The artifact is a synthetic set in the same BEIR layout as ``generate``'s, so ``filter``,
``train-retriever``, ``eval``, ``similarity`` and the ledger take it unchanged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from synthq.artifacts.checkpoint import load_checkpoint, save_checkpoint
from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.bookkeeping.inputs import DataInput, ModelInput, data_input, model_input, public_documents_input
from synthq.config.fields import revalidated
from synthq.config.generator import EvolveConfig
from synthq.data.pairs import document_text, training_pairs
from synthq.data.sources import load_source, resolve_source
from synthq.data.synthetic import (
    public_documents,
    write_synthetic,
)
from synthq.dp.engine import PrivacyPlan
from synthq.dp.evolution import (
    NearestNeighbourVotes,
    joint_vectors,
    nearest_synthetic,
    noisy_histogram,
    vote_histogram,
)
from synthq.dp.noise import SecretRandomness
from synthq.dp.privacy_units import (
    PrivacyUnits,
    describe_units,
    public_count_assumption,
    training_units,
    unit_details,
    unit_diagnostics,
)
from synthq.models.generator import QueryGenerator
from synthq.models.stage_costs import expected_line, generation_seconds, parameter_count
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.retrieval.cache import encode_texts
from synthq.runtime import distributed, precision
from synthq.runtime.console import info
from synthq.runtime.errors import SynthqError
from synthq.stages.evolve.population import (
    Population,
    Ranked,
    best_per_document,
    checkpoint_state,
    ranked_per_document,
)
from synthq.stages.evolve.prompts import Prompter

STAGE = "evolve"
CHECKPOINT = "state.pt"


@dataclass(frozen=True)
class _Sources:
    """What the run reads: the private data, the public model and embedder, the public documents
    (with the assumptions their choice rests on), and the input records of all of them."""

    data: DataInput
    start: ModelInput
    embedder: ModelInput
    root: Path
    assumptions: list
    records: list[dict]


@dataclass(frozen=True)
class _Setup:
    """The private units and their privacy plan, the public documents and the public models."""

    pairs: list
    randomness: SecretRandomness
    units: PrivacyUnits
    plan: PrivacyPlan | None
    corpus: dict[str, dict]
    doc_ids: list[str]
    generator: QueryGenerator
    prompter: Prompter
    embedder: object


@dataclass(frozen=True)
class _Space:
    """The embeddings every vote uses: the private pairs' joint vectors and the public documents'."""

    truncated: dict[str, str]
    private_vectors: np.ndarray
    document_vectors: dict[str, np.ndarray]


class _Clock:
    """Seconds spent generating, embedding and voting, and in all since the start."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds = {"generate": 0.0, "embed": 0.0, "vote": 0.0}

    def timed(self, kind: str, function, *args):
        began = time.perf_counter()
        value = function(*args)
        self.seconds[kind] += time.perf_counter() - began
        return value

    def timings(self) -> dict[str, float]:
        return {f"{kind}_seconds": round(value, 3) for kind, value in self.seconds.items()} | {
            "total_seconds": round(time.perf_counter() - self.started, 3)
        }


@precision.stage
def run(config: EvolveConfig) -> Artifact:
    """Set up the units and the public model, write the first population (or resume it), take
    ``--iterations`` noisy votes with selection and variation between them, and write the set."""
    config = revalidated(config)  # the checks that decide ε, however the config was built
    if distributed.setup(config.device).world_size > 1:
        raise SynthqError("synthq evolve runs in one process; start it without torchrun")
    sources = _resolve_sources(config)
    if (done := existing_result(STAGE, config, sources.records)) is not None:
        return done
    setup = _set_up(config, sources)
    with create_artifact(
        config.out, STAGE, config, sources.records, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        clock = _Clock()
        checkpoint = writer.checkpoint_dir / CHECKPOINT
        state = load_checkpoint(checkpoint, config, sources.records) if config.resume else None
        if state is not None:
            setup = _restore_randomness(config, sources, setup, state)
        space = _encode(config, setup, clock)
        if state is None:
            population = _random_population(config, setup, space, clock)
            save_checkpoint(
                checkpoint, checkpoint_state(population, setup.randomness), config, sources.records
            )
        else:
            population = Population.from_state(state)
        for iteration in range(population.votes_done + 1, config.iterations + 1):
            ranked, population = _vote(iteration, config, setup, space, population, clock)
            if iteration == config.iterations:
                final = best_per_document(ranked, population.candidates, config.queries_per_document)
                break
            population = _select_and_vary(iteration, ranked, config, setup, space, population, clock)
            save_checkpoint(
                checkpoint, checkpoint_state(population, setup.randomness), config, sources.records
            )
        _write_synthetic_set(writer, config, setup, final, population, clock)
        _write_release(writer, config, sources, setup, population)
    return open_artifact(config.out, STAGE)


# Phases ------------------------------------------------------------------------------------------


def _resolve_sources(config: EvolveConfig) -> _Sources:
    start = model_input(config.model, stage="finetune-lm")
    embedder = model_input(config.embedder, stage="train-retriever")
    data = data_input(config.data)
    root = resolve_source(config.corpus)
    documents, assumptions = public_documents_input(
        root, config.corpus, config.documents, config.judged_split
    )
    records = [data.record, start.record, {**embedder.record, "role": "embedder"}, *documents]
    return _Sources(data, start, embedder, root, assumptions, records)


def _set_up(config: EvolveConfig, sources: _Sources) -> _Setup:
    """The private pairs and their units (drawing on the secret randomness), σ for the target ε,
    the public documents, and the public model and embedder."""
    from synthq.models.encoder import load_encoder

    device = distributed.device_for(config.device)
    pairs = training_pairs(load_source(str(sources.data.root), splits=[config.split]), config.split)
    randomness = SecretRandomness(config.seed)
    units = training_units(
        pairs, sources.data.root, config.privacy_unit, config.max_queries_per_user, randomness
    )
    plan = _plan(config, len(units), units.kind)
    corpus, doc_ids = public_documents(sources.root, config.documents, config.judged_split)
    generator = QueryGenerator.load(
        sources.start.path, device=device, max_source_length=config.max_source_length
    )
    generator.model.eval()
    embedder = load_encoder(str(sources.embedder.path), device=device)
    info(
        f"evolving queries for {len(doc_ids)} public documents with {config.model} "
        f"({config.population} per document, {config.iterations} votes of {describe_units(units)}"
        + (
            f", σ = {plan.noise_multiplier:.3f}, target ε = {config.epsilon:g} ({plan.accountant}))"
            if plan
            else ", ε = ∞)"
        )
    )
    written = len(doc_ids) * (config.population + (config.iterations - 1) * (config.population - 1))
    seconds = generation_seconds(  # the few-shot prefix is prefilled once: each prompt is its document
        written, generator.max_source_length, config.max_new_tokens, parameter_count(generator.model)
    )
    info(f"{written:,} queries to write; {expected_line(seconds)}")
    return _Setup(pairs, randomness, units, plan, corpus, doc_ids, generator, Prompter(generator), embedder)


def _plan(config: EvolveConfig, num_units: int, unit: str) -> PrivacyPlan | None:
    """Every vote counts every unit once (the "batch" is all units), ``iterations`` votes."""
    return PrivacyPlan.for_stage(
        config, num_units=num_units, expected_batch_size=num_units, steps=config.iterations,
        mechanism=NearestNeighbourVotes(), unit=unit,
    )  # fmt: skip


def _restore_randomness(config: EvolveConfig, sources: _Sources, setup: _Setup, state: dict) -> _Setup:
    """The secret randomness as the checkpoint left it (later votes continue its noise stream)."""
    setup.randomness.load_state_dict(state["randomness"])
    if setup.units.kind == "user":  # which queries a user keeps follows the restored secret key
        units = training_units(
            setup.pairs, sources.data.root, config.privacy_unit, config.max_queries_per_user, setup.randomness
        )
        setup = replace(setup, units=units)
    info(f"resuming after vote {state['votes_done']} of {config.iterations}")
    return setup


def _encode(config: EvolveConfig, setup: _Setup, clock: _Clock) -> _Space:
    """The documents as the public model reads them, and the embeddings of the private pairs and
    of the public documents."""
    texts = [document_text(setup.corpus[d]) for d in setup.doc_ids]
    truncated = dict(zip(setup.doc_ids, setup.generator.truncated_documents(texts), strict=True))
    batch_size = config.encode_batch_size
    private_vectors = clock.timed("embed", _private_joint_vectors, setup.embedder, setup.pairs, batch_size)
    encoded = clock.timed("embed", encode_texts, setup.embedder, texts, batch_size, "encoding documents")
    return _Space(truncated, private_vectors, dict(zip(setup.doc_ids, encoded, strict=True)))


def _random_population(config: EvolveConfig, setup: _Setup, space: _Space, clock: _Clock) -> Population:
    """Random API: ``--population`` queries the public model writes for every document."""
    prompts = {
        (d, k): setup.prompter.random(space.truncated[d])
        for d in setup.doc_ids
        for k in range(config.population)
    }
    candidates = clock.timed("generate", setup.prompter.generate, prompts, config, "writing queries")
    return Population.first(candidates, config.population)


def _vote(
    iteration: int, config: EvolveConfig, setup: _Setup, space: _Space, population: Population, clock: _Clock
) -> tuple[Ranked, Population]:
    """The private pairs' noisy vote over the candidates (the only step that reads private data),
    and each document's candidates ranked by it."""
    keys = sorted(population.candidates)
    queries = [population.candidates[k] for k in keys]
    query_vectors = clock.timed(
        "embed", encode_texts, setup.embedder, queries, config.encode_batch_size, "encoding synthetic queries"
    )
    synthetic = joint_vectors(np.stack([space.document_vectors[d] for d, _ in keys]), query_vectors)
    nearest = clock.timed("vote", nearest_synthetic, space.private_vectors, synthetic)
    counts = vote_histogram(nearest, setup.units, len(keys))
    plan = setup.plan
    noisy = noisy_histogram(counts, plan.noise_std, setup.randomness.noise) if plan else counts
    ranked = ranked_per_document(keys, noisy)
    info(
        f"vote {iteration}/{config.iterations}: "
        + (f"ε so far {format_epsilon(plan.epsilon_after(iteration))}" if plan else "ε = ∞")
    )
    return ranked, population.voted(iteration, counts, ranked)


def _select_and_vary(
    iteration: int,
    ranked: Ranked,
    config: EvolveConfig,
    setup: _Setup,
    space: _Space,
    population: Population,
    clock: _Clock,
) -> Population:
    """Per document, the winner survives and the public model writes ``population − 1``
    variations of it: the candidates of the next vote."""
    candidates, next_index = population.candidates, population.next_index
    prompts, survivors = {}, {}
    for doc_id, per_doc in ranked.items():
        winner = per_doc[0][0]
        survivors[winner] = candidates[winner]
        for offset in range(config.population - 1):
            prompts[(doc_id, next_index + offset)] = setup.prompter.variation(
                space.truncated[doc_id], candidates[winner]
            )
    description = f"varying queries (round {iteration})"
    varied = clock.timed("generate", setup.prompter.generate, prompts, config, description)
    return population.varied(iteration, {**survivors, **varied}, config.population - 1)


def _write_synthetic_set(
    writer, config: EvolveConfig, setup: _Setup, final: dict, population: Population, clock: _Clock
) -> None:
    """The synthetic set in ``generate``'s BEIR layout, its metrics and timings."""
    statistics = write_synthetic(
        writer.dir, setup.corpus, {key: {"query": text, "attempts": 1} for key, text in final.items()}
    )
    writer.metrics.update(
        {
            **statistics,
            "iterations": config.iterations,
            "population": config.population,
            "rounds": population.rounds,
        }
    )
    writer.timings.update(clock.timings())


def _write_release(
    writer, config: EvolveConfig, sources: _Sources, setup: _Setup, population: Population
) -> None:
    """The inputs carried in, the votes' guarantee and the private diagnostics."""
    sources.start.carry_into(writer)
    sources.embedder.carry_into(writer)
    if sources.data.artifact is not None:  # votes of a synthetic set: it is itself a release of D
        writer.inherit(sources.data.artifact)
    guarantee = _own_guarantee(config, setup.plan, setup.units, setup.randomness)
    writer.release(
        guarantee, sources.data.record, setup.units.keys, setup.units.kind, links=setup.units.links
    )
    if sources.assumptions:
        writer.assume(*sources.assumptions)
    writer.diagnostics.update(
        {"vote_counts_per_round": population.raw_counts, **unit_diagnostics(setup.units, len(setup.pairs))}
    )
    # Encoding the private pairs takes time that depends on their lengths, without noise: the
    # timings go to the private diagnostics, as fine-tuning's do.
    writer.timings_are_private = True


def _own_guarantee(config: EvolveConfig, plan: PrivacyPlan | None, units, randomness) -> Guarantee:
    """What the votes release about the private pairs."""
    if plan is None:
        return Guarantee.non_private(
            "Private Evolution's votes counted without noise (ε = ∞)", unit=units.kind
        )
    details = {
        **unit_details(units),
        "iterations": config.iterations,
        "population_per_document": config.population,
        "sensitivity_rule": NearestNeighbourVotes.sensitivity_rule,
        "gaussian_dp_mu": math.sqrt(config.iterations) / plan.noise_multiplier,
        "embedder": config.embedder,
    }
    assumptions = [randomness.assumption(), public_count_assumption(units)]
    return plan.guarantee(mechanism="private-evolution", details=details, assumptions=assumptions)


# Helpers -----------------------------------------------------------------------------------------


def _private_joint_vectors(embedder, pairs, batch_size: int) -> np.ndarray:
    """``[e(d); e(q)] / √2`` of every private pair (each distinct document encoded once)."""
    documents = {}
    for pair in pairs:
        documents.setdefault(pair.doc_id, pair.document)
    ids = list(documents)
    encoded = dict(
        zip(
            ids,
            encode_texts(embedder, [documents[d] for d in ids], batch_size, "encoding private documents"),
            strict=True,
        )
    )
    queries = encode_texts(embedder, [pair.query for pair in pairs], batch_size, "encoding private queries")
    return joint_vectors(np.stack([encoded[pair.doc_id] for pair in pairs]), queries)
