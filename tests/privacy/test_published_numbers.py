"""Every published number's guarantee is computed where the number is made (a
selection, a merged row, the similarity table, whatever the order of the evals) and tables show
the model's ε beside the scores' ε.

Each test runs the stages the way a user does (``synthq eval`` / ``synthq report`` through the CLI)
on tiny models, and checks the printed ε against an independent per-unit composition of the
releases behind the number (:func:`synthq.privacy.guarantee.compose_releases`)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from synthq.artifacts.manifest import open_artifact
from synthq.cli.app import app
from synthq.config.evaluation import EvalConfig
from synthq.privacy.guarantee import compose_releases, format_epsilon
from synthq.privacy.unit_sets import sharing_groups
from synthq.reporting.systems import systems
from synthq.stages import evaluate, train_retriever
from tests.helpers import private_copy, retriever_config


def _cli(*argv: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def _reference(releases: list[dict]) -> float:
    """The independent per-unit composition of a set of release records (each once)."""
    unique = list({r["id"]: r for r in releases}.values())
    return compose_releases(unique, sharing_groups(unique), []).epsilon


def _table_lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"| {name} |")]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, tiny_beir, tiny_encoder_dir):
    """A dataset with private train and dev splits (test public), three ε ≈ 2 DP retrievers trained
    on the same training queries (one configuration with two seeds, another with one) and their
    evaluation on the private dev split."""
    root = tmp_path_factory.mktemp("published")
    data = private_copy(root, tiny_beir)
    retrievers = {
        name: train_retriever.run(
            retriever_config(root / name, data, tiny_encoder_dir, dp="batch", epsilon=2, lr=lr, seed=seed)
        )
        for name, lr, seed in (("ret-a-seed0", 1e-5, 0), ("ret-a-seed1", 1e-5, 1), ("ret-b-seed0", 1e-2, 0))
    }
    paths = [str(r.path) for r in retrievers.values()]
    dev = evaluate.run(
        EvalConfig(out=root / "dev", retrievers=paths, datasets=[str(data)], split="dev", bm25=False)
    )
    assert math.isinf(dev.privacy.epsilon)  # un-noised scores of private dev queries
    return SimpleNamespace(root=root, data=data, retrievers=retrievers, paths=paths, dev=dev)


def test_a_noisy_selection_carries_every_candidates_releases(tmp_path, tuned):
    """Flow 1: ``eval --select-on DEV --select-epsilon 1`` on a private dev split. The released
    choice is a function of all three candidates, so every kept row carries all three releases
    (≈ 3 × 2 per training query) plus report-noisy-max's (on the dev queries: other units)."""
    argv = ["eval", *(a for p in tuned.paths for a in ("--retriever", p)), "--datasets", tuned.data]
    _cli(*argv, "--no-bm25", "--select-on", tuned.dev.path, "--select-epsilon", "1", "--out", tmp_path / "e")
    artifact = open_artifact(tmp_path / "e", stage="eval")
    rows = json.loads((artifact.path / "results.json").read_text())
    candidates = [r for a in tuned.retrievers.values() for r in a.releases]
    noisy = [r for r in artifact.releases if r["guarantee"]["mechanism"] == "report-noisy-max"]
    assert len(noisy) == 1 and noisy[0]["guarantee"]["epsilon"] == pytest.approx(1.0)
    assert {r["id"] for r in candidates} <= {r["id"] for r in artifact.releases}
    expected = _reference([*candidates, *noisy])
    each = [a.privacy.epsilon for a in tuned.retrievers.values()]
    assert expected == pytest.approx(sum(each), rel=1e-6)  # the same training queries: they add
    assert rows and all(float(r["epsilon"]) == pytest.approx(expected, rel=1e-6) for r in rows)
    assert artifact.privacy.epsilon == pytest.approx(expected, rel=1e-6)
    # the table prints the composition, not the chosen retriever's own ε
    table = (artifact.path / "results.md").read_text()
    assert all(format_epsilon(expected) in line for r in rows for line in _table_lines(table, r["retriever"]))
    assert not any(f"| {format_epsilon(max(each))} |" in line for line in table.splitlines())


