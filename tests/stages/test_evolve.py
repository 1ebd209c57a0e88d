"""synthq evolve (Private Evolution): the vote's sensitivity by brute force, ε against Opacus'
accountant and the analytic Gaussian mechanism, seeded determinism, an artifact the rest of the
pipeline takes, and no private query text in what is released."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from synthq.artifacts.manifest import open_artifact
from synthq.bookkeeping.releases import dataset_totals, ledger_lines
from synthq.config.generator import EvolveConfig
from synthq.data.beir_io import load_beir_dir
from synthq.dp.engine import PrivacyPlan
from synthq.dp.evolution import (
    NearestNeighbourVotes,
    joint_vectors,
    nearest_synthetic,
    noisy_histogram,
    vote_histogram,
)
from synthq.dp.privacy_units import PrivacyUnits
from synthq.stages import evaluate, train_retriever
from synthq.stages.evolve import recipe as evolve
from synthq.stages.evolve.population import Population, best_per_document, ranked_per_document
from tests.helpers import evolve_config, released_text, retriever_config


def test_removing_one_unit_moves_the_histogram_by_exactly_one_in_l2():
    rng = np.random.default_rng(0)
    size = 7
    for trial in range(200):
        rows_per_unit = rng.integers(1, 6, size=rng.integers(1, 12))
        units, row = [], 0
        for k in rows_per_unit:
            units.append(list(range(row, row + int(k))))
            row += int(k)
        nearest = rng.integers(0, size, size=row)
        full = vote_histogram(nearest, PrivacyUnits(rows=units), size)
        for removed in range(len(units)):
            rest = PrivacyUnits(rows=[u for i, u in enumerate(units) if i != removed])
            change = np.linalg.norm(full - vote_histogram(nearest, rest, size))
            assert change == pytest.approx(1.0, abs=1e-12), (trial, removed)
    assert NearestNeighbourVotes().sensitivity(None) == 1.0


def test_votes_go_to_the_nearest_synthetic_pair_of_the_same_document():
    documents = np.eye(4, dtype=np.float32)[:2]  # two documents
    queries = np.eye(4, dtype=np.float32)[2:]  # two query directions
    synthetic = joint_vectors(documents[[0, 0, 1, 1]], queries[[0, 1, 0, 1]])
    private = joint_vectors(documents[[1, 0]], queries[[1, 0]])
    assert nearest_synthetic(private, synthetic).tolist() == [3, 0]
    assert np.allclose(np.linalg.norm(synthetic, axis=1), 1.0)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_sigma_and_iterations_give_the_epsilon_of_opacus_and_of_the_analytic_gaussian(accountant):
    from opacus.accountants import RDPAccountant

    iterations, delta = 3, 1e-4
    plan = PrivacyPlan.create(
        num_units=500, expected_batch_size=500, steps=iterations, epsilon=2.0, delta=delta,
        accountant=accountant, mechanism=NearestNeighbourVotes(),
    )  # fmt: skip
    assert plan.sample_rate == 1.0 and plan.sensitivity == 1.0
    epsilon = plan.guarantee(mechanism="private-evolution").epsilon
    assert epsilon == pytest.approx(2.0, abs=0.02)
    rdp = RDPAccountant()
    rdp.history = [(plan.noise_multiplier, 1.0, iterations)]
    if accountant == "rdp":
        assert epsilon == pytest.approx(rdp.get_epsilon(delta), rel=1e-9)
    else:  # T Gaussian mechanisms without subsampling are exactly μ-GDP with μ = √T/σ (Dong et al.)
        mu = math.sqrt(iterations) / plan.noise_multiplier

        def exact_delta(eps: float) -> float:
            return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)

        exact = optimize.brentq(lambda eps: exact_delta(eps) - delta, 0.0, 50.0)
        assert exact <= epsilon <= exact + 0.05  # PRV: an upper bound within its discretisation error
        assert epsilon < rdp.get_epsilon(delta)  # RDP's conversion is looser


def test_noise_comes_from_the_given_stream():
    counts = np.zeros(1000)
    first = noisy_histogram(counts, 2.0, torch.Generator().manual_seed(1))
    second = noisy_histogram(counts, 2.0, torch.Generator().manual_seed(1))
    assert np.array_equal(first, second) and np.std(first) == pytest.approx(2.0, rel=0.1)


def test_a_vote_ranks_each_documents_candidates_and_the_population_moves_on():
    keys = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    ranked = ranked_per_document(keys, np.array([1.0, 3.0, 2.0, 2.0]))
    assert ranked == {"a": [(("a", 1), 3.0), (("a", 0), 1.0)], "b": [(("b", 0), 2.0), (("b", 1), 2.0)]}
    first = Population.first({k: f"q{i}" for i, k in enumerate(keys)}, size=2)
    voted = first.voted(1, np.array([0.0, 1.0, 1.0, 0.0]), ranked)
    assert voted.rounds == [{"round": 1, "noisy_votes_of_winners": 5.0}] and first.rounds == []
    assert voted.raw_counts == [[0.0, 1.0, 1.0, 0.0]]
    varied = voted.varied(1, {("a", 1): "q1", ("a", 2): "new"}, added=1)
    assert (varied.votes_done, varied.next_index, varied.rounds) == (1, 3, voted.rounds)
    state = {**varied.state(), "population": [["a", 1, "q1"], ["a", 2, "new"]]}
    assert Population.from_state(state) == varied
    assert best_per_document(ranked, first.candidates, 1) == {("a", 1): "q1", ("b", 0): "q2"}


def _config(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, name, **options) -> EvolveConfig:
    return evolve_config(tmp_path / name, tiny_beir, tiny_causal_dir, tiny_encoder_dir, **options)


@pytest.fixture(scope="module")
def evolved(tmp_path_factory, tiny_beir, tiny_causal_dir, tiny_encoder_dir):
    root = tmp_path_factory.mktemp("evolve")
    return evolve.run(_config(root, tiny_beir, tiny_causal_dir, tiny_encoder_dir, "pe"))


def test_evolve_writes_a_dp_synthetic_set_the_pipeline_takes(evolved, tmp_path, tiny_beir, tiny_encoder_dir):
    data = load_beir_dir(evolved.path)
    corpus = load_beir_dir(tiny_beir).corpus
    assert set(data.corpus) == set(corpus) and len(data.qrels["train"]) == len(corpus)  # one query each
    privacy = evolved.privacy
    assert privacy.mechanism == "private-evolution" and privacy.unit == "query"
    assert privacy.epsilon == pytest.approx(4.0, abs=0.05)
    details = privacy.details
    assert details["sample_rate"] == 1.0 and details["steps"] == 2 and details["sensitivity"] == 1.0
    assert details["gaussian_dp_mu"] == pytest.approx(math.sqrt(2) / details["noise_multiplier"])
    assert len(evolved.metrics["rounds"]) == 2
    retriever = train_retriever.run(retriever_config(tmp_path / "r", evolved.path, tiny_encoder_dir))
    assert retriever.privacy.epsilon == pytest.approx(privacy.epsilon)  # post-processing
    assert {r["id"] for r in evolved.releases} <= {r["id"] for r in retriever.releases}
    assert evaluate.describe_method(retriever).startswith("synthetic (PE ")
    totals = dataset_totals([retriever.path, evolved.path])  # the ledger: one release of the data
    assert list(totals.values()) == [pytest.approx(privacy.epsilon)]
    assert f"ε={privacy.epsilon:.2f}" in "\n".join(ledger_lines([retriever.path]))


def test_no_private_query_text_is_released(evolved, tiny_beir):
    released = released_text(evolved)
    private = load_beir_dir(tiny_beir)
    for query_id in private.qrels["train"]:
        text = private.queries[query_id]
        assert text not in released and query_id not in released
    votes = json.loads((evolved.path / "diagnostics" / "metrics.json").read_text())
    assert len(votes["vote_counts_per_round"]) == 2  # un-noised counts: private diagnostics only
    assert "generate_seconds" in votes["timings"] and not evolved.timings  # they depend on private lengths


def test_a_seeded_run_is_reproducible(evolved, tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir):
    again = evolve.run(_config(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, "again"))
    assert (again.path / "queries.jsonl").read_bytes() == (evolved.path / "queries.jsonl").read_bytes()
    assert open_artifact(again.path).privacy.epsilon == evolved.privacy.epsilon


def test_keeping_more_than_the_population_is_refused(tmp_path, tiny_beir):
    with pytest.raises(ValueError, match="more than the --population"):
        EvolveConfig(out=tmp_path / "x", data=str(tiny_beir), population=2, queries_per_document=3)


def test_an_interrupted_run_resumes_to_the_same_queries(
    evolved, tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, monkeypatch
):
    """Killed while writing the variations after the first vote, a rerun with --resume continues
    from the checkpoint (the written population and the secret randomness after that vote) and
    ends with the queries of an uninterrupted run; other settings are refused."""
    from synthq.runtime.errors import ArtifactError

    calls, original = [], evolve.Prompter.generate

    def dies_on_the_variations(self, prompts, config, description):
        calls.append(description)
        if description.startswith("varying"):
            raise RuntimeError("killed")
        return original(self, prompts, config, description)

    monkeypatch.setattr(evolve.Prompter, "generate", dies_on_the_variations)
    with pytest.raises(RuntimeError, match="killed"):
        evolve.run(_config(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, "cut"))
    monkeypatch.setattr(evolve.Prompter, "generate", original)
    assert (tmp_path / ".cut.partial" / "checkpoints" / evolve.CHECKPOINT).is_file() and not (
        tmp_path / "cut"
    ).exists()
    with pytest.raises(ArtifactError, match="other settings"):
        evolve.run(
            _config(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, "cut", resume=True, top_p=0.5)
        )
    resumed_calls = []

    def recorded(self, prompts, config, description):
        resumed_calls.append(description)
        return original(self, prompts, config, description)

    monkeypatch.setattr(evolve.Prompter, "generate", recorded)
    resumed = evolve.run(_config(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, "cut", resume=True))
    assert resumed_calls == ["varying queries (round 1)"]  # the first population came from the checkpoint
    assert (resumed.path / "queries.jsonl").read_bytes() == (evolved.path / "queries.jsonl").read_bytes()
    assert resumed.privacy.epsilon == evolved.privacy.epsilon
