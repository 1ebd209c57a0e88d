"""Private splits: scores of a private split are ε = ∞ for any encoder, a selection on a private dev
split is accounted (report-noisy-max has sensitivity one), and --limit is refused with DP."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from synthq.artifacts.export import export_artifact
from synthq.cli.app import app
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import FinetuneConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.data.beir_io import load_beir_dir
from synthq.reporting.epsilon import epsilon_cell
from synthq.reporting.eval_files import read_rows
from synthq.retrieval.selection import Candidate, selection_utility
from synthq.runtime.errors import DataError
from synthq.stages import evaluate, train_retriever
from tests.helpers import private_copy, retriever_config


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


def test_per_query_scores_and_runs_of_a_private_split_stay_private(tmp_path, tiny_beir, tiny_encoder_dir):
    """Per-query scores and TREC runs name private queries one by one: for a private split they
    go to the private diagnostics/, never to a released file (or an export); report still reads
    them where the owner has them."""
    data = private_copy(tmp_path, tiny_beir)
    encoder = [str(tiny_encoder_dir)]
    config = EvalConfig(out=tmp_path / "ev", datasets=[str(data)], split="train", untrained=encoder)
    result = evaluate.run(config)
    private_ids = set(load_beir_dir(data).require_split("train"))
    released = [
        path for path in result.path.rglob("*")
        if path.is_file() and "diagnostics" not in path.relative_to(result.path).parts
    ]  # fmt: skip
    for path in released:
        text = path.read_text(errors="ignore")
        assert not [q for q in private_ids if q in text], f"{path.name} names private queries"
    assert not (result.path / "runs").exists()
    assert list((result.path / "diagnostics" / "runs").rglob("*.trec"))
    kept = json.loads((result.path / "diagnostics" / "per_query.json").read_text())
    assert set(next(iter(next(iter(kept.values())).values()))["ndcg@10"]) == private_ids
    rows = read_rows(result.path)
    assert all(set(row["per_query"]["ndcg@10"]) == private_ids for row in rows)
    exported, _ = export_artifact(result.path, tmp_path / "exported")
    assert not (exported.path / "diagnostics").exists()
    assert not [q for q in private_ids if q in (exported.path / "per_query.json").read_text()]


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
    passed_through = train_retriever.run(  # never scored on dev: the choice does not touch it
        retriever_config(tmp_path / "dp-other", data, tiny_encoder_dir, dp="batch", epsilon=4, lr=1e-4)
    )
    unaccounted = evaluate.run(
        EvalConfig(
            out=tmp_path / "test", retrievers=[*paths, str(passed_through.path)], datasets=[str(data)],
            select_on=str(dev.path),
        )
    )  # fmt: skip
    rows = [
        r for r in json.loads((unaccounted.path / "results.json").read_text()) if r["kind"] == "retriever"
    ]
    other = next(r for r in rows if r["retriever"] == "dp-other")
    rows = [r for r in rows if r is not other]
    assert math.isinf(unaccounted.privacy.epsilon)
    assert rows and all(r["selection"]["how"] == "on private dev, unaccounted" for r in rows)
    assert all("+ selection ∞" in epsilon_cell(r) for r in rows)
    assert "selection" not in other and epsilon_cell(other) == f"{other['model_epsilon']:.2f}"
    assert "dev ndcg@10" not in (unaccounted.path / "selection.md").read_text()  # private scores stay out
    # the private diagnostics' copy keeps the scores and says what they are (never "public")
    private_copy_text = (unaccounted.path / "diagnostics" / "selection.md").read_text()
    assert "dev ndcg@10" in private_copy_text and "ε = ∞" in private_copy_text
    assert "dev queries are public" not in private_copy_text and "costs no ε" not in private_copy_text
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
    # The choice is a function of both candidates (ε = 4 each, on the same training queries), so
    # the kept row carries both: 4 + 4 per training query. The dev queries are other units than the
    # training queries: report-noisy-max's ε = 1 does not add to them (per unit, max(8, 1)).
    # (A selection that forgot its candidates kept only the chosen one's: 4.)
    assert kept["model_epsilon"] == pytest.approx(4.0, abs=0.05)
    assert float(kept["epsilon"]) == pytest.approx(2 * kept["model_epsilon"], rel=1e-6)
    assert noisy.privacy.epsilon == pytest.approx(float(kept["epsilon"]))


def test_a_selection_with_one_candidate_chooses_nothing_and_releases_nothing(
    tmp_path, tiny_beir, tiny_encoder_dir
):
    """With one candidate per method the dev queries decide nothing: eval records no
    report-noisy-max release (one of ε = 0 would be a release that an edited manifest could also
    claim) and takes nothing of the dev evaluation (whose records a foreign manifest could forge:
    review round 5, H1), the row rests on its model's release alone, and a foreign copy of such a
    release is refused."""
    from synthq.privacy.accounting import check_recorded_epsilon
    from synthq.privacy.guarantee import Guarantee
    from synthq.runtime.errors import PrivacyError

    data = private_copy(tmp_path, tiny_beir)
    retriever = train_retriever.run(
        retriever_config(tmp_path / "dp", data, tiny_encoder_dir, dp="batch", epsilon=4, lr=1e-4)
    )
    dev = evaluate.run(
        EvalConfig(out=tmp_path / "dev", retrievers=[str(retriever.path)], datasets=[str(data)], split="dev")
    )
    result = evaluate.run(
        EvalConfig(
            out=tmp_path / "test", retrievers=[str(retriever.path)], datasets=[str(data)],
            select_on=str(dev.path), select_epsilon=1.0,
        )
    )  # fmt: skip
    assert not [r for r in result.releases if r["guarantee"]["mechanism"] == "report-noisy-max"]
    assert {r["id"] for r in result.releases} == {r["id"] for r in retriever.releases}
    assert "nothing was chosen" in (result.path / "selection.md").read_text()
    (row,) = [r for r in json.loads((result.path / "results.json").read_text()) if r["kind"] == "retriever"]
    assert row["selection"]["epsilon"] == 0.0 and "nothing chosen" in row["selection"]["how"]
    assert float(row["epsilon"]) == pytest.approx(retriever.privacy.epsilon, rel=1e-6)
    assert result.privacy.epsilon == pytest.approx(retriever.privacy.epsilon, rel=1e-6)
    spends_nothing = Guarantee(
        epsilon=0.0, delta=0.0, unit="query", mechanism="report-noisy-max", accountant="pure-composition",
        details={"epsilon_per_selection": 1.0, "selections": 0, "sensitivity": 1.0},
    )  # fmt: skip
    with pytest.raises(PrivacyError, match="spends nothing"):
        check_recorded_epsilon(spends_nothing, "foreign", sealed=False)
    check_recorded_epsilon(spends_nothing, "written here", sealed=True)  # what older runs wrote


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


def _sub_dataset_row(scores: dict[str, list[float]]) -> dict:
    """A dev row over sub-datasets as an eval writes it: the mean of the parts' means, and each
    query's score (prefixed by its part) as read_rows attaches them."""
    parts = {part: sum(v) / len(v) for part, v in scores.items() if v}
    per_query = {f"{part}/q{i}": v for part, values in scores.items() for i, v in enumerate(values)}
    return {
        "queries": sum(map(len, scores.values())),
        "metrics": {"ndcg@10": sum(parts.values()) / len(parts)},
        "parts": {part: {"ndcg@10": mean} for part, mean in parts.items()},
        "per_query": {"ndcg@10": per_query},
    }


