"""Tables and plots with ε beside every number, the paper's numbers matched to ours, the privacy
of combined results, and `synthq report` merging evaluation artifacts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from synthq.config.evaluation import EvalConfig, ReportConfig
from synthq.privacy.guarantee import Guarantee
from synthq.reporting.merge import combined_guarantee
from synthq.reporting.plot import epsilon_positions, privacy_utility_plot
from synthq.reporting.systems import systems
from synthq.reporting.tables import (
    paper_comparison,
    results_markdown,
    results_table,
    significance_table,
    zero_shot_table,
)
from synthq.retrieval.metrics import METRICS
from synthq.runtime.errors import ArtifactError
from tests.helpers import accounted, tiny_retriever_artifact

SCORES = {**dict.fromkeys(METRICS, 0.1), "ndcg@10": 0.5, "recall@10": 0.7}
PUBLIC = Guarantee.public().model_dump(mode="json")
ROWS = [
    {"dataset": "msmarco", "retriever": "ret-syn", "method": "synthetic", "epsilon": 8.0, "metrics": SCORES},
    {"dataset": "msmarco", "retriever": "ret-orig", "method": "original", "epsilon": math.inf,
     "metrics": SCORES},
    {"dataset": "msmarco", "retriever": "BM25", "method": "bm25", "kind": "bm25", "epsilon": 0.0,
     "privacy": PUBLIC, "metrics": SCORES},
    {"dataset": "fiqa", "retriever": "ret-syn", "method": "synthetic", "epsilon": 8.0,
     "metrics": {**SCORES, "ndcg@10": 0.25}},
]  # fmt: skip


def test_results_table_shows_epsilon_for_every_row():
    table = results_table(ROWS)
    assert "| ret-syn | synthetic | 8.00 | 0.5000 | 0.7000 |" in table
    assert "| ret-orig | original | ∞ |" in table and "| BM25 | bm25 | 0 (public) |" in table
    assert "### fiqa" in table and "| ret-syn | synthetic | 8.00 | 0.2500 | 0.7000 |" in table


def test_zero_shot_layout_and_full_markdown():
    table = zero_shot_table(ROWS, "ndcg@10")
    assert "| retriever | ε | msmarco | fiqa |" in table
    assert "| ret-syn | 8.00 | 0.5000 | 0.2500 |" in table and "| ret-orig | ∞ | 0.5000 | — |" in table
    text = results_markdown(ROWS)
    assert "## Across datasets" in text and "**Recall@10**" in text
    assert "| retriever | method | ε | NDCG@10 | Recall@10 | NDCG@1 |" in text  # all metrics section


def test_paper_rows_are_matched_on_dataset_and_epsilon():
    paper = [
        {"row": "T5-Base", "epsilon": 8, "dataset": "msmarco", "ndcg@10": 0.1912},
        {"row": "Original", "epsilon": "inf", "dataset": "msmarco", "ndcg@10": 0.2525},
        {"row": "T5-Base", "epsilon": 3, "dataset": "msmarco", "ndcg@10": 0.1830},
        {"row": "public?", "epsilon": 0, "dataset": "msmarco", "ndcg@10": 0.1},
    ]
    text = paper_comparison(ROWS, paper)
    assert "| T5-Base | 8.00 | msmarco | ndcg@10 | 0.1912 | 0.5000 (ret-syn) |" in text
    assert "| Original | ∞ | msmarco | ndcg@10 | 0.2525 | 0.5000 (ret-orig) |" in text
    assert "| T5-Base | 3.00 | msmarco | ndcg@10 | 0.1830 | — |" in text
    assert "| public? | 0.00 | msmarco | ndcg@10 | 0.1000 | — |" in text  # BM25 is not a private row


def test_plot_is_written(tmp_path):
    privacy_utility_plot(ROWS, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_combined_guarantee():
    generator = "g" * 64
    syn_a = Guarantee(
        epsilon=8.0, delta=1e-6, mechanism="dp-adam+post-processing", derived_from=[generator, "s"]
    )
    syn_b = syn_a.model_copy(update={"derived_from": [generator, "t"]})
    direct = Guarantee(epsilon=3.0, delta=2e-6, unit="example", mechanism="dp-sample", accountant="rdp")
    query_level = Guarantee(epsilon=1.0, delta=1e-7, unit="query", mechanism="dp-x")
    # One release (two retrievers on synthetic data from one generator): that release's ε.
    one = combined_guarantee([("ra", syn_a), ("rb", syn_b), ("bm25", Guarantee.public())])
    assert (one.epsilon, one.delta) == (8.0, 1e-6)
    assert set(one.derived_from) == {generator, "s", "t", "ra", "rb"}
    # Independent releases compose; the weaker unit wins.
    both = combined_guarantee([("ra", syn_a), ("rd", direct), ("rq", query_level)])
    assert both.epsilon == pytest.approx(12.0) and both.delta == pytest.approx(3.1e-6)
    assert both.unit == "example" and {"ra", "rd", "rq"} <= set(both.derived_from)
    assert [c["epsilon"] for c in both.details["components"]] == [8.0, 3.0, 1.0]
    assert math.isinf(combined_guarantee([("rd", direct), ("ro", Guarantee.non_private("raw"))]).epsilon)
    public = combined_guarantee([("bm25", Guarantee.public())])
    assert public.epsilon == 0 and public.mechanism == "public"


@pytest.fixture(scope="module")
def two_evals(tmp_path_factory, tiny_encoder_dir, tiny_beir):
    from synthq.stages import evaluate

    root = tmp_path_factory.mktemp("report")
    dp = tiny_retriever_artifact(
        root / "ret-dp",
        tiny_encoder_dir,
        accounted(epsilon=2.0, delta=1e-6, mechanism="dp-sample"),
        {"dp": "sample"},
    )
    syn = tiny_retriever_artifact(
        root / "ret-syn",
        tiny_encoder_dir,
        accounted(epsilon=8.0, delta=1e-6, mechanism="dp-adam+post-processing", derived_from=["g" * 64]),
    )
    first = evaluate.run(
        EvalConfig(retrievers=[str(dp.path)], datasets=[str(tiny_beir)], out=root / "eval-1")
    )
    second = evaluate.run(
        EvalConfig(retrievers=[str(syn.path)], datasets=[str(tiny_beir)], out=root / "eval-2")
    )
    return first, second


def test_report_merges_evaluations(tmp_path, two_evals):
    from synthq.stages import report

    first, second = two_evals
    paper = [{"row": "T5-Base", "epsilon": 8, "dataset": "tiny-beir0", "ndcg@10": 0.19}]
    artifact = report.run(
        ReportConfig(
            evals=[str(first.path), str(second.path)], paper=paper, title="merged", out=tmp_path / "r"
        )
    )
    rows = json.loads((artifact.path / "results.json").read_text())
    assert [r["retriever"] for r in rows] == ["BM25", "ret-dp", "ret-syn"]  # BM25 once
    text = (artifact.path / "README.md").read_text()
    assert text.startswith("# merged") and "| BM25 | bm25 | 0 (public) |" in text
    assert (
        "| ret-dp | direct DP (sample), ? | 2.00 |" in text and "| ret-syn |" in text and "| 8.00 |" in text
    )
    assert "| T5-Base | 8.00 | tiny-beir0 | ndcg@10 | 0.1900 |" in text and "(ret-syn)" in text
    assert (artifact.path / "privacy_utility.png").stat().st_size > 1000
    # The two retrievers are independent DP releases: the report's ε composes them.
    assert artifact.privacy.epsilon == pytest.approx(10.0)
    with pytest.raises(ArtifactError, match="expected 'eval'"):
        report.run(ReportConfig(evals=[str(artifact.path)], out=tmp_path / "again"))


def release_record(key: str, epsilon: float, unit: str = "query", units: dict | None = None) -> dict:
    """A release record as manifests hold it (no unit set: shares units with every release)."""
    guarantee = (
        Guarantee.non_private("read without noise", unit=unit)
        if math.isinf(epsilon)
        else Guarantee(epsilon=epsilon, delta=1e-6, unit=unit, mechanism="dp-test", accountant="prv")
    )
    return {"id": key, "stage": "test", "data": {"name": "d", "sha256": "hmac:d", "kind": "data"},
            "unit": unit, "units": units, "guarantee": guarantee.model_dump(mode="json")}  # fmt: skip


def _scored_rows() -> list[dict]:
    """Rows with per-query NDCG@10: a baseline, a system +0.1 better on every query (trained with
    seeds 0 and 1), and one tied with the baseline."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, size=60)
    queries = [f"q{i}" for i in range(60)]

    def row(name, scores, epsilon, seed=None, variant=None, method="m"):
        per_query = {"ndcg@10": dict(zip(queries, scores, strict=True))}
        metrics = {**SCORES, "ndcg@10": float(np.mean(scores))}
        return {"dataset": "d", "split": "test", "retriever": name, "method": method, "epsilon": epsilon,
                "metrics": metrics, "per_query": per_query, "seed": seed, "variant": variant}  # fmt: skip

    # both seeds post-process one generator's release: the system is ε = 8, not 16
    generator = {"model": [release_record("generator", 8.0)], "data": [], "selection": []}
    return [
        row("untrained", base, 0.0, method="untrained") | {"kind": "untrained", "privacy": PUBLIC},
        row("ret-syn-seed0", base + 0.08, 8.0, 0, "v1", "synthetic") | {"releases": generator},
        row("ret-syn-seed1", base + 0.12, 8.0, 1, "v1", "synthetic") | {"releases": generator},
        row("ret-dp", base + rng.normal(0, 0.001, size=60), 7.99, 0, "v2", "direct DP"),
    ]


