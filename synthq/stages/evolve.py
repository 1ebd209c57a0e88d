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

import json
import math
import os
import time
from pathlib import Path

import numpy as np

from synthq.artifacts import (
    Artifact,
    check_resumable,
    config_to_dict,
    create_artifact,
    existing_result,
    open_artifact,
)
from synthq.config import EvolveConfig
from synthq.data.pairs import document_text, training_pairs
from synthq.data.sources import load_source, resolve_source
from synthq.data.synthetic import (
    public_documents,
    write_synthetic,
)
from synthq.dp.engine import (
    PrivacyPlan,
    SecretRandomness,
    describe_units,
    public_count_assumption,
    unit_details,
    unit_diagnostics,
)
from synthq.dp.evolution import (
    NearestNeighbourVotes,
    joint_vectors,
    nearest_synthetic,
    noisy_histogram,
    vote_histogram,
)
from synthq.models.generator import QueryGenerator
from synthq.models.sampling import Request, length_sorted_batches, sample_with_retries
from synthq.privacy.guarantee import Guarantee
from synthq.privacy.ledger import data_input, model_input, public_documents_input
from synthq.privacy.units import training_units
from synthq.retrieval.cache import encode_texts
from synthq.runtime import distributed
from synthq.runtime.console import info, progress, warn
from synthq.runtime.errors import SynthqError

STAGE = "evolve"
CHECKPOINT = "state.pt"
MAX_RESAMPLE = 3
# Few-shot prompts on two public, hand-written examples (no private query is ever in a prompt).
# Measured on the demo's documents with SmolLM2-135M-Instruct: plain completion after these
# examples writes query-like text ("how do you sleep better"); the same request as a chat turn
# made it write prose about the document.
EXAMPLES = (
    (
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, 330 metres tall, completed in 1889.",
        "how tall is the eiffel tower",
        "eiffel tower height in metres",
    ),
    (
        "Preheat the oven to 180 C. Cream the butter and sugar, add eggs one at a time, fold in the "
        "flour and bake for 25 minutes.",
        "simple sponge cake recipe",
        "how long to bake a sponge cake",
    ),
)
RANDOM_PROMPT = (
    "Write the search query a person would type to find each document.\n\n"
    + "".join(f"Document: {document}\nQuery: {query}\n\n" for document, query, _ in EXAMPLES)
    + "Document: {document}\nQuery:"
)
VARIATION_PROMPT = (
    "Write two different search queries a person would type to find each document.\n\n"
    + "".join(
        f"Document: {document}\nQuery: {query}\nAnother query: {other}\n\n"
        for document, query, other in EXAMPLES
    )
    + "Document: {document}\nQuery: {query}\nAnother query:"
)


class Prompter:
    """The public model's two prompts: a new query for a document (random API) and another query
    like a given one (variation API). Causal models (base or instruct) complete a few-shot prompt
    (:data:`RANDOM_PROMPT`, :data:`VARIATION_PROMPT`); seq2seq models get their
    ``generate_query:`` input (the variation appends the query to vary)."""

    def __init__(self, generator: QueryGenerator):
        self.generator = generator
        # Prompts are complete strings: a generator that formats nothing and truncates nothing.
        self.prompting = QueryGenerator(
            generator.model, generator.tokenizer, 1_000_000, template="{document}"
        )

    def random(self, document: str) -> str:
        if self.generator.kind == "seq2seq":
            return document
        return RANDOM_PROMPT.replace("{document}", document)

    def variation(self, document: str, query: str) -> str:
        if self.generator.kind == "seq2seq":
            return f"{document} query: {query}"
        return VARIATION_PROMPT.replace("{document}", document).replace("{query}", query)

    def generate(self, prompts: dict[tuple[str, int], str], config: EvolveConfig, description: str) -> dict:
        """``(doc_id, index) -> query`` for every prompt, in batches of similar length."""
        requests = [Request(doc_id, prompt, index) for (doc_id, index), prompt in prompts.items()]
        written = {}
        with progress() as bar:
            task = bar.add_task(description, total=len(requests))
            for batch in length_sorted_batches(requests, self.prompting, config.generation_batch_size):
                results = sample_with_retries(
                    self.prompting, batch, config.generation_seed, config.top_p, config.temperature,
                    config.max_new_tokens, MAX_RESAMPLE,
                )  # fmt: skip
                written.update({key: result["query"] for key, result in results.items()})
                bar.advance(task, len(batch))
        return written