def test_report_recomputes_seeds_from_different_evals(tmp_path, tuned):
    """Flow 2: two seeds of one DP configuration, each evaluated in its own ``eval`` and merged by
    ``report``: the merged row rests on both releases (same training queries: ε adds), in the table,
    the plot's positions and the headline alike."""
    seed0, seed1 = tuned.retrievers["ret-a-seed0"], tuned.retrievers["ret-a-seed1"]
    for name, retriever in (("e0", seed0), ("e1", seed1)):
        _cli(
            "eval",
            "--retriever",
            retriever.path,
            "--datasets",
            tuned.data,
            "--no-bm25",
            "--out",
            tmp_path / name,
        )
    _cli("report", tmp_path / "e0", tmp_path / "e1", "--out", tmp_path / "r")
    report = open_artifact(tmp_path / "r", stage="report")
    expected = _reference([*seed0.releases, *seed1.releases])
    assert expected == pytest.approx(seed0.privacy.epsilon + seed1.privacy.epsilon, rel=1e-6)
    rows = json.loads((report.path / "results.json").read_text())
    (system,) = systems(rows)
    assert system["retriever"] == "ret-a (2 seeds)"
    assert float(system["epsilon"]) == pytest.approx(expected, rel=1e-6)
    from synthq.reporting.epsilon import shown_epsilon  # what the plot places the point at

    assert shown_epsilon(system)[0] == pytest.approx(expected, rel=1e-6)
    lines = _table_lines((report.path / "README.md").read_text(), "ret-a (2 seeds)")
    assert lines and all(f"| {format_epsilon(expected)} |" in line for line in lines)
    assert report.privacy.epsilon == pytest.approx(expected, rel=1e-6)


def test_report_shows_a_retriever_the_same_whatever_the_order_of_its_evals(tmp_path, tuned):
    """The report-order note: one eval chose the retrievers on private dev queries without noise,
    another evaluated the same retrievers plainly. Published together, the choice stays with them
    ("+ selection ∞") whichever eval is given first."""
    argv = ["eval", *(a for p in tuned.paths for a in ("--retriever", p)), "--datasets", tuned.data]
    _cli(*argv, "--no-bm25", "--select-on", tuned.dev.path, "--out", tmp_path / "chosen")
    kept = [r["retriever"] for r in json.loads((tmp_path / "chosen" / "results.json").read_text())]
    plain = [a for name in kept for a in ("--retriever", tuned.retrievers[name].path)]
    _cli("eval", *plain, "--datasets", tuned.data, "--no-bm25", "--out", tmp_path / "plain")
    tables = []
    for order, evals in (("ab", ("chosen", "plain")), ("ba", ("plain", "chosen"))):
        _cli("report", *(tmp_path / e for e in evals), "--out", tmp_path / order)
        text = (tmp_path / order / "README.md").read_text()
        tables.append(
            [line for line in text.split("![privacy-utility]")[0].splitlines() if line.startswith("| ")]
        )
    assert tables[0] == tables[1]
    assert any("+ selection ∞" in line for line in tables[0])


@pytest.fixture(scope="module")
def private_test(tmp_path_factory, tiny_beir, tiny_encoder_dir):
    """A dataset with no split declared public (the first-hour guide's case), a DP retriever
    (ε = 8) and a non-private one trained on it."""
    root = tmp_path_factory.mktemp("private-test")
    data = private_copy(root, tiny_beir, name="all-private", public=())
    dp = train_retriever.run(retriever_config(root / "ret-dp", data, tiny_encoder_dir, dp="batch", epsilon=8))
    plain = train_retriever.run(retriever_config(root / "ret-plain", data, tiny_encoder_dir))
    assert math.isinf(plain.privacy.epsilon)
    return SimpleNamespace(root=root, data=data, dp=dp, plain=plain)