def test_seeds_merge_and_significance_is_marked():
    rows = _scored_rows()
    merged = systems(rows)
    assert [s["retriever"] for s in merged] == ["untrained", "ret-syn (2 seeds)", "ret-dp"]
    syn = merged[1]
    assert syn["metrics"]["ndcg@10"] == pytest.approx(np.mean([r["metrics"]["ndcg@10"] for r in rows[1:3]]))
    assert syn["metrics_std"]["ndcg@10"] == pytest.approx(np.std([0.08, 0.12], ddof=1), abs=1e-9)
    assert syn["per_query"]["ndcg@10"].shape == (2, 60)
    table = results_table(rows)
    assert f"| ret-syn (2 seeds) | synthetic | 8.00 | {syn['metrics']['ndcg@10']:.4f} ± 0.0283 [" in table
    text = significance_table(rows)
    assert "Holm-Bonferroni correction over all 3 pairs" in text
    assert "| ret-syn (2 seeds) | untrained | +0.1000 |" in text
    lines = {tuple(line.split(" | ")[:2]): line for line in text.splitlines() if line.startswith("| ")}
    assert lines[("| ret-syn (2 seeds)", "untrained")].endswith("| **yes** |")
    tied = lines.get(("| ret-dp", "untrained")) or lines[("| untrained", "ret-dp")]
    assert tied.endswith("| no |")
    assert "## Which differences are significant" in results_markdown(rows)