def test_report_noisy_max_on_sub_datasets_keeps_its_epsilon_by_brute_force():
    """CQADupStack's layout: two sub-datasets of 2 and 24 dev queries, two candidates. With the
    utility the printed score × N, removing one query of the small part moves a utility by far
    more than 1 and the exact privacy loss of the choice (Gumbel-max at scale 1/ε is softmax(ε·u))
    exceeds ε; the pooled per-query sum keeps every neighbour's loss within ε."""
    small_a, small_b = [1.0, 0.0], [0.0, 1.0]
    candidates = {"a": {"s": small_a, "l": [0.30] * 24}, "b": {"s": small_b, "l": [0.35] * 24}}
    epsilon = 1.0

    def probabilities(utility, drop) -> list[float]:
        values = []
        for scores in candidates.values():
            kept = {p: [v for i, v in enumerate(vs) if (p, i) != drop] for p, vs in scores.items()}
            row = _sub_dataset_row(kept)
            values.append(utility(Candidate("c", [row], row["metrics"]["ndcg@10"])))
        top = max(values)
        weights = [math.exp(epsilon * (v - top)) for v in values]
        return [w / sum(weights) for w in weights]

    def worst_loss(utility) -> float:
        full = probabilities(utility, None)
        drops = [(p, i) for p, vs in candidates["a"].items() for i in range(len(vs))]
        neighbours = [probabilities(utility, drop) for drop in drops]
        return max(abs(math.log(f / n)) for other in neighbours for f, n in zip(full, other, strict=True))

    def printed_score_times_queries(candidate):
        return candidate.score * candidate.rows[0]["queries"]

    assert worst_loss(printed_score_times_queries) > 1.05 * epsilon  # the flaw, reproduced
    assert worst_loss(selection_utility) <= epsilon + 1e-12
    without_scores = {k: v for k, v in _sub_dataset_row(candidates["a"]).items() if k != "per_query"}
    with pytest.raises(DataError, match="needs the dev evaluation's per-query scores"):
        selection_utility(Candidate("a", [without_scores], without_scores["metrics"]["ndcg@10"]))


def test_limit_is_refused_with_dp(tiny_beir):
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        FinetuneConfig(data=str(tiny_beir), model="x", out="o", limit=5, epsilon=8)
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        TrainRetrieverConfig(data=str(tiny_beir), out="o", limit=5, dp="group")
    assert FinetuneConfig(data=str(tiny_beir), model="x", out="o", limit=5, epsilon="inf").limit == 5
    result = CliRunner().invoke(app, ["finetune-lm", "--data", str(tiny_beir), "--model", "x", "--out",
                                      "o", "--limit", "5"])  # fmt: skip
    assert result.exit_code != 0 and "--limit cannot be used with DP" in result.output + str(result.exception)