def _assert_two_columns(text: str, dp_epsilon: float) -> None:
    assert text.count("The scores themselves are ε = ∞") == 1  # said once, plainly, before the tables
    assert "keep them inside" in text
    text = text.split("## NDCG@10 and Recall@10")[1].split("\n## ")[0]  # the headline table
    header = next(line for line in text.splitlines() if line.startswith("| retriever | method |"))
    assert header.startswith("| retriever | method | model ε | scores ε |")
    assert _table_lines(text, "BM25")[0].startswith("| BM25 | bm25 | 0 (public) | ∞ |")
    (dp_line,) = _table_lines(text, "ret-dp")
    assert dp_line.split(" | ")[2:4] == [format_epsilon(dp_epsilon), "∞"]
    (plain_line,) = _table_lines(text, "ret-plain")
    assert plain_line.split(" | ")[2:4] == ["∞", "∞"]


def test_private_test_split_shows_the_models_epsilon_beside_the_scores(tmp_path, private_test):
    """On a dataset whose test split is private, eval and report show 0 / 8.00 / ∞ for
    BM25 / the DP model / the non-private model, and say once that the scores are ε = ∞; the
    artifact's own guarantee stays the scores' (∞)."""
    dp, plain = private_test.dp, private_test.plain
    output = _cli(
        "eval", "--retriever", dp.path, "--retriever", plain.path, "--datasets", private_test.data,
        "--out", tmp_path / "e",
    )  # fmt: skip
    artifact = open_artifact(tmp_path / "e", stage="eval")
    assert math.isinf(artifact.privacy.epsilon)  # the numbers' guarantee: not releasable
    assert 7.5 < dp.privacy.epsilon <= 8.0
    _assert_two_columns((artifact.path / "results.md").read_text(), dp.privacy.epsilon)
    assert "| model ε | scores ε |" in output
    _cli("report", tmp_path / "e", "--out", tmp_path / "r")
    report = open_artifact(tmp_path / "r", stage="report")
    assert math.isinf(report.privacy.epsilon)
    _assert_two_columns((report.path / "README.md").read_text(), dp.privacy.epsilon)
    from synthq.reporting.epsilon import shown_epsilon  # the plot places each model at its own ε

    by_name = {s["retriever"]: s for s in systems(json.loads((report.path / "results.json").read_text()))}
    assert shown_epsilon(by_name["ret-dp"])[0] == pytest.approx(dp.privacy.epsilon)
    assert shown_epsilon(by_name["BM25"])[0] == 0 and math.isinf(shown_epsilon(by_name["ret-plain"])[0])


def test_report_labels_the_similarity_scores_as_infinite(tmp_path, tuned):
    """Flow 7: report's similarity table puts the synthetic set's ε under its own name and the
    scores' ε (computed on the private queries: ∞) beside them, as the similarity stage does."""
    from synthq.artifacts.create import create_artifact
    from synthq.privacy.guarantee import Guarantee

    with create_artifact(tmp_path / "sim", "similarity", {"synthetic": str(tmp_path / "syn")}) as writer:
        writer.metrics.update(
            {"bleu": 12.5, "mauve_mean": 0.5, "mauve_std": 0.1, "distinct_2": 0.7,
             "verbatim_copy_rate": 0.25, "synthetic_epsilon": 8.0}
        )  # fmt: skip
        writer.privacy = Guarantee.non_private("similarity scores read the private queries", unit="query")
    _cli(
        "eval", "--retriever", tuned.paths[0], "--datasets", tuned.data, "--no-bm25", "--out", tmp_path / "e"
    )
    _cli("report", tmp_path / "e", "--similarity", tmp_path / "sim", "--out", tmp_path / "r")
    text = (tmp_path / "r" / "README.md").read_text()
    assert "| synthetic set | synthetic set's ε | scores ε | BLEU |" in text
    assert "| syn | 8.00 | ∞ | 12.50 |" in text
    assert "| synthetic set | ε |" not in text