def test_same_seed_twice_is_not_a_seed_sweep():
    rows = _scored_rows()
    rows[2] = {**rows[2], "seed": 0}
    assert len(systems(rows)) == 4


def test_epsilon_ticks_merge_close_values():
    assert epsilon_positions([7.99, 8.0, math.inf]) == [(pytest.approx(7.995), "8"), (math.inf, "∞")]
    assert [label for _, label in epsilon_positions([1.0, 3.0, 8.0, 8.0])] == ["1", "3", "8"]
    assert [label for _, label in epsilon_positions([0.5, math.inf])] == ["0.5", "∞"]
    assert epsilon_positions([]) == []


@pytest.mark.parametrize("epsilons", [[8.0], [7.99, 8.0, math.inf], [1.0, 2.0, 4.0, 8.0, 16.0, math.inf]])
def test_plot_with_one_or_many_epsilons(tmp_path, epsilons):
    rows = _scored_rows()[:2]
    rows += [{**rows[1], "retriever": f"r{e}", "epsilon": e, "seed": None, "variant": None} for e in epsilons]
    privacy_utility_plot(rows, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_significance_metrics_hold_the_tables_comparisons_for_run_check():
    """The report's manifest carries what its table prints, keyed ``better > worse``, so a
    pipeline's ``expected:`` can require a significant difference (`synthq run --check`)."""
    from synthq.reporting.tables import pairwise_comparisons, significance_metrics
    from synthq.retrieval.significance import compare_all

    rows = _scored_rows()
    found = pairwise_comparisons(rows)
    metrics = significance_metrics(found)
    pairs = next(iter(metrics.values()))
    assert set(pairs) >= {"ret-syn (2 seeds) > untrained"}
    chosen = pairs["ret-syn (2 seeds) > untrained"]
    assert chosen["difference"] == pytest.approx(0.1) and chosen["p_holm"] <= 0.05
    assert chosen["ci"][0] < chosen["difference"] < chosen["ci"][1]
    # the same numbers an independent call of the tests gives, and the table prints them
    merged = {s["retriever"]: s["per_query"]["ndcg@10"] for s in systems(rows)}
    again = {f"{c.a} > {c.b}": c for c in compare_all(merged, seed=0)}
    assert again["ret-syn (2 seeds) > untrained"].p_holm == pytest.approx(chosen["p_holm"])
    assert significance_table(rows, found=found) == significance_table(rows)


def test_report_keeps_two_datasets_of_one_name_apart(tmp_path, tiny_beir):
    """a/tiny and b/tiny (different data, one name) are two tables, each with its own BM25 row;
    the same dataset evaluated twice stays one."""
    import shutil

    from synthq.stages import evaluate, report

    first, second = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    shutil.copytree(tiny_beir, first)
    shutil.copytree(tiny_beir, second)
    with open(second / "corpus.jsonl", "a", encoding="utf-8") as corpus:
        corpus.write(json.dumps({"_id": "only-in-b", "title": "", "text": "a document only b holds"}) + "\n")
    evals = [
        evaluate.run(EvalConfig(bm25=True, datasets=[str(data)], out=tmp_path / f"eval-{i}"))
        for i, data in enumerate([first, second, first])
    ]
    merged = report.run(ReportConfig(evals=[str(e.path) for e in evals], out=tmp_path / "r"))
    rows = json.loads((merged.path / "results.json").read_text())
    assert sorted((r["dataset"], r["retriever"]) for r in rows) == [("a/tiny", "BM25"), ("b/tiny", "BM25")]
    text = (merged.path / "README.md").read_text()
    assert "### a/tiny" in text and "### b/tiny" in text