def _plan(config: EvolveConfig, num_units: int, unit: str) -> PrivacyPlan | None:
    if not math.isfinite(config.epsilon):
        return None
    plan = PrivacyPlan.create(
        num_units=num_units, expected_batch_size=num_units, steps=config.iterations, epsilon=config.epsilon,
        delta=config.delta, accountant=config.accountant, mechanism=NearestNeighbourVotes(), unit=unit,
    )  # fmt: skip
    if plan.fallback_reason:
        warn(f"accountant: {plan.fallback_reason}; using RDP")
    return plan


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


def run(config: EvolveConfig) -> Artifact:
    if distributed.setup(config.device).world_size > 1:
        raise SynthqError("synthq evolve runs in one process; start it without torchrun")
    start = model_input(config.model, stage="finetune-lm")
    embedder_input = model_input(config.embedder, stage="train-retriever")
    data = data_input(config.data)
    root = resolve_source(config.corpus)
    documents, assumptions = public_documents_input(
        root, config.corpus, config.documents, config.judged_split
    )
    inputs = [data.record, start.record, {**embedder_input.record, "role": "embedder"}, *documents]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    from synthq.models.encoder import load_encoder

    device = distributed.device_for(config.device)
    pairs = training_pairs(load_source(str(data.root), splits=[config.split]), config.split)
    randomness = SecretRandomness(config.seed)
    units = training_units(pairs, data.root, config.privacy_unit, config.max_queries_per_user, randomness)
    plan = _plan(config, len(units), units.kind)
    corpus, doc_ids = public_documents(root, config.documents, config.judged_split)
    generator = QueryGenerator.load(start.path, device=device, max_source_length=config.max_source_length)
    generator.model.eval()
    embedder = load_encoder(str(embedder_input.path), device=device)
    prompter = Prompter(generator)
    info(
        f"evolving queries for {len(doc_ids)} public documents with {config.model} "
        f"({config.population} per document, {config.iterations} votes of {describe_units(units)}"
        + (
            f", σ = {plan.noise_multiplier:.3f}, target ε = {config.epsilon:g} ({plan.accountant}))"
            if plan
            else ", ε = ∞)"
        )
    )
    with create_artifact(
        config.out, STAGE, config, inputs, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        started = time.perf_counter()
        seconds = {"generate": 0.0, "embed": 0.0, "vote": 0.0}

        def timed(kind: str, function, *args):
            began = time.perf_counter()
            value = function(*args)
            seconds[kind] += time.perf_counter() - began
            return value

        checkpoint = writer.checkpoint_dir / CHECKPOINT
        state = _load_checkpoint(checkpoint, config, inputs) if config.resume else None
        if state is not None:
            randomness.load_state_dict(state["randomness"])
            if units.kind == "user":  # which queries a user keeps follows the restored secret key
                units = training_units(
                    pairs, data.root, config.privacy_unit, config.max_queries_per_user, randomness
                )
            info(f"resuming after vote {state['votes_done']} of {config.iterations}")
        texts = [document_text(corpus[d]) for d in doc_ids]
        truncated = dict(zip(doc_ids, generator.truncated_documents(texts), strict=True))
        private_vectors = timed("embed", _private_joint_vectors, embedder, pairs, config.encode_batch_size)
        encoded = timed(
            "embed", encode_texts, embedder, texts, config.encode_batch_size, "encoding documents"
        )
        document_vectors = dict(zip(doc_ids, encoded, strict=True))
        if state is None:
            population = timed(
                "generate",
                prompter.generate,
                {(d, k): prompter.random(truncated[d]) for d in doc_ids for k in range(config.population)},
                config,
                "writing queries",
            )
            progress_state = {
                "votes_done": 0,
                "next_index": config.population,
                "rounds": [],
                "raw_counts": [],
            }
            _save_checkpoint(checkpoint, config, inputs, population, progress_state, randomness)
        else:
            population = {(d, int(k)): text for d, k, text in state["population"]}
            progress_state = {key: state[key] for key in ("votes_done", "next_index", "rounds", "raw_counts")}
        rounds, raw_counts = progress_state["rounds"], progress_state["raw_counts"]
        next_index = progress_state["next_index"]
        for iteration in range(progress_state["votes_done"] + 1, config.iterations + 1):
            keys = sorted(population)
            query_vectors = timed(
                "embed", encode_texts, embedder, [population[k] for k in keys], config.encode_batch_size,
                "encoding synthetic queries",
            )  # fmt: skip
            synthetic = joint_vectors(np.stack([document_vectors[d] for d, _ in keys]), query_vectors)
            nearest = timed("vote", nearest_synthetic, private_vectors, synthetic)
            counts = vote_histogram(nearest, units, len(keys))
            noisy = noisy_histogram(counts, plan.noise_std, randomness.noise) if plan else counts
            raw_counts.append(counts.tolist())
            ranked = _ranked_per_document(keys, noisy)
            rounds.append(
                {"round": iteration, "noisy_votes_of_winners": float(sum(r[0][1] for r in ranked.values()))}
            )
            info(
                f"vote {iteration}/{config.iterations}: "
                + (f"ε so far {plan.epsilon_after(iteration):.2f}" if plan else "ε = ∞")
            )
            if iteration == config.iterations:
                final = {
                    key: population[key]
                    for per_doc in ranked.values()
                    for key, _ in per_doc[: config.queries_per_document]
                }
                break
            prompts, survivors = {}, {}
            for doc_id, per_doc in ranked.items():
                winner = per_doc[0][0]
                survivors[winner] = population[winner]
                for offset in range(config.population - 1):
                    prompts[(doc_id, next_index + offset)] = prompter.variation(
                        truncated[doc_id], population[winner]
                    )
            next_index += config.population - 1
            varied = timed(
                "generate", prompter.generate, prompts, config, f"varying queries (round {iteration})"
            )
            population = {**survivors, **varied}
            progress_state = {
                "votes_done": iteration,
                "next_index": next_index,
                "rounds": rounds,
                "raw_counts": raw_counts,
            }
            _save_checkpoint(checkpoint, config, inputs, population, progress_state, randomness)
        statistics = write_synthetic(
            writer.dir, corpus, {key: {"query": text, "attempts": 1} for key, text in final.items()}
        )
        writer.metrics.update(
            {**statistics, "iterations": config.iterations, "population": config.population, "rounds": rounds}
        )
        writer.timings.update(
            {f"{kind}_seconds": round(value, 3) for kind, value in seconds.items()}
            | {"total_seconds": round(time.perf_counter() - started, 3)}
        )
        start.carry_into(writer)
        embedder_input.carry_into(writer)
        if data.artifact is not None:  # votes of a synthetic set: it is itself a release of D
            writer.inherit(data.artifact)
        writer.release(_own_guarantee(config, plan, units, randomness), data.record, units.keys, units.kind)
        if assumptions:
            writer.assume(*assumptions)
        writer.diagnostics.update(
            {"vote_counts_per_round": raw_counts, **unit_diagnostics(units, len(pairs))}
        )
        # Encoding the private pairs takes time that depends on their lengths, without noise: the
        # timings go to the private diagnostics, as fine-tuning's do.
        writer.timings_are_private = True
    return open_artifact(config.out, STAGE)


def _save_checkpoint(
    path: Path, config: EvolveConfig, inputs: list[dict], population: dict, progress_state: dict, randomness
) -> None:
    """A private, resumable checkpoint after the population for the next vote is written: the
    population, the rounds so far, the secret randomness (the noise of later votes continues its
    stream; a vote interrupted before the next checkpoint is redone with the same noise on the
    same population, so nothing new is released), the config and the inputs' identifiers."""
    import torch

    state = {
        **progress_state,
        "population": [[doc_id, index, text] for (doc_id, index), text in sorted(population.items())],
        "randomness": randomness.state_dict(),
        "config": json.dumps(config_to_dict(config), sort_keys=True),
        "inputs": json.dumps(inputs, sort_keys=True),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, config: EvolveConfig, inputs: list[dict]) -> dict | None:
    """The checkpoint at ``path``, refused if written with other settings or inputs."""
    import torch

    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    check_resumable(path, state, config, inputs)
    return state


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


def _ranked_per_document(
    keys: list[tuple[str, int]], noisy: np.ndarray
) -> dict[str, list[tuple[tuple[str, int], float]]]:
    """Per document, its candidates best first by noisy votes (ties to the lower index)."""
    ranked: dict[str, list] = {}
    for key, votes in zip(keys, noisy.tolist(), strict=True):
        ranked.setdefault(key[0], []).append((key, votes))
    return {
        doc_id: sorted(entries, key=lambda entry: (-entry[1], entry[0][1]))
        for doc_id, entries in ranked.items()
    }
