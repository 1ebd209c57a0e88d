"""Privacy integrity, round 2: the nine flows in which a printed ε was not true, each through the
stages on tiny models and data, plus the rule behind them — a guarantee is recomputed from the
sealed record of its releases, private data is identified by a keyed digest, and every read of a
private split is accounted."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from synthq.artifacts import open_artifact, partial_dir, sha256_tree
from synthq.cli import app
from synthq.config import EvalConfig, FinetuneConfig, GenerateConfig, TrainRetrieverConfig
from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.privacy import keys
from synthq.privacy.ledger import ledger, ledger_lines
from synthq.privacy.units import sharing_groups, store_unit_set
from synthq.retrieval.selection import Candidate, selection_utility
from synthq.runtime.errors import ArtifactError
from synthq.stages import evaluate, finetune_lm, generate, train_retriever
from tests.test_privacy_integrity import finetune, released_text, retriever_config


def private_copy(tmp_path, tiny_beir, name="private", public=("test",)):
    """tiny_beir with a split declaration: train and dev private, ``public`` splits public."""
    root = tmp_path / name
    shutil.copytree(tiny_beir, root)
    private = [s for s in ("train", "dev", "test") if s not in public]
    (root / "privacy.json").write_text(json.dumps({"private_splits": private, "public_splits": list(public)}))
    return root


# 1. resume with edited data ------------------------------------------------------------------


def test_resume_on_edited_data_is_refused(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    data = private_copy(tmp_path, tiny_beir)
    original = finetune_lm.GeneratorTraining.step
    calls = {"n": 0}

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", interrupted)
    options = dict(epsilon=8.0, max_steps=4, checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        finetune(tmp_path, data, tiny_causal_dir, "gen", **options)
    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", original)
    assert (partial_dir(tmp_path / "gen") / "checkpoints" / "state.pt").is_file()
    dataset = load_beir_dir(data)
    queries = {**dataset.queries, "tr-egg-0-0": "an edited private query"}
    write_beir_dir(data, dataset.corpus, queries, dataset.qrels)
    with pytest.raises(ArtifactError, match="changed since the interrupted run"):
        finetune(tmp_path, data, tiny_causal_dir, "gen", **options, resume=True)
    assert not (tmp_path / "gen").exists()


# 2 and 3. private splits: evaluation and selection --------------------------------------------


def test_eval_on_a_private_split_is_infinite_even_for_a_public_encoder(tmp_path, tiny_beir, tiny_encoder_dir):
    data = private_copy(tmp_path, tiny_beir)
    result = evaluate.run(
        EvalConfig(
            out=tmp_path / "ev", datasets=[str(data)], split="train", untrained=[str(tiny_encoder_dir)]
        )
    )
    rows = json.loads((result.path / "results.json").read_text())
    assert math.isinf(result.privacy.epsilon) and all(math.isinf(float(r["epsilon"])) for r in rows)
    assert result.manifest["own_privacy"]["mechanism"] == "none"
    public = evaluate.run(
        EvalConfig(out=tmp_path / "ev-test", datasets=[str(data)], untrained=[str(tiny_encoder_dir)])
    )
    assert public.privacy.epsilon == 0


def test_selection_on_a_private_dev_split_is_accounted(tmp_path, tiny_beir, tiny_encoder_dir):
    data = private_copy(tmp_path, tiny_beir)
    retrievers = [
        train_retriever.run(
            retriever_config(tmp_path / f"dp-{lr}", data, tiny_encoder_dir, dp="batch", epsilon=4, lr=lr)
        )
        for lr in (1e-5, 1e-3)
    ]
    paths = [str(r.path) for r in retrievers]
    dev = evaluate.run(EvalConfig(out=tmp_path / "dev", retrievers=paths, datasets=[str(data)], split="dev"))
    assert math.isinf(dev.privacy.epsilon)  # scores of private dev queries
    unaccounted = evaluate.run(
        EvalConfig(out=tmp_path / "test", retrievers=paths, datasets=[str(data)], select_on=str(dev.path))
    )
    rows = [
        r for r in json.loads((unaccounted.path / "results.json").read_text()) if r["kind"] == "retriever"
    ]
    assert math.isinf(unaccounted.privacy.epsilon)
    assert rows and all(r["selection"]["how"] == "on private dev, unaccounted" for r in rows)
    assert "dev ndcg@10" not in (unaccounted.path / "selection.md").read_text()  # private scores stay out
    noisy = evaluate.run(
        EvalConfig(
            out=tmp_path / "test-noisy",
            retrievers=paths,
            datasets=[str(data)],
            select_on=str(dev.path),
            select_epsilon=1.0,
        )  # fmt: skip
    )
    (kept,) = [r for r in json.loads((noisy.path / "results.json").read_text()) if r["kind"] == "retriever"]
    selection = [r for r in noisy.releases if r["guarantee"]["mechanism"] == "report-noisy-max"]
    assert len(selection) == 1 and selection[0]["guarantee"]["epsilon"] == pytest.approx(1.0)
    # dev queries are other units than the training queries: per unit, ε = max(4, 1), not 4 + 1
    assert float(kept["epsilon"]) == pytest.approx(kept["model_epsilon"]) == pytest.approx(4.0, abs=0.05)
    assert noisy.privacy.epsilon == pytest.approx(kept["model_epsilon"])


def test_report_noisy_max_utility_has_sensitivity_one_and_is_monotone():
    per_query = {"a": [0.2, 1.0, 0.0, 0.7], "b": [0.9, 0.1, 0.5, 0.5], "c": [1.0, 1.0, 1.0, 0.0]}

    def utilities(drop: int | None) -> dict[str, float]:
        out = {}
        for name, scores in per_query.items():
            kept = [s for i, s in enumerate(scores) if i != drop]
            row = {"queries": len(kept), "metrics": {"ndcg@10": sum(kept) / len(kept)}}
            out[name] = selection_utility(Candidate(name, [row], row["metrics"]["ndcg@10"]))
        return out

    full = utilities(None)
    for drop in range(4):  # brute force over neighbouring dev sets
        changes = [full[k] - v for k, v in utilities(drop).items()]
        assert all(-1e-9 <= c <= 1 + 1e-9 for c in changes)


# 4. an artifact used as data keeps its guarantee --------------------------------------------


def test_a_synthetic_set_used_as_data_inherits(tmp_path, tiny_beir, tiny_causal_dir):
    data = private_copy(tmp_path, tiny_beir)
    generator = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    synthetic = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(data), out=tmp_path / "syn", max_new_tokens=4, seed=0
        )
    )
    queries = synthetic.metrics["documents"]
    again = finetune(
        tmp_path, synthetic.path, tiny_causal_dir, "gen-on-syn", epsilon=1.0, max_steps=2,
        batch_size=min(4, queries),
    )  # fmt: skip
    assert again.manifest["own_privacy"]["epsilon"] <= 1.0
    # towards the private data: the generator's 8 (its units are not the synthetic queries)
    assert again.privacy.epsilon == pytest.approx(generator.privacy.epsilon)
    bm25 = evaluate.run(EvalConfig(out=tmp_path / "bm25", datasets=[str(synthetic.path)], split="train"))
    assert bm25.privacy.epsilon == pytest.approx(generator.privacy.epsilon)


# 5. the ledger follows records, not paths -----------------------------------------------------


def test_the_ledger_keeps_the_record_when_a_path_is_rewritten(tmp_path, tiny_beir, tiny_causal_dir):
    data = private_copy(tmp_path, tiny_beir)
    generator = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    synthetic = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(data), out=tmp_path / "syn", max_new_tokens=4, seed=0
        )
    )
    finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=1.0, max_steps=2, force=True)
    book = ledger([synthetic.path])
    assert book.total.epsilon == pytest.approx(generator.privacy.epsilon)
    text = "\n".join(ledger_lines([synthetic.path]))
    assert "changed since" in text and str(tmp_path / "gen") in text


# 6. no public fingerprint of the private data -------------------------------------------------


def test_private_data_is_identified_by_a_keyed_digest(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    data = private_copy(tmp_path, tiny_beir)
    artifact = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    plain = sha256_tree(data)
    recorded = artifact.inputs[0]["sha256"]
    assert recorded.startswith("hmac:") and plain not in released_text(artifact)
    assert keys.private_data_digest(plain) == recorded  # stable under the same key
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "another-installation"))
    assert keys.private_data_digest(plain) != recorded  # meaningless under another
    foreign = open_artifact(artifact.path)  # readable, but not verifiable here
    assert not foreign.verified and any("sealed under another key" in a for a in foreign.privacy.assumptions)


# 7. --limit with DP ----------------------------------------------------------------------------


def test_limit_is_refused_with_dp(tiny_beir):
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        FinetuneConfig(data=str(tiny_beir), model="x", out="o", limit=5, epsilon=8)
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        TrainRetrieverConfig(data=str(tiny_beir), out="o", limit=5, dp="group")
    assert FinetuneConfig(data=str(tiny_beir), model="x", out="o", limit=5, epsilon="inf").limit == 5
    result = CliRunner().invoke(app, ["finetune-lm", "--data", str(tiny_beir), "--model", "x", "--out",
                                      "o", "--limit", "5"])  # fmt: skip
    assert result.exit_code != 0 and "--limit cannot be used with DP" in result.output + str(result.exception)


# 8. an edited guarantee ------------------------------------------------------------------------


EDITS = {
    "epsilon": lambda m: m["privacy"].update(epsilon=0.5),
    "delta": lambda m: m["privacy"].update(delta=1e-9),
    "mechanism": lambda m: m["privacy"].update(mechanism="public", epsilon=0.0),
    "details": lambda m: m["releases"][0]["guarantee"]["details"].update(noise_multiplier=50.0),
    "unit count": lambda m: m["releases"][0]["units"].update(count=1_000_000),
    "private flag": lambda m: m["inputs"][0].pop("private"),
    "own_privacy": lambda m: m["own_privacy"].update(epsilon=0.1),
    "releases": lambda m: m.update(releases=[]),
}


@pytest.mark.parametrize("field", list(EDITS))
def test_every_edit_of_the_guarantee_is_refused(tmp_path, tiny_beir, tiny_causal_dir, field):
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1)
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    EDITS[field](manifest)
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="edited"):
        open_artifact(artifact.path)
    assert CliRunner().invoke(app, ["info", str(artifact.path)]).exit_code != 0
    assert CliRunner().invoke(app, ["ledger", str(artifact.path)]).exit_code != 0


def test_a_consistent_edit_without_the_key_is_still_refused(tmp_path, tiny_beir, tiny_causal_dir):
    """Re-sealing needs the key; recomputation catches an ε that its releases do not give even
    when the seal is dropped in favour of a forged foreign one."""
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1)
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    manifest["privacy"]["epsilon"] = 0.5
    manifest["seal"]["key_id"] = "0" * 16  # pretend another installation wrote it
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not what its releases give"):
        open_artifact(artifact.path)


# 9. overlapping datasets compose over the units they share -------------------------------------


def test_d_and_d_minus_one_query_compose_on_the_shared_units(tmp_path, tiny_beir, tiny_causal_dir):
    whole = private_copy(tmp_path, tiny_beir, "whole")
    smaller = private_copy(tmp_path, tiny_beir, "smaller")
    dataset = load_beir_dir(smaller)
    train = {q: d for q, d in dataset.qrels["train"].items() if q != "tr-egg-0-0"}
    write_beir_dir(smaller, dataset.corpus, dataset.queries, {**dataset.qrels, "train": train})
    first = finetune(tmp_path, whole, tiny_causal_dir, "gen-d", epsilon=4.0, max_steps=2)
    second = finetune(tmp_path, smaller, tiny_causal_dir, "gen-d-minus-q", epsilon=4.0, max_steps=2)
    book = ledger([first.path, second.path])
    assert len(book.datasets) == 2  # two keyed dataset identifiers ...
    both = first.privacy.epsilon + second.privacy.epsilon
    assert book.total.epsilon == pytest.approx(both)  # ... but the shared queries are at 2ε


def test_sharing_groups_are_exact_on_disjoint_and_shared_units():
    a = {"id": "a", "units": store_unit_set("query", ["q1", "q2", "q3"])}
    b = {"id": "b", "units": store_unit_set("query", ["q3", "q4"])}
    c = {"id": "c", "units": store_unit_set("query", ["q9"])}
    assert sharing_groups([a, b, c]) == [["a", "b"], ["c"]]
    lost = {"id": "d", "units": {"kind": "query", "count": 2, "sha256": "0" * 64}}
    assert sharing_groups([a, c, lost]) == [["a", "d"], ["c", "d"]]  # unknown set: assumed shared
    user = {"id": "u", "units": store_unit_set("user", ["alice"])}
    assert sharing_groups([a, user]) == [["a", "u"]]  # users hold queries: never assumed apart


def test_a_unit_set_digested_under_another_key_is_assumed_shared(tmp_path, monkeypatch):
    """A colleague's artifact on a shared disk carries its unit set in diagnostics, digested under
    their key: it can never intersect ours, so it must count as unknown (shared), not disjoint."""
    colleague = tmp_path / "colleague-state"
    monkeypatch.setenv("SYNTHQ_STATE", str(colleague))
    theirs = {
        "id": "theirs",
        "units": store_unit_set("query", ["q1", "q2"], also_in=tmp_path / "art" / "diagnostics"),
    }
    theirs["path"] = str(tmp_path / "art")
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "my-state"))
    ours = {"id": "ours", "units": store_unit_set("query", ["q1", "q2"])}
    other = {"id": "other", "units": store_unit_set("query", ["q9"])}
    assert theirs["units"]["key_id"] != ours["units"]["key_id"]
    assert sharing_groups([theirs, ours, other]) == [["other", "theirs"], ["ours", "theirs"]]


def test_the_key_command_shows_exports_and_imports(tmp_path, monkeypatch):
    runner = CliRunner()
    shown = runner.invoke(app, ["key"])
    assert shown.exit_code == 0 and keys.key_id() in shown.output
    exported = runner.invoke(app, ["key", "--export", str(tmp_path / "team.key")])
    assert exported.exit_code == 0 and (tmp_path / "team.key").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "colleague"))
    other = keys.key_id()
    refused = runner.invoke(app, ["key", "--import", str(tmp_path / "team.key")])
    assert refused.exit_code != 0 and keys.key_id() == other
    installed = runner.invoke(app, ["key", "--import", str(tmp_path / "team.key"), "--replace"])
    assert installed.exit_code == 0 and keys.key_id() != other
