"""synthq canary-audit on tiny models: canary construction and storage (no private text), one
insertion per included canary, the one-run audit detecting memorisation without DP and not with
heavy noise, the retriever audit, and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from synthq.audit.canaries import SHAPES, make_canaries, make_one_run_canaries
from synthq.audit.retriever import retriever_scores
from synthq.audit.scoring import secret_scores
from synthq.audit.training_set import audit_delta, augmented_dataset, private_pairs
from synthq.config.audit import CanaryAuditConfig
from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.runtime.errors import SynthqError
from synthq.stages import canary_audit
from tests import helpers


def test_canaries_have_secret_on_the_query_side(tiny_beir):
    dataset = load_beir_dir(tiny_beir)
    canaries = make_canaries(dataset, "train", list(SHAPES), 2, [3], references=15, seed=0)
    assert len(canaries) == 3 * 2 * 2  # shapes × per_shape × (one repetition count + held out)
    for canary in canaries:
        assert canary.query.endswith(canary.secret) and canary.secret not in canary.document
        assert len(canary.secret) == 10 and canary.secret.isdigit()
        assert len(set(canary.reference_secrets)) == 15 and canary.secret not in canary.reference_secrets
    real = [c for c in canaries if c.shape == "real-document"]
    assert all(c.query_prefix in dataset.queries.values() for c in real)
    assert make_canaries(dataset, "train", list(SHAPES), 2, [3], 15, seed=0)[0].secret == canaries[0].secret
    with pytest.raises(SynthqError, match="unknown canary shape"):
        make_canaries(dataset, "train", ["shouting"], 1, [1], 15, 0)


def test_stored_canary_records_hold_ids_not_private_queries(tiny_beir):
    dataset = load_beir_dir(tiny_beir)
    canaries = make_canaries(dataset, "train", ["real-document"], 3, [2], references=10, seed=0)
    for canary in canaries:
        record = json.dumps(canary.record())
        assert canary.query_prefix not in record and canary.query_prefix_id in dataset.queries
        assert dataset.queries[canary.query_prefix_id] == canary.query_prefix
        assert canary.secret in record


def test_one_run_canaries_coins_and_randomness(tiny_beir):
    dataset = load_beir_dir(tiny_beir)
    canaries = make_one_run_canaries(dataset, 400, seed=3)
    assert len({c.secret for c in canaries}) == 400
    assert all(c.query == c.secret and c.secret not in c.document for c in canaries)
    included = sum(c.included for c in canaries)
    assert 150 < included < 250  # Binomial(400, 1/2): ±5 standard deviations
    again = make_one_run_canaries(dataset, 400, seed=3)
    assert [c.record() for c in again] == [c.record() for c in canaries]
    secret_a = [c.secret for c in make_one_run_canaries(dataset, 20, seed=None)]
    secret_b = [c.secret for c in make_one_run_canaries(dataset, 20, seed=None)]
    assert secret_a != secret_b  # OS randomness


def test_one_run_score_takes_out_what_every_secret_gains(tiny_beir):
    """The score compares a secret with random secrets of the same form under the same model: a
    gain shared by every ten-digit string (the format) cancels, a gain of the secret alone stays."""
    canaries = make_one_run_canaries(load_beir_dir(tiny_beir), 6, seed=1)
    references = canaries[0].reference_secrets(7)
    assert references == canaries[0].reference_secrets(7) and len(set(references)) == 7
    assert canaries[0].secret not in references and references != canaries[1].reference_secrets(7)

    class Generator:  # log-likelihood: an easiness per string, plus what fine-tuning added
        def __init__(self, format_gain, memorised):
            self.format_gain, self.memorised = format_gain, memorised

        def candidate_log_likelihoods(self, document, candidates, batch_size):
            import torch

            own = [-23.0 + (5.0 if c in self.memorised else 0.0) + int(c[0]) / 10 for c in candidates]
            return torch.tensor(own) + self.format_gain

    plain = secret_scores(Generator(0.0, set()), canaries, 7, 4, "base")
    tuned = secret_scores(Generator(12.0, {canaries[2].secret}), canaries, 7, 4, "ft")
    difference = tuned - plain
    assert difference[2] == pytest.approx(5.0, abs=1e-4)
    assert np.delete(difference, 2) == pytest.approx(0.0, abs=1e-4)


def test_each_included_canary_is_inserted_once(tmp_path, tiny_beir):
    dataset = load_beir_dir(tiny_beir)
    config = CanaryAuditConfig(data=str(tiny_beir), model="unused", out=tmp_path / "a", canaries=20)
    canaries = make_one_run_canaries(dataset, 20, seed=0)
    private = private_pairs(dataset, config)
    root = augmented_dataset(dataset, config, private, canaries, [], tmp_path / "data")
    augmented = load_beir_dir(root)
    train = augmented.require_split("train")
    for canary in canaries:
        copies = [q for q, docs in train.items() if canary.canary_id in docs]
        assert len(copies) == (1 if canary.included else 0)
        if canary.included:
            assert augmented.queries[copies[0]] == canary.secret
    assert sum(len(d) for d in train.values()) == len(private) + sum(c.included for c in canaries)
    subset = private_pairs(dataset, config.model_copy(update={"private_pairs": 5}))
    assert len(subset) == 5 and set(subset) <= set(private)
    assert subset == private_pairs(dataset, config.model_copy(update={"private_pairs": 5}))


def test_too_many_canaries_are_refused(tmp_path, tiny_beir, tiny_causal_dir):
    exposure = CanaryAuditConfig(
        data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "a", method="exposure",
        repetitions=[100], epsilons=[math.inf],
    )  # fmt: skip
    with pytest.raises(SynthqError, match="canaries must not outnumber the data"):
        canary_audit.run(exposure)
    one_run = exposure.model_copy(update={"method": "one-run", "canaries": 500})
    with pytest.raises(SynthqError, match="canaries must not outnumber the data"):
        canary_audit.run(one_run)


def test_a_retriever_batch_larger_than_its_pairs_is_refused_before_any_training(
    tmp_path, tiny_beir, tiny_causal_dir
):
    """Fault pass round 4: the retriever audit's internal batch of 32 failed train-retriever only
    after the generators were fine-tuned; now refused before anything is trained or written."""
    config = CanaryAuditConfig(
        data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "a", method="one-run",
        canaries=4, epsilons=[math.inf], retriever_documents=4,
    )  # fmt: skip
    with pytest.raises(SynthqError, match=r"retriever audit trains with batch 32 on as few as \d+ pairs"):
        canary_audit.run(config)
    assert not (tmp_path / "a").exists()


def test_audit_delta_reads_command_line_text(tmp_path):
    config = CanaryAuditConfig(data="embedded", model="m", out=tmp_path, finetune={"delta": "1e-5"})
    assert audit_delta(config, 100) == 1e-5
    assert audit_delta(config.model_copy(update={"finetune": {}}), 100) == 1 / 200


def test_batch_size_is_an_alias_of_scoring_batch_size(tmp_path):
    config = CanaryAuditConfig(data="embedded", model="m", out=tmp_path, batch_size=7)
    assert config.scoring_batch_size == 7


def test_retriever_ranks_a_memorised_canary_above_controls(tmp_path, tiny_encoder_dir):
    from synthq.config.registry import stage_entry
    from synthq.models.encoder import load_encoder

    dataset = load_beir_dir(helpers.write_tiny_beir(tmp_path / "beir"))
    canaries = make_one_run_canaries(dataset, 12, seed=0)
    member = canaries[0]
    corpus = {c.canary_id: {"title": "", "text": c.document} for c in canaries}
    queries = {f"copy-{k}": member.secret for k in range(16)}
    queries |= {f"other-{c.canary_id}": c.document.split()[0] for c in canaries[1:]}
    qrels = {f"copy-{k}": {member.canary_id: 1} for k in range(16)}
    qrels |= {f"other-{c.canary_id}": {c.canary_id: 1} for c in canaries[1:]}
    root = write_beir_dir(tmp_path / "train", corpus, queries, {"train": qrels})
    entry = stage_entry("train-retriever")
    options = dict(
        data=str(root), encoder=str(tiny_encoder_dir), out=tmp_path / "ret", epochs=4, batch_size=8, lr=1e-3
    )
    artifact = entry.run_function()(entry.config_type()(**options))
    encoder = load_encoder(artifact.path)
    secrets, documents = [c.secret for c in canaries], [c.document for c in canaries]
    trained = retriever_scores(encoder, secrets, documents)
    untrained = retriever_scores(load_encoder(tiny_encoder_dir), secrets, documents)
    assert trained[0] > trained[1:].max()  # the memorised canary outranks every control
    assert trained[0] - np.median(trained[1:]) > untrained[0] - np.median(untrained[1:])


def _private_texts(tiny_beir) -> list[str]:
    dataset = load_beir_dir(tiny_beir)
    return [dataset.queries[q] for q in dataset.require_split("train")]


@pytest.mark.slow
def test_one_run_audit_detects_memorisation_without_dp_and_not_with_heavy_noise(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    config = CanaryAuditConfig(
        data=str(tiny_beir),
        model=str(tiny_causal_dir),
        out=tmp_path / "audit",
        method="both",
        canaries=26,  # 13 expected included + 4 exposure pairs ≤ the 17 private pairs
        canary_seed=0,
        epsilons=[math.inf, 0.5],
        repetitions=[2],
        shapes=["real-document", "random-query"],
        canaries_per_shape=1,
        references=12,
        leak_samples=2,
        max_new_tokens=12,
        retriever_documents=4,
        finetune={
            "batch_size": 8,
            "epochs": 30,
            "lr": 0.02,
            "physical_batch_size": 8,
            "clip_norm": 0.05,
            "delta": 1e-5,  # the one-run bound pays 2mδ: 1/(2n) of 30 pairs would swamp it
        },
        retriever={"encoder": str(tiny_encoder_dir), "batch_size": 8, "epochs": 2, "lr": 1e-3},
    )
    artifact = canary_audit.run(config)
    report = json.loads((artifact.path / "audit.json").read_text())
    rows = {(r["audited"], r["proven_epsilon"]): r for r in report["one_run"]}
    non_private = rows[("generator", math.inf)]
    noisy = next(r for (audited, eps), r in rows.items() if audited == "generator" and eps != math.inf)
    # 26 canaries cap the bound near 0.94 (all 14 guesses right); 0.45 was measured
    assert non_private["epsilon_lower_bound"] > 0.3 and non_private["auroc"] > 0.5
    assert noisy["epsilon_lower_bound"] == 0.0 and noisy["epsilon_lower_bound"] <= noisy["proven_epsilon"]
    assert {"retriever (synthetic)", "retriever (private pairs)"} <= {audited for audited, _ in rows}
    assert len(report["one_run_scores"]["generator[eps=∞]"]) == 26
    assert report["exposure"]["summary"] and (artifact.path / "exposure.png").stat().st_size > 1000
    assert (artifact.path / "scores.png").stat().st_size > 1000
    # the audit artifact reads private data: ε = ∞, and no private query text in any file
    assert math.isinf(artifact.privacy.epsilon)
    for path in artifact.path.rglob("*"):
        if path.is_file() and path.suffix not in (".png", ".bin"):  # .bin: keyed unit digests
            text = path.read_text(encoding="utf-8")
            leaked = [q for q in _private_texts(tiny_beir) if q in text]
            assert not leaked, f"{path.name} contains private queries {leaked[:2]}"
    phases = artifact.timings
    assert {"train_seconds[eps=∞]", "one_run_score_seconds[eps=∞]", "retriever_seconds[original]"} <= set(
        phases
    )


def test_an_interrupted_audit_resumes_on_the_same_canaries_without_a_canary_seed(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch
):
    """Without --canary-seed the canaries come from the OS: the drawn seed is kept in the private
    checkpoint, so --resume audits the canaries the interrupted run trained on (it redrew them,
    and suggested --force)."""
    config = CanaryAuditConfig(
        data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "audit", method="one-run",
        canaries=8, epsilons=[math.inf], leak_samples=1, max_new_tokens=4, retriever_audit=False,
        secret_references=2, finetune={"batch_size": 4, "max_steps": 1, "physical_batch_size": 8},
    )  # fmt: skip
    drawn = []
    choose = canary_audit.choose_canaries
    monkeypatch.setattr(canary_audit, "choose_canaries", lambda *a: drawn.append(choose(*a)) or drawn[-1])
    real_audit = canary_audit._audit_at

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(canary_audit, "_audit_at", interrupted)
    with pytest.raises(KeyboardInterrupt):
        canary_audit.run(config)
    monkeypatch.setattr(canary_audit, "_audit_at", real_audit)
    artifact = canary_audit.run(config.model_copy(update={"resume": True}))
    first, second = ([c.record() for c in one_run] for one_run, _ in drawn)
    assert first == second
    stored = [json.loads(line) for line in (artifact.path / "canaries.jsonl").read_text().splitlines()]
    assert stored == second
    assert artifact.manifest["config"].get("canary_seed") is None  # the drawn seed is never released
